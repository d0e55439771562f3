"""The standing GPU queue (docs/gpu-queue.md): each item is one command that a fresh GPU machine without network
runs as it is, in one or two calls of one 15-minute window, and that leaves what it has under --out after every
call (so a second call that never comes still brings back the first half).

    python tools/gpu_queue.py list                          # the items in queue order; which have committed results
    python tools/gpu_queue.py next                          # the next item and the two device calls that run it
    python tools/gpu_queue.py carry                         # data/corpus-archive.jsonl.xz and GPT-2's ranks in place
    python tools/gpu_queue.py run vanilla_60m --out "$OUT" --minutes 9.5    # call 1, on the GPU machine
    python tools/gpu_queue.py run vanilla_60m --out "$OUT" --minutes 3.5    # call 2: the same command continues
    python tools/gpu_queue.py run vanilla_60m --out /tmp/q --minutes 3 --mini   # the CPU miniature (the tests)

`run` stops by itself before --minutes have passed (a training job gets what is left, less the time to start, stop
and pack); give the device call a timeout_s of 60 x minutes + 30. The next call with the same command resumes
from the state the machine keeps while warm (out/ and data/ outlive a call; $OUT does not).

What lands in --out (at most 8 files of at most 16 MiB, never a checkpoint):
  status.json        {"item", "kind", "mini", "commit", "device", "torch", "calls": [{"call", "minutes", "started",
                     "seconds", "outcome"}], "rows": {run: {"state", "iter", "max_iters", "tokens_per_s",
                     "analysis", "quant"}}, "steps": {name: {"rc", "seconds"[, "stopped_by"]}}, "complete", "next"};
                     rewritten as the call goes on; "complete" true when the item has nothing left to do; "rc" null:
                     the step was stopped (the deadline, or the signal "stopped_by" names), the next call runs it
  rows items         <run>.tar.gz per row (recipe.pack_run: log.jsonl with its probes, train.out, config.json,
                     reproduce.json, then analysis.json, quant.json and the tables' .md/.json/trajectories), packed
                     every 30 s while a row trains; <table>_trajectories.png of the item's first table
  gpu_tests          tests_first.log/.xml (the tests that failed on the H200 first), tests.log/.xml (pytest -m gpu)
  bench              bench.log/.json (attention at T = 256 and 1024 with the bias, the optimizer step with the fused
                     OrthoAdam kernel), bench_train.log/.json (60M and 130M steps: tokens/s, MFU),
                     side_by_side.json (two 60M rows on one GPU against each alone)
"""
import argparse
import contextlib
import glob
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# library modules of the repository root (E402: imported once sys.path holds it)
from harness.entry import run_script, start_child, stop_child, stopping   # noqa: E402
from harness.fileio import MARK, atomic_write, check_output, copy_atomic, path_arg, temporary_folder, write_json  # noqa: E402
from harness.provenance import git_commit   # noqa: E402
from harness.recipe import PACK_LIMIT, pack_run, run_state, stopped_by   # noqa: E402

OUT_FILES = 8          # what one device call may bring back
STARTUP_S = 45         # a training job's start before its clock runs: imports, the data check, the model
STOP_S = 30            # after a job's time budget: its checkpoint, exit, the final pack and status
PACK_EVERY_S = 30
QUEUE_DIR = os.path.join('out', 'gpu_queue')   # what a call leaves on the machine for the next one
REPRO_OUT = os.path.join('out', 'reproduce')
NAME_CHARS = frozenset('abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-')   # unpack's plain_name


@dataclass(frozen=True)
class Item:
    name: str
    what: str
    kind: str                    # 'rows' (reproduce.py), 'tests' (pytest -m gpu) or 'bench'
    tables: tuple = ()           # rows: reproduce.py's tables
    rows: tuple = ()             # rows: config names, trained in this order (reproduce.py --rows: exact names)
    minutes: tuple = (9.5, 3.5)  # the two calls' --minutes on an H100 (the second: what the window has left)
    expect: str = ''             # what the calls should take and give, for docs/gpu-queue.md
    done: str = ''               # a glob under the repository: the item's results are committed


