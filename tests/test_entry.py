"""How a script ends (harness/entry.py, docs/guarantees.md): every script's `if __name__ == '__main__':` goes through
run_script (read from the source with ast, as tests/test_layout.py reads imports); a signal is one line and exit
128 + its number, a full disk one line and exit 1, and no child a script started outlives it. The mechanism is
tested in this process and on real processes: a made-up script with a child, a grandchild and a child that ignores
the signals; sample.py in the middle of a generation; reproduce.py killed while its train.py trains; the measuring
scripts on a full filesystem (a filled tmpfs in a mount namespace of their own).
"""
import ast
import errno
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT, write_dataset
from harness import entry, fileio
from harness.entry import Stopped, descendants, run_script, start_child
from test_layout import SCRIPT_FOLDERS, SCRIPTS


# ----------------------------------------------------------------------------- every script is wired
def script_files(root=ROOT):
    return sorted(SCRIPTS) + [f'{d}/{f}' for d in SCRIPT_FOLDERS if os.path.isdir(os.path.join(root, d))
                              for f in sorted(os.listdir(os.path.join(root, d))) if f.endswith('.py')]


def wiring_problems(source):
    """What keeps a script's source from ending the one way: its `if __name__ == '__main__':` must be one call,
    run_script(main, ...), of harness.entry's run_script, with main a function of the file; a child process is
    started by entry.start_child (never subprocess.Popen, nor a session of its own that no signal reaches); a
    KeyboardInterrupt caught is raised again (run_script says how the script ended); an integer option is parsed by
    fileio.integer, one rule for every script (100000, 100_000 and 1e5 alike)."""
    tree, found = ast.parse(source), []
    imported = any(isinstance(n, ast.ImportFrom) and n.module == 'harness.entry' and
                   any(a.name == 'run_script' for a in n.names) for n in ast.walk(tree))
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    blocks = [n for n in tree.body if isinstance(n, ast.If) and isinstance(n.test, ast.Compare)
              and getattr(n.test.left, 'id', None) == '__name__']
    if len(blocks) != 1:
        found.append("no `if __name__ == '__main__':` block")
    else:
        body = blocks[0].body
        call = body[0].value if len(body) == 1 and isinstance(body[0], ast.Expr) else None
        if not (isinstance(call, ast.Call) and getattr(call.func, 'id', None) == 'run_script' and call.args
                and getattr(call.args[0], 'id', None) in functions):
            found.append("its `if __name__ == '__main__':` is not one call run_script(main, ...)")
        elif not imported:
            found.append("run_script is not harness.entry's")
    guarded = False   # early_exit_on_signal(__name__) comes before anything but the standard library is imported
    for n in tree.body:
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call) and \
                getattr(n.value.func, 'id', None) == 'early_exit_on_signal':
            guarded = True
            if [getattr(a, 'id', None) for a in n.value.args] != ['__name__']:
                found.append(f"line {n.lineno}: early_exit_on_signal's argument is not __name__ (an import of the "
                             f"script would change the importer's signal handlers)")
        names = [a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or ''] if isinstance(
            n, ast.ImportFrom) else []
        if not guarded and any(m.split('.')[0] not in sys.stdlib_module_names and m != 'harness.entry' for m in names):
            found.append(f"line {n.lineno}: imports {names[0]} before early_exit_on_signal() (a signal while it "
                         f"loads would be a traceback)")
            break
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and n.attr == 'Popen':
            found.append(f"line {n.lineno}: subprocess.Popen: start a child with entry.start_child")
        if isinstance(n, ast.keyword) and n.arg == 'start_new_session':
            found.append(f"line {n.lineno}: start_new_session: entry.start_child gives a child its session")
        if isinstance(n, ast.keyword) and n.arg == 'type' and getattr(n.value, 'id', None) == 'int':
            found.append(f"line {n.lineno}: type=int: an integer option takes fileio.integer (1e5 as 100000)")
        if isinstance(n, ast.ExceptHandler) and 'KeyboardInterrupt' in ast.dump(n.type or ast.Name('')) and not (
                n.body and isinstance(n.body[-1], ast.Raise) and n.body[-1].exc is None):
            found.append(f"line {n.lineno}: a KeyboardInterrupt caught and not raised again")
    return found


