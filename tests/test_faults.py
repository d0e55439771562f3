"""Fault injection on train.py (CPU, a few seconds each): SIGKILL at random moments, corrupt checkpoints, bad
token ids, a diverging run, two runs on one out_dir, and the paths and files a new user gets wrong (an out_dir
that is a file or read-only, edited data, only best.pt, a torn log line). docs/guarantees.md names these tests."""
import glob
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import train
from conftest import ROOT, write_dataset
from test_train import config
from harness import runs
from harness.runs import log_events

pytestmark = pytest.mark.slow   # train.py killed, corrupted and refused, as subprocesses

TINY = os.path.join(ROOT, 'config', 'tiny_cpu.py')
SMALL = ['--n_layer=2', '--n_embd=32', '--n_head=2', '--block_size=32', '--batch_size=4', '--eval_tokens=256',
         '--log_interval=1', '--warmup_iters=2']


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    """Tiny models run fastest on one thread, and a loaded machine does not slow them down much there."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setenv('OMP_NUM_THREADS', '1')   # for the subprocesses
    yield
    torch.set_num_threads(threads)


def cli(capsys, *args):
    """train.py's command line in this process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    code = train.main([TINY, *args])
    out, err = capsys.readouterr()
    return code, out, err


def snapshot(folder):
    return {os.path.basename(p): open(p, 'rb').read() for p in sorted(glob.glob(os.path.join(folder, '*')) +
                                                                       glob.glob(os.path.join(folder, '.*')))}


def train_events(out):
    """The 'train' lines of out's log.jsonl so far; runs.log_events skips the line being written (or cut by a kill)."""
    path = os.path.join(out, 'log.jsonl')
    return [e for e in log_events(path) if e['event'] == 'train'] if os.path.exists(path) else []


def test_sigkill_at_random_moments_then_resume_equals_an_uninterrupted_run(bigram_data, tmp_path):
    """A run that evaluates and checkpoints every step is SIGKILLed at random moments (during a step, an
    evaluation, a save or its rename) and restarted with the same command. After every kill ckpt.pt (and
    best.pt) load and the iteration never goes back; the lock of the killed process does not block the
    restart; the finished run's weights equal an uninterrupted run's bit for bit; no .tmp file is left."""
    args = [f'--dataset={bigram_data}', *SMALL, '--dropout=0.1', '--max_iters=30', '--lr_decay_iters=30',
            '--eval_interval=1', '--init_from=auto']
    ref = str(tmp_path / 'ref')
    train.train(config(bigram_data, ref, *args[1:]))
    out = str(tmp_path / 'killed')
    cmd = [sys.executable, 'train.py', TINY, *args, f'--out_dir={out}']
    rng, last_iter, kills = random.Random(0), -1, 0
    while True:
        steps_before = len(train_events(out))
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if kills == 3:
            assert proc.wait(timeout=120) == 0, proc.stderr.read()
            break
        deadline = time.time() + 60
        while proc.poll() is None and len(train_events(out)) <= steps_before and time.time() < deadline:
            time.sleep(0.01)   # until this process has trained a step
        time.sleep(rng.uniform(0.0, 0.1))
        if proc.poll() is not None:   # finished before the kill: nothing left to interrupt
            assert proc.returncode == 0, proc.stderr.read()
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
        kills += 1
        if not os.path.exists(os.path.join(out, 'ckpt.pt')):   # killed before its first checkpoint
            assert last_iter == -1
            continue
        ckpt = torch.load(os.path.join(out, 'ckpt.pt'), map_location='cpu', weights_only=False)   # always loadable
        assert ckpt['iter_num'] >= last_iter
        last_iter = ckpt['iter_num']
        if os.path.exists(os.path.join(out, 'best.pt')):
            torch.load(os.path.join(out, 'best.pt'), map_location='cpu', weights_only=False)
    assert kills >= 2
    a = torch.load(os.path.join(ref, 'ckpt.pt'), weights_only=False)
    b = torch.load(os.path.join(out, 'ckpt.pt'), weights_only=False)
    assert a['iter_num'] == b['iter_num'] == 30
    for k in a['model']:
        assert torch.equal(a['model'][k], b['model'][k]), k
    assert not glob.glob(os.path.join(out, '*.tmp'))