ITEMS = (
    Item('vanilla_60m', "Table 2's vanilla GPT-2 60M row with the sink recipe, probed every 250 steps; then analyze.py "
         "and eval_quant.py", 'rows', ('table2', 'table3'), ('gpt2_60m_vanilla',),
         expect="10,000 steps of 32,768 tokens at ~0.84 M tokens/s: 6.5 min of steps + 1 min compile in call 1; "
                "call 2: the rest, analysis, quantisation",
         done='docs/results/*/runs/table2-gpt2_60m_vanilla*/analysis.json'),
    Item('s1oa_60m', "Table 2's softmax-1 + OrthoAdam 60M row: the same data, recipe, steps and evaluation", 'rows',
         ('table2', 'table3'), ('gpt2_60m_s1oa',),
         expect="10,000 steps at ~0.76 M tokens/s: 7.2 min of steps + 1 min compile in call 1; call 2: the rest",
         done='docs/results/*/runs/table2-gpt2_60m_s1oa*/analysis.json'),
    Item('gpu_tests', "GPU correctness: the 7 tests that failed on the H200 (the fsdp=True one-rank NCCL test among "
         "them) first, then pytest -m gpu", 'tests', minutes=(8.0, 4.5),
         expect="the first tests ~2 min, pytest -m gpu with 8 workers ~3.5 min (H200: 200 s)",
         done='docs/results/*/tests.log'),
    Item('oa_60m', "Table 2's OrthoAdam-only 60M row", 'rows', ('table2',), ('gpt2_60m_oa',),
         expect="10,000 steps at ~0.80 M tokens/s", done='docs/results/*/runs/table2-gpt2_60m_oa*/analysis.json'),
    Item('s1_60m', "Table 2's softmax-1-only 60M row", 'rows', ('table2',), ('gpt2_60m_s1',),
         expect="10,000 steps at ~0.76 M tokens/s", done='docs/results/*/runs/table2-gpt2_60m_s1.*/analysis.json'),
    Item('bench', "bench: attention at T = 256 / 1024 with the bias variant, the fused OrthoAdam step, MFU at 60M / "
         "130M; two 60M rows side by side on one GPU against each alone", 'bench', minutes=(9.0, 4.0),
         expect="attn+optim ~2.5 min, train ~4 min in call 1; side by side ~4 min in call 2",
         done='docs/results/*/side_by_side.json'),
    Item('pilots', "the BOS x weight-decay pilots (vanilla 60M, 3,000 steps each, probed every 120)", 'rows',
         ('pilots',), ('bos0_wd01', 'bos0_wd05', 'bos1_wd01', 'bos1_wd05'),
         expect="4 x (2 min of steps + compile): two pilots per call",
         done='docs/results/*/runs/pilots-bos1_wd05*/analysis.json'),
)
BY_NAME = {i.name: i for i in ITEMS}
# the tests that failed on the H200 (docs/results/h200-2026-11-26/tests_gpu.log), fixed since, run first
FIRST_TESTS = ('tests/test_flash_sink.py::test_log_sum_exp_includes_the_sink',
               'tests/test_orthoadam.py::test_fused_kernel_matches_dense_reference',
               'tests/test_gpu.py::test_fsdp_one_rank_on_device_matches_a_plain_process_and_resumes')
MINI_GPU_TESTS = 'test_log_sum_exp_includes_the_sink'   # --mini: one quick gpu test, on the CPU


class QueueError(Exception):
    """One line for the user: what is wrong and what to do."""


# ----------------------------------------------------------------------------- the state a call leaves
class Call:
    """One call of an item: its deadline, its status (status.json, in QUEUE_DIR and copied to --out)."""

    def __init__(self, item, out, minutes, mini, commit, work=ROOT, dataset=None):
        self.item, self.out, self.mini, self.work, self.dataset = item, out, mini, work, dataset
        self.t0, self.deadline = time.time(), time.time() + 60 * minutes
        self.state_dir = os.path.join(work, QUEUE_DIR, item.name + ('_mini' if mini else ''))
        os.makedirs(self.state_dir, exist_ok=True)
        path = os.path.join(self.state_dir, 'status.json')
        try:
            with open(path) as f:
                self.status = json.load(f)
        except (OSError, ValueError):
            self.status = {'item': item.name, 'kind': item.kind, 'mini': mini, 'calls': [], 'rows': {}, 'steps': {}}
        self.status.update(commit=commit, device=device_name(), torch=torch_version(), complete=False,
                           next='call again with the same command')
        self.status['calls'].append({'call': len(self.status['calls']) + 1, 'minutes': minutes,
                                     'started': time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()),
                                     'seconds': 0, 'outcome': 'running'})
        self.lock = threading.Lock()
        self.save()

    def left(self):
        return self.deadline - time.time()

    def save(self, outcome=None):
        with self.lock:
            call = self.status['calls'][-1]
            call['seconds'] = round(time.time() - self.t0, 1)
            if outcome:
                call['outcome'] = outcome
            write_json(os.path.join(self.state_dir, 'status.json'), self.status, indent=1)
            write_json(os.path.join(self.out, 'status.json'), self.status, indent=1)


def device_name():
    try:
        import torch
        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"cpu ({os.cpu_count()} cores)"
    except ImportError:
        return None


def torch_version():
    spec = importlib.util.find_spec('torch')
    if spec is None:
        return None
    from importlib.metadata import version
    return version('torch')