def test_the_wiring_check_finds_each_way_a_script_can_miss_the_entry_point():
    good = ("from harness.entry import run_script\n\ndef main():\n    pass\n\n"
            "if __name__ == '__main__':\n    run_script(main)\n")
    assert wiring_problems(good) == []
    guarded = ("import os\nfrom harness.entry import early_exit_on_signal\nearly_exit_on_signal(__name__)\n"
               "import torch\n" + good)
    assert wiring_problems(guarded) == []
    assert wiring_problems(guarded.replace('(__name__)', '()')) == [
        "line 3: early_exit_on_signal's argument is not __name__ (an import of the script would change the importer's "
        "signal handlers)"]
    assert wiring_problems(guarded.replace('early_exit_on_signal(__name__)\n', '')) == [
        "line 3: imports torch before early_exit_on_signal() (a signal while it loads would be a traceback)"]
    assert wiring_problems(good.replace('run_script(main)', 'main()')) == [
        "its `if __name__ == '__main__':` is not one call run_script(main, ...)"]
    assert wiring_problems(good.replace('run_script(main)', 'run_script(main)\n    print()')) == [
        "its `if __name__ == '__main__':` is not one call run_script(main, ...)"]
    assert wiring_problems(good.replace('from harness.entry import run_script', 'from other import run_script')) == [
        "run_script is not harness.entry's",
        "line 1: imports other before early_exit_on_signal() (a signal while it loads would be a traceback)"]
    assert wiring_problems("def main():\n    pass\n") == ["no `if __name__ == '__main__':` block"]
    popen = good.replace('    pass', '    subprocess.Popen(cmd, start_new_session=True)')
    assert wiring_problems(popen) == ['line 4: subprocess.Popen: start a child with entry.start_child',
                                      'line 4: start_new_session: entry.start_child gives a child its session']
    swallowed = good.replace('    pass', '    try:\n        f()\n    except KeyboardInterrupt:\n        print()')
    assert wiring_problems(swallowed) == ['line 6: a KeyboardInterrupt caught and not raised again']
    assert wiring_problems(swallowed.replace('        print()', '        print()\n        raise')) == []
    parsed = good.replace('    pass', "    p.add_argument('--n', type=int)")
    assert wiring_problems(parsed) == ['line 4: type=int: an integer option takes fileio.integer (1e5 as 100000)']
    assert wiring_problems(parsed.replace('type=int', 'type=integer')) == []


def test_every_script_ends_through_the_entry_point():
    files = script_files()
    assert {'train.py', 'reproduce.py', 'tools/gpu_queue.py', 'docs/front_figure.py', 'docs/probe_cost.py',
            'docs/speed_public_model.py'} <= set(files)
    problems = {}
    for f in files:
        with open(os.path.join(ROOT, f)) as fh:
            problems[f] = wiring_problems(fh.read())
    assert {f: p for f, p in problems.items() if p} == {}


# ----------------------------------------------------------------------------- the mechanism, in this process
def ends(main, *args, **kwargs):
    """run_script(main, ...) here: its exit code."""
    with pytest.raises(SystemExit) as e:
        run_script(main, *args, **kwargs)
    return e.value.code


def test_main_s_exit_code_is_the_script_s_and_the_handlers_come_back():
    before = {s: signal.getsignal(s) for s in entry.SIGNALS}
    assert ends(lambda: None) is None and ends(lambda x: x, 3) == 3
    assert ends(lambda: {'results': 1}) is None   # bench.py's main returns its results: exit 0, nothing printed
    assert {s: signal.getsignal(s) for s in entry.SIGNALS} == before


@pytest.mark.parametrize('raised, code, name', [(KeyboardInterrupt(), 130, 'SIGINT'),
                                                (Stopped(signal.SIGTERM), 143, 'SIGTERM')])
def test_a_signal_is_one_line_and_128_plus_its_number(capsys, raised, code, name):
    def main():
        raise raised
    assert ends(main) == code
    assert capsys.readouterr().err == f"test_entry.py: stopped by {name}\n"
    assert ends(main, note='the same command continues') == code
    assert capsys.readouterr().err == f"test_entry.py: stopped by {name}; the same command continues\n"