def test_bytes_that_are_no_torch_save_file_never_reach_the_unpickler(tmp_path, monkeypatch):
    """Random bytes unpickled can make CPython print a line of its own to stderr (a SystemError about a bytearray's
    exported buffers) beside the one-line error: a checkpoint that is not a zip archive, as torch.save writes, is
    refused before torch.load; a truncated one too (its central directory is gone)."""
    from harness import runs
    from harness.train_config import TrainingError
    path = tmp_path / 'ckpt.pt'
    torch.save({'model': {}, 'model_args': {}, 'iter_num': 0}, path)
    good = path.read_bytes()

    class Unpickled(BaseException):   # not an Exception: load_checkpoint's handler does not turn it into its line
        pass

    def unpickled(*args, **kwargs):
        raise Unpickled('torch.load was called')
    monkeypatch.setattr(torch, 'load', unpickled)
    for content in (bytes(random.Random(0).getrandbits(8) for _ in range(len(good))), good[:len(good) // 2], b''):
        path.write_bytes(content)
        with pytest.raises(TrainingError, match='corrupt or not a checkpoint'):
            runs.load_checkpoint(str(path))
    monkeypatch.undo()
    path.write_bytes(good)
    assert runs.load_checkpoint(str(path))['iter_num'] == 0


def test_truncated_or_random_checkpoint_is_one_line_and_changes_nothing(bigram_data, tmp_path, capsys):
    out = str(tmp_path / 'run')
    args = [f'--dataset={bigram_data}', f'--out_dir={out}', *SMALL, '--max_iters=2', '--eval_interval=1']
    assert cli(capsys, *args)[0] == 0
    good = open(os.path.join(out, 'ckpt.pt'), 'rb').read()
    for name, content in (('truncated', good[:len(good) // 2]), ('random bytes', os.urandom(len(good)))):
        with open(os.path.join(out, 'ckpt.pt'), 'wb') as f:
            f.write(content)
        before = snapshot(out)
        for init_from in ('resume', 'auto'):
            code, _, err = cli(capsys, *args, f'--init_from={init_from}', '--max_iters=4')
            assert code == 2 and err.count('\n') == 1, (name, err)
            assert 'cannot read checkpoint' in err and 'corrupt' in err and 'best.pt' in err, (name, err)
            assert snapshot(out) == before, name                 # config.json, log.jsonl, best.pt: untouched


def test_token_id_beyond_the_vocabulary_stops_before_the_first_step(tmp_path, capsys):
    data = write_dataset(str(tmp_path / 'bad'), vocab_size=64, n_train=20_000, n_val=4_000)
    ids = np.fromfile(os.path.join(data, 'train.bin'), dtype=np.uint16)
    ids[17_171] = 69                       # one token a batch would rarely hit
    ids.tofile(os.path.join(data, 'train.bin'))
    out = str(tmp_path / 'run')
    code, stdout, err = cli(capsys, f'--dataset={data}', f'--out_dir={out}', *SMALL, '--max_iters=5')
    assert code == 2 and err.count('\n') == 1, err
    assert os.path.join(data, 'train.bin') in err and 'token id 69 >= vocab_size 64' in err and '17,171' in err
    assert 'prepare it again' in err
    assert not os.path.exists(out) and 'iter ' not in stdout          # no step, nothing written


def test_diverging_run_stops_and_keeps_both_checkpoints(bigram_data, tmp_path, capsys):
    out = str(tmp_path / 'run')
    args = [f'--dataset={bigram_data}', f'--out_dir={out}', *SMALL, '--eval_interval=4']
    assert cli(capsys, *args, '--max_iters=8')[0] == 0
    kept = {f: open(os.path.join(out, f), 'rb').read() for f in ('ckpt.pt', 'best.pt')}
    best = torch.load(os.path.join(out, 'best.pt'), weights_only=False)['best_val_loss']
    code, stdout, err = cli(capsys, *args, '--init_from=resume', '--max_iters=40', '--learning_rate=1.0',
                            '--decay_lr=False', '--grad_clip=0.0')
    assert code == 2 and err.count('\n') == 1, err
    assert 'diverged at iteration 12' in err and 'ln(divergence_factor=10)' in err and 'iteration 8' in err
    assert 'changed on resume: learning_rate 0.003 -> 1.0' in stdout
    assert all(len(line) < 80 for line in stdout.splitlines() if line.startswith('eval'))   # no 300-digit perplexity
    assert {f: open(os.path.join(out, f), 'rb').read() for f in kept} == kept
    events = [json.loads(line) for line in open(os.path.join(out, 'log.jsonl'))]
    diverged = [e for e in events if e['event'] == 'diverged']
    assert len(diverged) == 1 and diverged[0]['val_loss'] > best + np.log(10) and diverged[0]['best_val_loss'] == best


def test_two_runs_on_one_out_dir(bigram_data, tmp_path, capsys):
    out = str(tmp_path / 'run')
    args = [f'--dataset={bigram_data}', f'--out_dir={out}', *SMALL, '--max_iters=100000', '--eval_interval=50',
            '--init_from=auto']
    first = subprocess.Popen([sys.executable, 'train.py', TINY, *args], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while len(train_events(out)) < 60 and time.time() < deadline:   # past its first checkpoint
        time.sleep(0.05)
    config_before = open(os.path.join(out, 'config.json'), 'rb').read()
    code, _, err = cli(capsys, *args)
    assert code == 2 and err.count('\n') == 1 and f'pid {first.pid} on ' in err and 'in use by another run' in err
    assert open(os.path.join(out, 'config.json'), 'rb').read() == config_before
    first.send_signal(signal.SIGTERM)
    stdout, stderr = first.communicate(timeout=60)
    assert first.returncode == 128 + signal.SIGTERM and 'checkpoint written' in stdout, stderr
    it = torch.load(os.path.join(out, 'ckpt.pt'), weights_only=False)['iter_num']
    code, stdout, err = cli(capsys, *args, f'--max_iters={it + 1}')        # the lock went with the process
    assert code == 0, err


def test_a_temporary_name_that_is_a_link_is_never_written_through(bigram_data, tmp_path, capsys):
    """Data lost, case 2: ckpt.pt.tmp and config.json.tmp, links to a user's files in out_dir: a resume that saves wrote
    its config and checkpoint through them (and renamed the link onto ckpt.pt). Now both go to new names: the user's
    files and the links stay as they were, and ckpt.pt is a checkpoint file of its own."""
    out = str(tmp_path / 'run')
    args = [f'--dataset={bigram_data}', f'--out_dir={out}', *SMALL, '--eval_interval=2']
    assert cli(capsys, *args, '--max_iters=2')[0] == 0
    for name, link in (('notes.txt', 'ckpt.pt.tmp'), ('thesis.tex', 'config.json.tmp')):
        (tmp_path / name).write_text(f'{name}: mine')
        os.symlink(tmp_path / name, os.path.join(out, link))
    code, _, err = cli(capsys, *args, '--max_iters=4', '--init_from=resume')
    assert code == 0, err
    assert [(tmp_path / n).read_text() for n in ('notes.txt', 'thesis.tex')] == ['notes.txt: mine', 'thesis.tex: mine']
    assert os.path.islink(os.path.join(out, 'ckpt.pt.tmp')) and os.path.islink(os.path.join(out, 'config.json.tmp'))
    assert not os.path.islink(os.path.join(out, 'ckpt.pt'))
    assert torch.load(os.path.join(out, 'ckpt.pt'), weights_only=False)['iter_num'] == 4
    assert json.load(open(os.path.join(out, 'config.json')))['max_iters'] == 4


@pytest.mark.parametrize('given, said', [
    (['--out_dir='], "config key 'out_dir' in the command line is empty (an unset shell variable?)"),   # silent-wrong 5
    (['--dataset='], "config key 'dataset' in the command line is empty"),
    ([f'--out_dir=out/{"a" * 300}'], 'is 300 bytes, longer than this filesystem allows (255); choose a shorter '
                                     '--out_dir'),                                                      # traceback 8
    (['--probe_interval=1', '--probe_docs=0'], 'probe_interval=1 asks for a probe every 1 iterations, but '
                                               'probe_docs=0 turns the probe off'),                   # silent-wrong 6
])
def test_an_empty_path_a_name_too_long_and_a_probe_that_is_off_are_one_line(bigram_data, tmp_path, monkeypatch, capsys,
                                                                            given, said):
    """--out_dir="$UNSET" trained into the working directory, a 300-character out_dir was an OSError traceback, and
    probe_interval with probe_docs=0 made no probe without a word. Now each is one error line, exit 2, nothing made."""
    monkeypatch.chdir(tmp_path)
    code, out, err = cli(capsys, f'--dataset={bigram_data}', '--out_dir=out/run', *SMALL, '--max_iters=2', *given)
    assert code == 2 and err.count('\n') == 1 and err.startswith('error: ') and said in err and out == '', err
    assert os.listdir(tmp_path) == []


def test_without_fcntl_the_scripts_import_and_a_run_goes_unlocked_with_a_warning(bigram_data, tmp_path, capsys,
                                                                                   monkeypatch):
    """Windows has no fcntl: train.py, analyze.py and eval_quant.py (through harness/runs.py, which holds the lock) must still
    import, and a run must work without the lock, saying so once. Nor can Windows open a folder (fsync_dir after each checkpoint's rename):
    the run still writes its checkpoints."""
    code = ("import sys; sys.modules['fcntl'] = None; import train, analyze, eval_quant; from harness import runs; "
            "assert runs.fcntl is None; print('imported')")
    done = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == 'imported', done.stderr
    monkeypatch.setattr(runs, 'fcntl', None)
    os_open = os.open

    def windows_open(path, *args, **kwargs):
        if os.path.isdir(path):
            raise PermissionError(13, 'Permission denied', path)
        return os_open(path, *args, **kwargs)
    monkeypatch.setattr(os, 'open', windows_open)
    out = str(tmp_path / 'run')
    code, _, err = cli(capsys, f'--dataset={bigram_data}', f'--out_dir={out}', *SMALL, '--max_iters=2',
                       '--eval_interval=2')
    assert code == 0, err
    assert torch.load(os.path.join(out, 'ckpt.pt'), weights_only=False)['iter_num'] == 2
    assert err.count('warning: no fcntl') == 1 and 'is not locked' in err
    assert open(os.path.join(out, '.lock')).read() == f"pid {os.getpid()} on {__import__('socket').gethostname()}\n"


# ----------------------------------------------------------------------------- what a new user runs into (issue 21)
def test_out_dir_that_is_a_file_is_one_line(bigram_data, tmp_path, capsys):
    notes = tmp_path / 'notes.txt'
    notes.write_text('keep me')
    for out in (notes, notes / 'run'):
        code, _, err = cli(capsys, f'--dataset={bigram_data}', f'--out_dir={out}', *SMALL, '--max_iters=2')
        assert code == 2 and err.count('\n') == 1 and f'{notes} is a file, not a folder' in err, err
    assert notes.read_text() == 'keep me'


@pytest.mark.skipif(os.geteuid() == 0, reason='root writes through file modes; '
                    'test_out_dir_that_cannot_be_written_is_one_line checks the error as root')
def test_out_dir_without_write_permission_is_one_line(bigram_data, tmp_path, capsys):
    out = str(tmp_path / 'run')
    args = [f'--dataset={bigram_data}', f'--out_dir={out}', *SMALL, '--max_iters=2', '--eval_interval=1']
    assert cli(capsys, *args)[0] == 0
    before = snapshot(out)
    os.chmod(out, 0o555)
    os.chmod(tmp_path, 0o555)
    try:
        for extra in (['--init_from=resume', '--max_iters=4'], [f'--out_dir={tmp_path / "fresh"}']):
            code, _, err = cli(capsys, *args, *extra)
            assert code == 2 and err.count('\n') == 1 and '--out_dir' in err and 'cannot write to' in err, err
    finally:
        os.chmod(tmp_path, 0o755)
        os.chmod(out, 0o755)
    assert snapshot(out) == before and not os.path.exists(tmp_path / 'fresh')


def test_out_dir_that_cannot_be_written_is_one_line(bigram_data, tmp_path, capsys, monkeypatch):
    """The same error for root, whom file modes do not stop: a folder the kernel refuses to make (under /sys),
    and a resume whose out_dir refuses every file (os.open denied there)."""
    args = [f'--dataset={bigram_data}', *SMALL, '--max_iters=2', '--eval_interval=1']
    if os.path.isdir('/sys/kernel'):
        code, _, err = cli(capsys, *args, '--out_dir=/sys/kernel/no_such_run')
        assert code == 2 and err.count('\n') == 1 and 'cannot write to out_dir' in err, err
    out = str(tmp_path / 'run')
    assert cli(capsys, *args, f'--out_dir={out}')[0] == 0
    before = snapshot(out)
    real_open = os.open

    def denied(path, *a, **kw):
        if os.path.abspath(path).startswith(out):
            raise PermissionError(13, 'Permission denied', path)
        return real_open(path, *a, **kw)
    monkeypatch.setattr(os, 'open', denied)
    code, _, err = cli(capsys, *args, f'--out_dir={out}', '--init_from=resume', '--max_iters=4')
    monkeypatch.undo()
    assert code == 2 and err.count('\n') == 1 and 'cannot write to out_dir' in err and '.lock' in err, err
    assert snapshot(out) == before


def hashed(data, **recorded):
    """A dataset whose meta.json records each split's sha256, as prepare_c4.py writes it (and `recorded` keys)."""
    meta = json.load(open(os.path.join(data, 'meta.json')))
    for split in ('train', 'val'):
        content = open(os.path.join(data, f'{split}.bin'), 'rb').read()
        meta['splits'][split].update(sha256=hashlib.sha256(content).hexdigest(), **recorded)
    with open(os.path.join(data, 'meta.json'), 'w') as f:
        json.dump(meta, f)
    return data


def test_a_same_size_edit_of_the_data_is_refused_fresh_and_on_resume(tmp_path, capsys):
    data = hashed(write_dataset(str(tmp_path / 'data'), n_train=20_000, n_val=4_000))
    out = str(tmp_path / 'run')
    args = [f'--dataset={data}', *SMALL, '--max_iters=2', '--eval_interval=1']
    assert cli(capsys, *args, f'--out_dir={out}')[0] == 0
    val = os.path.join(data, 'val.bin')
    ckpt = torch.load(os.path.join(out, 'ckpt.pt'), weights_only=False)
    assert ckpt['data']['identity']['val_sha256'] == hashlib.sha256(open(val, 'rb').read()).hexdigest()
    ids = np.fromfile(val, dtype=np.uint16)
    ids[:2000] = ids[2000:4000]                               # 2,000 tokens overwritten: same size, valid ids
    ids.tofile(val)
    before = snapshot(out)
    for extra in ([f'--out_dir={out}', '--init_from=resume', '--max_iters=4'], [f'--out_dir={tmp_path / "fresh"}']):
        code, stdout, err = cli(capsys, *args, *extra)
        assert code == 2 and err.count('\n') == 1, err
        assert f'{val} no longer matches meta.json' in err and 'prepare it again' in err and 'iter ' not in stdout
    assert snapshot(out) == before and not os.path.exists(tmp_path / 'fresh')
    stamp = json.load(open(os.path.join(data, '.verified.json')))['val.bin']   # what the file is, not meta.json's claim
    assert stamp['sha256'] == hashlib.sha256(open(val, 'rb').read()).hexdigest()


@pytest.mark.parametrize('bad_id, message', [(69, 'token id 69 >= vocab_size 64 (first such id at token 17,171)'),
                                             (62, 'meta.json records 61 (first larger id at token 17,171)')])
def test_a_bad_id_under_a_stale_meta_json_is_named_with_its_position(tmp_path, capsys, bad_id, message):
    data = write_dataset(str(tmp_path / 'data'), vocab_size=64, n_train=20_000, n_val=4_000)
    path = os.path.join(data, 'train.bin')
    ids = np.fromfile(path, dtype=np.uint16)
    ids[ids > 61] = 61                                         # the data as prepared: ids up to 61
    ids.tofile(path)
    hashed(data, max_token_id=61)
    ids[17_171] = bad_id                                       # changed after meta.json was written
    ids.tofile(path)
    code, _, err = cli(capsys, f'--dataset={data}', f'--out_dir={tmp_path / "run"}', *SMALL, '--max_iters=2')
    assert code == 2 and err.count('\n') == 1 and path in err and message in err, err


def test_best_pt_is_a_file_of_its_own(bigram_data, tmp_path, capsys):
    out = str(tmp_path / 'run')
    assert cli(capsys, f'--dataset={bigram_data}', f'--out_dir={out}', *SMALL, '--max_iters=2',
               '--eval_interval=1')[0] == 0
    ckpt, best = os.path.join(out, 'ckpt.pt'), os.path.join(out, 'best.pt')
    assert os.stat(best).st_nlink == 1 and not os.path.samefile(ckpt, best)
    kept = open(best, 'rb').read()
    with open(ckpt, 'r+b') as f:                              # an in-place write into ckpt.pt
        f.truncate(0)
    assert open(best, 'rb').read() == kept and torch.load(best, weights_only=False)['iter_num'] == 2


def test_a_folder_with_only_best_pt_says_how_to_continue_from_it(bigram_data, tmp_path, capsys):
    out = str(tmp_path / 'run')
    args = [f'--dataset={bigram_data}', f'--out_dir={out}', *SMALL, '--eval_interval=1']
    assert cli(capsys, *args, '--max_iters=2')[0] == 0
    ckpt, best = os.path.join(out, 'ckpt.pt'), os.path.join(out, 'best.pt')
    os.remove(ckpt)
    for extra in ('--init_from=scratch', '--init_from=auto', '--init_from=resume', '--eval_only=True'):
        code, _, err = cli(capsys, *args, '--max_iters=4', extra)
        assert code == 2 and err.count('\n') == 1, (extra, err)
        assert f'holds best.pt but no ckpt.pt' in err and f'cp {best} {ckpt}, then --init_from=resume' in err, err
    shutil.copy(best, ckpt)                                     # the advice, followed
    code, _, err = cli(capsys, *args, '--max_iters=4', '--init_from=resume')
    assert code == 0, err


def test_a_torn_last_log_line_is_ended_before_the_next_event(bigram_data, tmp_path, capsys):
    out = str(tmp_path / 'run')
    args = [f'--dataset={bigram_data}', f'--out_dir={out}', *SMALL, '--eval_interval=2']
    assert cli(capsys, *args, '--max_iters=2')[0] == 0
    torn = '{"event": "train", "iter": 3, "lo'                 # a run killed while writing this line
    with open(os.path.join(out, 'log.jsonl'), 'a') as f:
        f.write(torn)
    assert cli(capsys, *args, '--max_iters=4', '--init_from=resume')[0] == 0
    lines = open(os.path.join(out, 'log.jsonl')).read().splitlines()
    assert lines[-1].startswith('{') and lines.count(torn) == 1
    events, unreadable = [], []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:
            unreadable.append(line)
    assert unreadable == [torn]
    assert [e['iter'] for e in events if e['event'] == 'train'] == [1, 2, 3, 4]