def run_step(call, name, cmd, seconds, log=None, env=None):
    """A command in its own process group, stopped (SIGTERM, then SIGKILL) when `seconds` or the call's deadline
    less 20 s run out; output to `log` (a file under --out) or to this console. Records {"rc", "seconds"} in the
    status ("rc": null when it was stopped: by the deadline, or by a signal, which train.py and reproduce.py report
    as exit 128 + its number after their checkpoint, recipe.stopped_by; then "stopped_by" names it): a stopped step is
    run again by the next call. Returns the exit code or None."""
    limit = max(1.0, min(seconds, call.left() - 20))
    t, sink = time.time(), open(log, 'w') if log else None
    proc = start_child(cmd, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT if sink else None,
                       env={**os.environ, 'PYTHONUNBUFFERED': '1', **(env or {})})
    try:
        rc = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        rc = None
        stop_child(proc, grace=15)   # SIGTERM to its group: train.py writes a checkpoint; the next call resumes it
    except KeyboardInterrupt:   # a signal to this call, passed on to the step (start_child): stopped, run again
        call.status['steps'][name] = {'rc': None, 'seconds': round(time.time() - t, 1),
                                      'stopped_by': (stopping() or signal.SIGINT).name}
        call.save('stopped')
        raise
    finally:
        if sink:
            sink.close()
    stopped = stopped_by(rc)
    call.status['steps'][name] = {'rc': None if stopped else rc, 'seconds': round(time.time() - t, 1),
                                  **({'stopped_by': stopped.name} if stopped else {})}
    call.save()
    return None if stopped else rc


# ----------------------------------------------------------------------------- rows (reproduce.py)
def repro_args(call):
    scale = ['--scale', 'smoke'] if call.mini else ['--scale', 'gpu']
    data = ['--dataset', call.dataset] if call.dataset else []
    return [sys.executable, os.path.join(ROOT, 'reproduce.py'), *call.item.tables, *scale, *data,
            '--out', os.path.join(call.work, REPRO_OUT)]


def scale_dir(call):
    return os.path.join(call.work, REPRO_OUT, 'smoke' if call.mini else 'gpu')


def row_dirs(call):
    """{row config: its run folder}: reproduce.py names a run after its config (table/name -> table-name)."""
    return {row: os.path.join(scale_dir(call), 'runs', f"{call.item.tables[0]}-{row}") for row in call.item.rows}


def row_status(run_dir, quant):
    """What a row's folder holds: its training state (recipe.run_state), its median tokens/s and its results."""
    cfg_path = os.path.join(run_dir, 'config.json')
    try:
        with open(cfg_path) as f:
            max_iters = json.load(f)['max_iters']
    except (OSError, ValueError, KeyError):
        max_iters = None
    state = run_state(run_dir, max_iters or float('inf'))
    rates = []
    try:
        with open(os.path.join(run_dir, 'log.jsonl')) as f:
            for line in f:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if isinstance(e, dict) and e.get('event') == 'train' and e.get('tokens_per_s'):
                    rates.append(e['tokens_per_s'])
    except OSError:
        pass
    has = lambda name: os.path.isfile(os.path.join(run_dir, name))
    return {'state': state['state'], 'iter': state['iter'], 'max_iters': max_iters,
            'tokens_per_s': round(statistics.median(rates[1:] or rates)) if rates else None,
            'analysis': has('analysis.json'), 'quant': has('quant.json') if quant else None}


def row_complete(s):
    return s['state'] == 'finished' and s['analysis'] and s['quant'] is not False


def pack_rows(call, dirs, extra=()):
    """--out/<run>.tar.gz for every row folder with a log (recipe.pack_run; atomic: a kill keeps the last pack)."""
    for run_dir in dirs.values():
        if os.path.isfile(os.path.join(run_dir, 'log.jsonl')):
            try:
                pack_run(run_dir, os.path.join(call.out, os.path.basename(run_dir) + '.tar.gz'), extra)
            except ValueError as e:
                print(f"gpu_queue: not packed: {e}", file=sys.stderr)


def run_rows(call, job_minutes=None):
    item = call.item
    dirs, quant = row_dirs(call), any(t in ('table3', 'table6', 'mitigations') for t in item.tables)
    if not call.dataset:
        prepare_archive(call)
    stop = threading.Event()

    def stage():   # the packs while a row trains: what a killed call still brings back
        while not stop.wait(PACK_EVERY_S):
            pack_rows(call, dirs)
    stager = threading.Thread(target=stage, daemon=True)
    stager.start()
    try:
        for row, run_dir in dirs.items():
            s = row_status(run_dir, quant)
            if row_complete(s):
                continue
            left = call.left() - (5 if call.mini else STARTUP_S + STOP_S)
            if left < (5 if call.mini else 60) and s['state'] != 'finished':
                break   # too little time for a training job: the next call
            minutes = job_minutes if job_minutes is not None else max(left / 60, 0.5)
            cmd = repro_args(call) + ['--rows', row, '--job_minutes', f'{minutes:.6g}', '--max_jobs', '1']
            if run_step(call, f'reproduce {row}', cmd, call.left()) is None:
                break   # stopped (the deadline, a signal): the row is not finished; the next call continues it
    finally:
        stop.set()
        stager.join()
    tables = [os.path.join(scale_dir(call), f'{t}{ext}') for t in item.tables for ext in ('.md', '.json')]
    figure = os.path.join(scale_dir(call), f'{item.tables[0]}_trajectories.png')
    pack_rows(call, dirs, extra=tables + [figure])
    if os.path.isfile(figure):
        copy_atomic(figure, call.out)
    call.status['rows'] = {os.path.basename(d): row_status(d, quant) for d in dirs.values()}
    return all(row_complete(s) for s in call.status['rows'].values())