def test_a_full_disk_is_one_line_naming_the_file_not_its_temporary_name(capsys, tmp_path):
    target = str(tmp_path / 'a.json')
    with pytest.raises(OSError) as e:   # a write's error names no file: atomic_write names the file it writes
        with fileio.atomic_write(target) as f:
            f.write('{')
            raise OSError(errno.ENOSPC, 'No space left on device')
    assert e.value.filename == target and os.listdir(tmp_path) == []

    def full(error):
        def main():
            raise error
        return main
    assert ends(full(e.value)) == 1
    assert capsys.readouterr().err == f"test_entry.py: error: {fileio.disk_full_text(target)}\n"
    assert ends(full(OSError(errno.EDQUOT, 'Disk quota exceeded', target + '.0123abcd.tmp'))) == 1
    assert capsys.readouterr().err == f"test_entry.py: error: {fileio.disk_full_text(target)}\n"
    assert ends(full(RuntimeError('[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing '
                                  'file data/0: file write failed'))) == 1   # torch.save's: no file named
    assert capsys.readouterr().err == ("test_entry.py: error: a disk this command writes to is full; free some space, "
                                       "then run the same command again\n")
    with pytest.raises(PermissionError):   # any other error is main's own
        run_script(full(PermissionError(errno.EACCES, 'Permission denied', target)))


def test_once_a_signal_has_arrived_no_child_starts(capsys):
    refused = []

    def main():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)   # the handler raises here
        except Stopped:
            try:
                start_child([sys.executable, '-c', 'pass'])
            except Stopped:
                refused.append(True)
            raise
    assert ends(main) == 143 and refused == [True]
    assert capsys.readouterr().err == "test_entry.py: stopped by SIGTERM\n"
    start_child([sys.executable, '-c', 'pass']).wait()   # the script's end is not the next one's


# ----------------------------------------------------------------------------- real processes
def waiting_for(what, timeout=30):
    """what() once it is true (polled), else the last value."""
    deadline = time.time() + timeout
    while not (value := what()) and time.time() < deadline:
        time.sleep(0.1)
    return value


def running(pid):
    """Whether pid is a live process (a zombie is not: it has ended, its parent has not collected it yet)."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError:
        return False


def launch(cmd, **kwargs):
    """cmd as a user starts it, with Ctrl-C's default (a test run as a shell's background job inherits it ignored)."""
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **kwargs)


def read_until(stream, pattern, timeout=120, count=1):
    """Lines of stream up to the count-th match of pattern (multiline) in them (on a thread: a pipe read has no
    timeout). Matches are counted in the text, not one a line: processes that share the pipe under
    PYTHONUNBUFFERED=1 write `print`'s text and its newline in two writes, so two lines can interleave to
    'readyready\n\n'."""
    lines, seen = [], threading.Event()

    def read():
        for line in stream:
            lines.append(line)
            if len(re.findall(pattern, ''.join(lines), re.M)) >= count:
                seen.set()
                return
    threading.Thread(target=read, daemon=True).start()
    assert seen.wait(timeout), ''.join(lines)
    return lines


def test_read_until_counts_two_lines_that_interleaved_in_the_pipe():
    """The signal tests' wait for 'working' and two 'ready's: two children's `print`s interleaved (text, text, then
    the two newlines) were one matching line, and the wait would run out its 120 s (docs/tests.md: a CI failure's
    possible cause)."""
    import io
    assert read_until(io.StringIO('working\nreadyready\n\n'), 'working|ready', timeout=5, count=3)
    with pytest.raises(AssertionError):
        read_until(io.StringIO('working\nready\n'), 'working|ready', timeout=0.5, count=3)


PARENT = """import signal, sys, time
sys.path.insert(0, {root!r})
from harness import entry
from harness.entry import run_script, start_child

CHILD = '''import sys, time
sys.path.insert(0, {root!r})
from harness.entry import run_script, start_child
def main():
    start_child(['sleep', '300'])
    print('ready', flush=True)
    time.sleep(300)
run_script(main)
'''
STUBBORN = ('import signal, time; [signal.signal(s, signal.SIG_IGN) for s in (2, 15)]; print("ready", flush=True); '
            'time.sleep(300)')