def prepare_archive(call):
    """data/pinned_archive from the carried archive, with every core (reproduce.py would use one)."""
    if os.path.isfile(os.path.join(ROOT, 'data', 'pinned_archive', 'meta.json')):
        return
    archive = os.path.join(ROOT, 'data', 'corpus-archive.jsonl.xz')
    if not os.path.isfile(archive):
        raise QueueError(f"{archive} is missing: run `python tools/gpu_queue.py carry` and name "
                         f"data/corpus-archive.jsonl.xz and data/corpus_cache/gpt2.tiktoken in the call's carry")
    rc = run_step(call, 'prepare pinned_archive',
                  [sys.executable, os.path.join(ROOT, 'prepare_c4.py'), '--source', 'pinned', '--subset', 'archive',
                   '--corpus_archive', archive, '--out_dir', os.path.join(ROOT, 'data', 'pinned_archive')], 300,
                  log=os.path.join(call.state_dir, 'prepare.log'))
    if rc != 0:
        with open(os.path.join(call.state_dir, 'prepare.log')) as f:
            last = [line.strip() for line in f if line.strip()][-1:] or ['(no output)']
        raise QueueError(f"preparing data/pinned_archive failed: {last[0]}")


# ----------------------------------------------------------------------------- GPU tests
def run_tests(call):
    xdist = importlib.util.find_spec('xdist') is not None
    env = {'GPU_TESTS_DEVICE': 'cpu'} if call.mini else {}
    pytest = [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '-m', 'gpu']
    done = call.status['steps']
    if 'tests_first' not in done or done['tests_first']['rc'] is None:
        first = list(FIRST_TESTS[:1] if call.mini else FIRST_TESTS)
        run_step(call, 'tests_first', pytest + first + ['--junitxml', os.path.join(call.out, 'tests_first.xml')],
                 300, log=os.path.join(call.out, 'tests_first.log'), env=env)
    if 'tests' not in done or done['tests']['rc'] is None:
        rest = ['-k', MINI_GPU_TESTS] if call.mini else (['-n', '8'] if xdist else [])
        run_step(call, 'tests', pytest + ['tests', *rest, '--junitxml', os.path.join(call.out, 'tests.xml')],
                 call.left(), log=os.path.join(call.out, 'tests.log'), env=env)
    keep_outputs(call, ('tests_first.log', 'tests_first.xml', 'tests.log', 'tests.xml'))
    return all(done.get(k, {}).get('rc') is not None for k in ('tests_first', 'tests'))


def keep_outputs(call, names):
    """What an earlier call of this item wrote to its --out is copied into the machine's state folder, and back to
    this call's --out, so that the last call brings back every output of the item."""
    for name in names:
        here, kept = os.path.join(call.out, name), os.path.join(call.state_dir, name)
        if os.path.isfile(here):
            copy_atomic(here, kept)
        elif os.path.isfile(kept):
            copy_atomic(kept, here)


# ----------------------------------------------------------------------------- bench
SBS_ITERS = 300        # steps per side-by-side measurement; tokens/s from the log lines after the first third
SBS_VARIANTS = ('vanilla', 's1oa')


def sbs_cmd(call, variant, tag):
    out = os.path.join(call.state_dir, 'side_by_side', f'{tag}_{variant}')
    shutil.rmtree(out, ignore_errors=True)   # a folder this item made for its own measurement
    if call.mini:
        args = ['config/tiny_cpu.py', f'--dataset={call.dataset}',
                f"--attn={'softmax1' if variant == 's1oa' else 'softmax'}",
                f"--optimizer={'orthoadam' if variant == 's1oa' else 'adamw'}", '--max_iters=6', '--eval_interval=6',
                '--log_interval=1', '--eval_tokens=1024', '--warmup_iters=1']
    else:
        args = [f'config/table2/gpt2_60m_{variant}.py', f"--dataset={call.dataset or 'pinned_archive'}",
                '--batch_size=128',
                '--gradient_accumulation_steps=1', '--windows=document', '--weight_decay=0.5',
                f'--max_iters={SBS_ITERS}', f'--eval_interval={SBS_ITERS}', '--eval_tokens=32768',
                '--log_interval=25', '--warmup_iters=20']
    return [sys.executable, os.path.join(ROOT, 'train.py'), *args, '--probe_docs=0', f'--out_dir={out}'], out