def main():
    child, stubborn = start_child([sys.executable, '-c', CHILD]), start_child([sys.executable, '-c', STUBBORN])
    print('working', flush=True)
    time.sleep(300)


entry.GRACE_S = 2
if __name__ == '__main__':
    run_script(main)
"""


def start_parent(tmp_path):
    """PARENT running, once its children have set up their signals and said so: (its process, the three below it:
    the child, its child, the stubborn one)."""
    script = tmp_path / 'parent.py'
    script.write_text(PARENT.format(root=ROOT))
    proc = launch([sys.executable, str(script)], env=dict(os.environ, PYTHONUNBUFFERED='1'))
    read_until(proc.stdout, 'working|ready', count=3)
    below = waiting_for(lambda: len(descendants(proc.pid)) == 3 and descendants(proc.pid))
    assert below and all(running(p) for p in below)
    return proc, below


@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_mid_work_is_one_line_and_no_child_outlives_the_script(tmp_path, sig):
    """`kill <pid of reproduce.py>` left its train.py running, orphaned (and gpu_queue.py two children). A signal to
    the script alone now reaches every child it started, their children with them; one that ignores the signal is
    killed after GRACE_S; the script says how it ended in one line and exits 128 + the signal's number."""
    proc, below = start_parent(tmp_path)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    child_line = f"-c: stopped by {sig.name}\n"   # the child's own line (it writes to the same stderr)
    assert proc.returncode == 128 + sig and err.replace(child_line, '') == f"parent.py: stopped by {sig.name}\n", err
    time.sleep(0.2)
    assert [p for p in below if running(p)] == []


def test_a_child_killed_before_it_passed_the_signal_on_leaves_none_of_its_children(tmp_path):
    """A child that gets no CPU through the grace (stopped here; a loaded machine's slow child in the CI flake of
    docs/tests.md) is SIGKILLed before its handler reached its own child, which runs in a session of its own: the
    `sleep 300` below it outlived everything and held the test's pipes open. Everything below the child dies with it."""
    proc, below = start_parent(tmp_path)
    (child,) = [p for p in below if descendants(p)]   # the one with a child of its own: CHILD, above `sleep 300`
    os.kill(child, signal.SIGSTOP)
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + signal.SIGTERM and err == "parent.py: stopped by SIGTERM\n", err
        time.sleep(0.2)
        assert [p for p in below if running(p)] == []
    except BaseException:   # a failure leaves no `sleep 300` behind
        for pid in below:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        raise


@pytest.fixture(scope='module')
def text_run(tmp_path_factory):
    """A small train.py run on text in the bytes tokenizer (sample.py decodes it), probed at each evaluation."""
    import train
    from harness import dataset, tokenizer
    from test_train import config
    root = tmp_path_factory.mktemp('entry')
    words = 'the cache holds keys and values of every token seen so far while a sink soaks up attention'.split()
    texts = [' '.join(words[(i + j) % len(words)] for j in range(40 + i % 30)) for i in range(120)]
    data = dataset.prepare(root / 'data', tokenizer.load_tokenizer('bytes'), {'test': 'test_entry.py'}, 'test',
                           'text of test_entry.py', True, lambda split: texts,
                           {'train': (None, None), 'val': (None, None)})
    train.train(config(str(data), str(root / 'out'), '--block_size=64', '--max_iters=4', '--eval_interval=2',
                       '--probe_docs=2'))
    return root