def rate(out):
    """Median tokens/s of a run's train events after the first third of its steps (compilation, warm-up)."""
    events = []
    with open(os.path.join(out, 'log.jsonl')) as f:
        for line in f:
            e = json.loads(line)
            if e.get('event') == 'train':
                events.append(e)
    late = [e['tokens_per_s'] for e in events if e['iter'] > events[-1]['iter'] / 3] if events else []
    return statistics.median(late) if late else None


def side_by_side(call):
    """Each 60M row alone, then both at once on the same GPU: tokens/s and the ratio each keeps."""
    result = {'iters': 6 if call.mini else SBS_ITERS, 'alone': {}, 'together': {}}
    for v in SBS_VARIANTS:
        cmd, out = sbs_cmd(call, v, 'alone')
        if run_step(call, f'alone {v}', cmd, 150, log=os.path.join(call.state_dir, f'sbs_alone_{v}.log')) == 0:
            result['alone'][v] = rate(out)
    procs, t = [], time.time()
    for v in SBS_VARIANTS:
        cmd, out = sbs_cmd(call, v, 'together')
        log = open(os.path.join(call.state_dir, f'sbs_together_{v}.log'), 'w')
        procs.append((v, out, log, start_child(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)))
    for v, out, log, proc in procs:
        try:
            rc = proc.wait(timeout=max(1.0, min(200, call.left() - 20) - (time.time() - t)))
        except subprocess.TimeoutExpired:
            rc = stop_child(proc, signal.SIGKILL)
        log.close()
        result['together'][v] = rate(out) if rc == 0 else None
    result['ratio'] = {v: (result['together'][v] / result['alone'][v]
                           if result['together'].get(v) and result['alone'].get(v) else None) for v in SBS_VARIANTS}
    result['rule'] = "each ratio >= 0.6: the 60M pair runs side by side in one window (docs/gpu-queue.md)"
    write_json(os.path.join(call.out, 'side_by_side.json'), result, indent=1)
    return result


def run_bench(call):
    done = call.status['steps']
    quick = ['--quick', '--device', 'cpu', '--repeats', '1'] if call.mini else []
    bench = [sys.executable, os.path.join(ROOT, 'bench.py'), *quick]
    for name, sections, seconds in (('bench', 'attn,optim', 200), ('bench_train', 'train', 280)):
        if call.mini:   # the CPU miniature: the attention section, to check the command
            if name == 'bench_train':
                continue
            sections = 'attn'
        if name not in done or done[name]['rc'] is None:
            run_step(call, name, bench + ['--sections', sections, '--json', os.path.join(call.out, f'{name}.json')],
                     seconds, log=os.path.join(call.out, f'{name}.log'))
            keep_outputs(call, (f'{name}.json', f'{name}.log'))
    if 'side_by_side' not in done and call.left() > (60 if call.mini else 240):
        if not call.dataset:
            prepare_archive(call)
        side_by_side(call)
        done['side_by_side'] = {'rc': 0, 'seconds': None}
    keep_outputs(call, ('bench.json', 'bench.log', 'bench_train.json', 'bench_train.log', 'side_by_side.json'))
    return all(k in done for k in ('bench', 'side_by_side')) and (call.mini or 'bench_train' in done)


# ----------------------------------------------------------------------------- commands
def check_out(out, work):
    """--out: an empty or missing folder (the device's $OUT is empty), never a file, this repository's own or a
    folder of the state the item keeps on the machine."""
    out, work = os.path.abspath(out), os.path.abspath(work)
    for mine in (os.path.join(work, QUEUE_DIR), os.path.join(work, REPRO_OUT)):
        if os.path.commonpath([out, mine]) in (out, mine):
            raise QueueError(f"--out {out} holds or is inside {mine}, where the item keeps its state: use $OUT")
    if os.path.exists(out) and not os.path.isdir(out):
        raise QueueError(f"--out {out} is a file: give the device's $OUT or an empty folder")
    if os.path.isdir(out) and os.listdir(out) and not os.path.isfile(os.path.join(out, 'status.json')):
        raise QueueError(f"--out {out} holds files this command did not write: give the device's $OUT or an "
                         f"empty folder")
    if os.path.commonpath([out, ROOT]) == ROOT and not out.startswith(os.path.join(ROOT, 'out') + os.sep):
        raise QueueError(f"--out {out} is inside the repository: use $OUT or a folder under out/")
    try:   # a path under a file, a read-only folder: before any work (fileio.check_output)
        check_output(out, '--out', folder=True, make=True)
    except ValueError as e:
        raise QueueError(str(e)) from None
    return out