@pytest.mark.slow
@pytest.mark.parametrize('sig', [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_sample_stopped_during_a_generation_is_one_line(text_run, sig):
    """sample.py during a long generation: a KeyboardInterrupt traceback on Ctrl-C, no word on SIGTERM."""
    proc = launch([sys.executable, 'sample.py', '--ckpt', str(text_run / 'out'), '--num_samples', '500',
                   '--max_new_tokens', '60'], env=dict(os.environ, OMP_NUM_THREADS='1'))
    read_until(proc.stdout, '^-----')
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig and err == f"sample.py: stopped by {sig.name}\n", err


@pytest.mark.slow
def test_reproduce_killed_while_a_row_trains_stops_the_row_and_the_same_command_continues(tmp_path):
    """The docs promise that a scheduler's SIGTERM ends a table as stopped, exit 143, and that the same command
    continues it; `kill <pid of reproduce.py>` killed reproduce.py alone (-15, no line) and its train.py trained on."""
    data = write_dataset(str(tmp_path / 'data'), n_train=20_000, n_val=2_000)
    cmd = [sys.executable, 'reproduce.py', 'table5', '--scale', 'smoke', '--rows', '11_orthoadam', '--dataset', data,
           '--iters', '600', '--out', str(tmp_path / 'out')]
    env = dict(os.environ, OMP_NUM_THREADS='1')
    proc = launch(cmd, env=env)
    read_until(proc.stdout, '^iter ')   # one row, one job at a time: train.py's lines come through reproduce.py
    below = descendants(proc.pid)
    assert below and all(running(p) for p in below)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    (run,) = os.listdir(tmp_path / 'out' / 'smoke' / 'runs')
    assert proc.returncode == 143 and err.strip().splitlines()[-2:] == [
        f"[stopped] {run}: train stopped by SIGTERM (exit 143); the same command continues it",
        "reproduce.py: stopped by SIGTERM; the same command continues"], err
    time.sleep(0.2)
    assert [p for p in below if running(p)] == []
    with open(tmp_path / 'out' / 'smoke' / 'runs' / run / 'log.jsonl') as f:
        last = f.read().splitlines()[-1]
    assert '"event": "stopped"' in last and '"signal": "SIGTERM"' in last
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0 and '[done 1/1]' in again.stderr, again.stderr[-2000:]
    assert os.path.isfile(tmp_path / 'out' / 'smoke' / 'runs' / run / 'analysis.json')


def full_disk_run(cmd, folder, timeout=300):
    """subprocess.run(cmd) while `folder` is a full filesystem: a 64 KiB tmpfs, filled, mounted over it in a mount
    namespace of the command's own (as conftest.read_only_run). Skips the test on a machine that cannot."""
    import shutil
    if not shutil.which('unshare') or subprocess.run(['unshare', '-rm', 'true'], capture_output=True).returncode:
        pytest.skip('needs unshare -rm (a mount namespace) for a full filesystem')
    os.makedirs(folder, exist_ok=True)
    script = 'mount -t tmpfs -o size=64k tmpfs "$0" && (cat /dev/zero > "$0/.fill") 2>/dev/null; exec "$@"'
    return subprocess.run(['unshare', '-rm', 'sh', '-c', script, str(folder), *cmd], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ, OMP_NUM_THREADS='1'))


@pytest.mark.slow
@pytest.mark.parametrize('argv, written', [
    (['analyze.py', '--ckpt', 'out', '--max_docs', '2', '--json', 'FULL/a.json'], 'a.json'),
    (['analyze.py', '--ckpt', 'out', '--max_docs', '2', '--plots', 'FULL/p'], 'p/attention_map.png'),
    (['analyze.py', '--trajectories', 'out', '--plots', 'FULL/t'], 't/trajectories.png'),
    (['intervene.py', '--ckpt', 'out', '--max_docs', '2', '--interventions', 'zero', '--json', 'FULL/i.json'],
     'i.json'),
    (['stream_eval.py', '--ckpt', 'out', '--tokens', '128', '--windows', '32', '--sinks', '1', '--json', 'FULL/s.json'],
     's.json'),
])
def test_a_full_disk_is_one_line_in_the_measuring_scripts(text_run, argv, written):
    """analyze.py --json / --plots / --trajectories --plots, intervene.py --json and stream_eval.py --json on a full
    filesystem: an OSError [Errno 28] traceback. Now one line naming the file, exit 1."""
    full = text_run / 'full'
    r = full_disk_run([sys.executable, *[str(text_run / a) if a == 'out' else a.replace('FULL', str(full))
                                         for a in argv]], full)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and 'Traceback' not in r.stderr and lines[-1] == (
        f"{argv[0]}: error: {fileio.disk_full_text(str(full / written))}"), r.stderr


# ----------------------------------------------------------------------------- the first seconds and the last
@pytest.mark.parametrize('script, args, after, sig', [
    ('train.py', ['config/tiny_cpu.py', '--max_iters=3000'], 0.5, signal.SIGINT),
    ('train.py', ['config/tiny_cpu.py', '--max_iters=3000'], 1.0, signal.SIGINT),
    ('analyze.py', ['--ckpt', 'out/none', '--max_docs', '0'], 1.0, signal.SIGINT),
    ('export_hf.py', ['--ckpt', 'out/none', '--out', 'out/none_hf'], 1.0, signal.SIGTERM),
    ('eval_quant.py', ['--ckpt', 'out/none'], 0.3, signal.SIGTERM)])
def test_a_signal_while_a_script_still_imports_torch_is_one_line(script, args, after, sig):
    """Ctrl-C one second into train.py (torch still loading) printed KeyboardInterrupt's traceback; SIGTERM then ended
    export_hf.py by the signal's default (-15, no line). early_exit_on_signal() is the script's first statement: the
    same one line and 128 + N as once run_script runs (whichever of the two the signal meets)."""
    proc = launch([sys.executable, script, *args])
    time.sleep(after)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig and err == f"{script}: stopped by {signal.Signals(sig).name}\n", err


def test_a_signal_after_the_error_line_is_passed_on_but_never_raised(capsys):
    """An FSDP rank whose peer died printed its one line (report_error), then torchrun's SIGTERM arrived during the
    teardown and the handler raised Stopped inside a finalizer ("Exception ignored in ..."). Once a script has begun
    to end (entry.ending(), which report_error calls), a signal does not raise; the script exits with its own code."""
    seen = []

    def main():
        print('error: rank 0 lost contact', file=sys.stderr)
        entry.ending()
        os.kill(os.getpid(), signal.SIGTERM)   # delivered here, in the main thread, before the next bytecode
        seen.append('teardown ran to its end')
        return 2
    assert ends(main) == 2 and seen == ['teardown ran to its end']
    assert capsys.readouterr().err == 'error: rank 0 lost contact\n'


def test_after_the_script_has_ended_a_late_signal_is_ignored(capsys):
    """early_exit_on_signal's handler, which run_script puts back at its end: a signal after that (torchrun's, while
    the interpreter exits) neither prints nor ends the process a second time."""
    before = {s: signal.getsignal(s) for s in entry.SIGNALS}
    try:
        entry.early_exit_on_signal('__main__')
        assert ends(lambda: 0) == 0
        assert signal.getsignal(signal.SIGTERM) is entry._early_signal
        os.kill(os.getpid(), signal.SIGTERM)
        assert capsys.readouterr().err == ''
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def test_importing_a_script_changes_no_handler_and_a_forked_worker_still_ends_on_sigterm():
    """CI hung for 90 minutes: a test imported train.py, whose first statement installed the early handler in the
    test process; once a run_script there had ended, that handler ignored SIGTERM, and so did the workers a later
    test's multiprocessing pool forked, so pool.terminate() (a SIGTERM to each) waited forever. An import changes no
    handler now, and a forked process that kept the early handler (the script's own pool) ends on SIGTERM."""
    import multiprocessing
    before = {s: signal.getsignal(s) for s in entry.SIGNALS}
    entry.early_exit_on_signal('train')   # what `import train` runs
    assert {s: signal.getsignal(s) for s in entry.SIGNALS} == before
    try:
        entry.early_exit_on_signal('__main__')
        assert ends(lambda: 0) == 0 and signal.getsignal(signal.SIGTERM) is entry._early_signal   # the script ended
        pool = multiprocessing.get_context('fork').Pool(1)
        assert pool.apply(os.getpid) != os.getpid()   # the worker runs, with the early handler inherited
        pool.apply_async(time.sleep, (120,))   # busy: only the SIGTERM of terminate() ends it
        time.sleep(0.5)
        done = threading.Thread(target=pool.terminate, daemon=True)
        done.start()
        done.join(timeout=30)
        assert not done.is_alive(), "pool.terminate() hung: its worker ignored SIGTERM"
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