def cmd_run(args):
    item = BY_NAME.get(args.item)
    if item is None:
        raise QueueError(f"no queue item {args.item!r}: one of {', '.join(BY_NAME)}")
    if not (0 < args.minutes <= 10):
        raise QueueError(f"--minutes {args.minutes:g}: give the minutes this call may use, > 0 and <= 10 (one "
                         f"device command runs at most 10)")
    if not args.mini and importlib.util.find_spec('torch') and not __import__('torch').cuda.is_available():
        raise QueueError("no CUDA GPU here: the queue's items run on a GPU machine; --mini runs the CPU miniature")
    out = check_out(args.out, args.work)   # before any work: a wrong --out is one line, whatever data/ holds
    dataset = os.path.abspath(args.dataset) if args.dataset else None
    if args.mini and dataset is None:   # the miniature's data: the synthetic task, made here when missing
        dataset = os.path.join(ROOT, 'data', 'bigram_backcopy')
        if not os.path.isfile(os.path.join(dataset, 'meta.json')):
            from harness.dataset import prepare_bigram_backcopy
            prepare_bigram_backcopy(dataset)
    call = Call(item, out, args.minutes, args.mini, args.commit or git_head(), os.path.abspath(args.work), dataset)
    try:
        complete = {'rows': lambda: run_rows(call, args.job_minutes), 'tests': lambda: run_tests(call),
                    'bench': lambda: run_bench(call)}[item.kind]()
    except QueueError as e:
        call.status['error'] = str(e)
        call.save('failed')
        raise
    call.status['complete'] = bool(complete)
    call.status['next'] = 'nothing: the item is complete' if complete else 'call again with the same command'
    files = [f for f in os.listdir(call.out)]
    big = [f for f in files if os.path.getsize(os.path.join(call.out, f)) > PACK_LIMIT]
    call.status['out_files'] = sorted(files)
    if len(files) > OUT_FILES or big:
        call.status['warning'] = f"{len(files)} files under --out (at most {OUT_FILES}), over 16 MiB: {big}"
    call.save('complete' if complete else 'unfinished')
    print(f"gpu_queue: {item.name}: call {len(call.status['calls'])} "
          f"{'complete' if complete else 'unfinished: call again with the same command'} "
          f"({time.time() - call.t0:.0f} s); {len(files)} files in {call.out}")
    return 0


def cmd_unpack(args):
    """status.json -> INTO/<item>.status.json; every <run>.tar.gz -> INTO/runs/<run>/ and out/reproduce/gpu/runs/<run>/
    (for reproduce.py --render --goal); every other file -> INTO/. Nothing already there is overwritten. Everything is
    unpacked into temporary folders beside those places first (fileio.temporary_folder) and moved in only when every
    file and pack came out whole: a damaged status.json or pack (cut short, not a tar), or a name from them that could
    write outside INTO (an "item" or member with '/' or '..', a link) is one line and leaves nothing."""
    src, into = os.path.abspath(args.files), os.path.abspath(args.into)
    runs_here = os.path.join(os.path.abspath(args.work), REPRO_OUT, 'gpu', 'runs')
    status_path = os.path.join(src, 'status.json')
    if not os.path.isfile(status_path):
        raise QueueError(f"{src} holds no status.json: give the folder a device call's files came back to")
    try:
        with open(status_path) as f:
            status = json.load(f)
        if not isinstance(status, dict):
            raise ValueError('not a JSON object')
    except (OSError, ValueError) as e:   # a file cut short on the way back
        raise QueueError(f"{status_path} cannot be read ({e}): the call's files came back damaged; nothing was "
                         f"unpacked: bring them back again") from None
    try:
        check_output(into, '--into', folder=True)
    except ValueError as e:
        raise QueueError(str(e)) from None
    item = status.get('item', 'item')
    if not plain_name(item):   # the name of a file written into --into: no folder, no '..', no absolute path
        raise QueueError(f"{status_path}: \"item\": {json.dumps(item)[:80]} is no queue item's name (letters, digits,"
                         f" _ . -): it could name a file outside {into}; nothing was unpacked")
    targets = {'status.json': f"{item}.status.json"}
    packs = sorted(f for f in os.listdir(src) if f.endswith('.tar.gz'))
    for name in sorted(os.listdir(src)):
        path = os.path.join(src, name)
        if os.path.islink(path) or not os.path.isfile(path) or name in packs and not plain_name(name[:-7]):
            raise QueueError(f"{path} is not what a device call brings back (a plain file; a pack named after its "
                             f"run): a link, a folder or a pack of no run; nothing was unpacked")
        if name not in targets and name not in packs:
            targets[name] = name
    clash = [os.path.join(into, t) for t in targets.values() if os.path.lexists(os.path.join(into, t))]
    clash += [os.path.join(d, p[:-len('.tar.gz')]) for p in packs for d in (os.path.join(into, 'runs'), runs_here)
              if os.path.lexists(os.path.join(d, p[:-len('.tar.gz')]))]
    if clash:
        raise QueueError(f"{clash[0]} exists: unpack into another --into folder (nothing was written)")
    stages, made, done = {}, [], False
    try:
        for final in (into, runs_here):
            parent = os.path.dirname(final)
            while not os.path.exists(parent):   # the folders made here, removed again if nothing is unpacked
                made.append(parent)
                parent = os.path.dirname(parent)
            os.makedirs(os.path.dirname(final), exist_ok=True)
            stages[final] = temporary_folder(final, 'gpu_queue.py')
        for name, target in targets.items():
            shutil.copy(os.path.join(src, name), os.path.join(stages[into], target))
        for pack in packs:
            for dest in (os.path.join(stages[into], 'runs'), stages[runs_here]):
                extract_pack(os.path.join(src, pack), pack[:-len('.tar.gz')], dest)
        for final, stage in stages.items():   # every pack whole: now into their places
            for entry in [e for e in os.listdir(stage) if e != MARK]:
                parts = [os.path.join(entry, r) for r in os.listdir(os.path.join(stage, entry))] if entry == 'runs' \
                    else [entry]
                for part in parts:
                    os.makedirs(os.path.dirname(os.path.join(final, part)), exist_ok=True)
                    os.replace(os.path.join(stage, part), os.path.join(final, part))
        done = True
    except OSError as e:
        raise QueueError(f"cannot unpack into {into} ({e.strerror}: {e.filename}): choose another --into") from None
    finally:
        for stage in stages.values():
            shutil.rmtree(stage, ignore_errors=True)
        for folder in [] if done else sorted(made, key=len, reverse=True):
            with contextlib.suppress(OSError):   # only while empty
                os.rmdir(folder)
    print(f"unpacked {len(targets)} file(s) and {len(packs)} pack(s) into {os.path.relpath(into, ROOT)}"
          + (f"; runs also in {os.path.join(REPRO_OUT, 'gpu', 'runs')}" if packs else ''))
    return 0


def plain_name(name):
    """A name unpack may write under: one path component of letters, digits, _ . - that is not '.' or '..'."""
    return isinstance(name, str) and name.strip('.') != '' and set(name) <= NAME_CHARS


def extract_pack(path, run, dest):
    """One row's pack (recipe.pack_run: members <run>/<file>) into dest/<run>/, read to its end: a pack cut short,
    a file that is no gzipped tar, a member outside <run>/ (an absolute name, a '..' component), a member that is no
    plain file or folder (a link, a device) or one tarfile's 'data' filter refuses is a one-line QueueError."""
    import tarfile
    import zlib
    try:
        with tarfile.open(path, 'r:gz') as tar:
            members = tar.getmembers()   # reads the whole pack: a truncated one fails here
            outside = [m.name for m in members if not m.name.startswith(run + '/') or not (m.isfile() or m.isdir())
                       or not all(plain_name(part) for part in m.name[len(run) + 1:].split('/'))]
            if outside:
                raise QueueError(f"{path}: the member {outside[0]} lies outside {run}/ or is no file (a link, a device;"
                                 f" not a pack of this queue); nothing was unpacked")
            tar.extractall(dest, members=members, filter='data')
    except (tarfile.TarError, EOFError, zlib.error) as e:
        raise QueueError(f"{path} is damaged or not a pack ({type(e).__name__}: {e}); nothing was unpacked: bring the "
                         f"call's files back again") from None


def done_items():
    return {i.name: sorted(glob.glob(os.path.join(ROOT, i.done))) for i in ITEMS}


def device_calls(item, commit):
    run = f"python tools/gpu_queue.py run {item.name} --out \"$OUT\""
    carry = '["data/corpus-archive.jsonl.xz", "data/corpus_cache/gpt2.tiktoken"]'
    first, second = item.minutes
    return [f"call 1: run(command='{run} --minutes {first:g} --commit {commit}', carry={carry}, "
            f"timeout_s={int(60 * first + 30)})",
            f"call 2 (at once, within 30 s; minutes = status's budget_left_s / 60 - 0.5, at most 10): "
            f"run(command='{run} --minutes {second:g} --commit {commit}', timeout_s={int(60 * second + 30)})",
            "then: python tools/gpu_queue.py unpack <files_at> (docs/gpu-queue.md, 'After a window')"]


def git_head():
    """This project's commit, short, as provenance.git_commit finds it ('unknown' outside its own git checkout)."""
    commit = git_commit()
    return 'unknown' if commit is None else commit[:12] + ('-dirty' if commit.endswith('-dirty') else '')


def cmd_list(_args):
    done = done_items()
    for n, item in enumerate(ITEMS, 1):
        mark = f"done ({os.path.relpath(done[item.name][0], ROOT)})" if done[item.name] else 'to do'
        print(f"{n}. {item.name}: {mark}\n   {item.what}\n   expected: {item.expect}")
    return 0


def cmd_next(_args):
    done = done_items()
    item = next((i for i in ITEMS if not done[i.name]), None)
    if item is None:
        print("every item of the queue has committed results")
        return 0
    commit = git_head()
    print(f"next: {item.name}: {item.what}\nexpected: {item.expect}")
    if commit.endswith('-dirty'):
        print("warning: tracked files differ from HEAD: commit first, so that the log names the code that ran")
    print('\n'.join(device_calls(item, commit)))
    return 0


def cmd_carry(args):
    """The two files a device call carries, from ../shared/corpus and the pinned GPT-2 ranks (sha256-checked). The
    archive is copied under a temporary name (fileio.atomic_write) and renamed only when its sha256 is the pinned
    one: a refused file leaves nothing in data/."""
    import hashlib
    from pinned_corpus.build import gpt2_ranks, load_manifest
    manifest = load_manifest()
    pinned = manifest['archive']['sha256']
    dest = os.path.join(ROOT, 'data', 'corpus-archive.jsonl.xz')
    src = args.archive or os.path.join(os.path.dirname(ROOT), 'shared', 'corpus', 'corpus-archive.jsonl.xz')

    def sha256(path, out=None):   # of the file at path, copied into out on the way
        h = hashlib.sha256()
        with open(path, 'rb') as f:
            for block in iter(lambda: f.read(1 << 20), b''):
                h.update(block)
                if out is not None:
                    out.write(block)
        return h.hexdigest()
    if not os.path.isfile(dest):
        if not os.path.isfile(src):
            raise QueueError(f"no archive at {src}: pass --archive FILE (the manifest pins {pinned[:16]}...)")
        made = not os.path.isdir(os.path.dirname(dest))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        try:
            with atomic_write(dest, 'wb') as out:
                found = sha256(src, out)
                if found != pinned:   # raised inside: the copy is removed, never renamed
                    raise QueueError(f"{src} has sha256 {found[:16]}..., the manifest pins {pinned[:16]}...: not the "
                                     f"pinned archive, nothing was copied; pass the pinned one with --archive FILE")
        except QueueError:
            if made:   # data/ too, when this made it
                os.rmdir(os.path.dirname(dest))
            raise
    elif sha256(dest) != pinned:
        raise QueueError(f"{dest} has sha256 {sha256(dest)[:16]}..., the manifest pins {pinned[:16]}...: move it away "
                         f"and copy the pinned one")
    from pathlib import Path
    ranks = gpt2_ranks(Path(ROOT) / 'data' / 'corpus_cache', manifest)
    size = (os.path.getsize(dest) + os.path.getsize(ranks)) / 2 ** 20
    print(f"carry: data/corpus-archive.jsonl.xz, data/corpus_cache/gpt2.tiktoken ({size:.1f} MiB, sha256-checked)")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest='command', required=True)
    sub.add_parser('list', help='the items in queue order')
    sub.add_parser('next', help='the next item without committed results, and its device calls')
    c = sub.add_parser('carry', help='put the archive and GPT-2 ranks where a device call carries them from')
    c.add_argument('--archive', type=path_arg,
                   help='the pinned archive file (default: ../shared/corpus/corpus-archive.jsonl.xz)')
    r = sub.add_parser('run', help='run an item (on the GPU machine), or its CPU miniature with --mini')
    r.add_argument('item', help=', '.join(BY_NAME))
    r.add_argument('--out', required=True, type=path_arg, help="the device's $OUT: what comes back")
    r.add_argument('--minutes', type=float, required=True, help='wall minutes this call may use (<= 10)')
    r.add_argument('--commit', default=None, help='the commit the working tree was copied from (for status.json)')
    r.add_argument('--mini', action='store_true', help='the CPU miniature: smoke-scale rows, CPU tests, quick bench')
    r.add_argument('--job_minutes', type=float, default=None, help=argparse.SUPPRESS)   # tests: force a short job
    r.add_argument('--work', default=ROOT, type=path_arg, help=argparse.SUPPRESS)   # tests: where out/ goes (default: here)
    r.add_argument('--dataset', default=None, type=path_arg, help=argparse.SUPPRESS)    # tests: a prepared folder for --mini
    u = sub.add_parser('unpack', help="a window's files (the device reply's files_at) into docs/results/ and "
                                      "out/reproduce/gpu/runs/")
    u.add_argument('files', type=path_arg, help="the folder the device call's files came back to (files_at)")
    u.add_argument('--into', required=True, type=path_arg,
                   help='docs/results/<date>-<device>, e.g. docs/results/2026-11-27-h100')
    u.add_argument('--work', default=ROOT, type=path_arg, help=argparse.SUPPRESS)   # tests: where out/ is (default: here)
    args = p.parse_args(argv)
    try:
        return {'list': cmd_list, 'next': cmd_next, 'carry': cmd_carry, 'run': cmd_run,
                'unpack': cmd_unpack}[args.command](args)
    except QueueError as e:
        print(f"gpu_queue: error: {e}", file=sys.stderr)
        return 2


if __name__ == '__main__':
    run_script(main)
