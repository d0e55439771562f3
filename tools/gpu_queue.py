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
                     "analysis", "quant"}}, "steps": {name: {"rc", "seconds"[, "stopped_by" | "error"]}}, "complete",
                     "next"[, "error", "failed"]}; rewritten as the call goes on; "complete" true when the item has
                     nothing left to do; "rc" null: the step was stopped (the deadline, or the signal "stopped_by"
                     names), the next call runs it; another non-zero "rc": the step failed, "error" is its own error
                     line (its last `error:` line, else its last line). A call that failed (a step that failed, or this
                     script's own error) has the outcome "failed", "error" (the line it printed), "failed" (a list of
                     {"step", "rc", "error"}: each step that failed in this call; empty when none did) and "next"
                     saying what to fix: called again as it is, it would fail the same way
  rows items         <run>.tar.gz per row (recipe.pack_run: log.jsonl with its probes, train.out, config.json,
                     reproduce.json, then analysis.json, quant.json and the tables' .md/.json/trajectories), packed
                     every 30 s while a row trains; <table>_trajectories.png of the item's first table
  gpu_tests          tests_first.log/.xml (the tests that failed on the H200 first), tests.log/.xml (pytest -m gpu)
  bench              bench.log/.json (attention at T = 256 and 1024 with the bias, the optimizer step with the fused
                     OrthoAdam kernel), bench_train.log/.json (60M and 130M steps: tokens/s, MFU),
                     side_by_side.json (two 60M rows on one GPU against each alone)
"""
import argparse
import glob
import importlib.util
import json
import math
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

from harness.entry import early_exit_on_signal   # noqa: E402  first: a signal while the rest loads is one line
early_exit_on_signal(__name__)

# library modules of the repository root (E402: imported once sys.path holds it)
from harness.entry import run_script, start_child, stop_child   # noqa: E402
from harness.device_files import UnpackError, brought_back, keep_outputs, unpack   # noqa: E402
from harness.device_steps import (FIX_NEXT, QUEUE_DIR, Call, QueueError, StepFailed, run_step,   # noqa: E402
                                  step_failure)
from harness.fileio import atomic_write, check_output, copy_atomic, path_arg, write_json  # noqa: E402
from harness.provenance import git_commit   # noqa: E402
from harness.recipe import pack_run, run_state   # noqa: E402

STARTUP_S = 45         # a training job's start before its clock runs: imports, the data check, the model
STOP_S = 30            # after a job's time budget: its checkpoint, exit, the final pack and status
PACK_EVERY_S = 30
REPRO_OUT = os.path.join('out', 'reproduce')


@dataclass(frozen=True)
class Item:
    name: str
    what: str
    kind: str                    # 'rows' (reproduce.py), 'tests' (pytest -m gpu) or 'bench'
    tables: tuple = ()           # rows: reproduce.py's tables
    rows: tuple = ()             # rows: config names, trained in this order (reproduce.py --rows: exact names)
    minutes: tuple = (9.5, 3.5)  # the two calls' --minutes on an H100 (the second: what the window has left)
    expect: str = ''             # what the calls should take and give, for docs/gpu-queue.md


ITEMS = (
    Item('vanilla_60m', "Table 2's vanilla GPT-2 60M row with the sink recipe, probed every 250 steps; then analyze.py "
         "and eval_quant.py", 'rows', ('table2', 'table3'), ('gpt2_60m_vanilla',),
         expect="10,000 steps of 32,768 tokens at ~0.84 M tokens/s: 6.5 min of steps + 1 min compile in call 1; "
                "call 2: the rest, analysis, quantisation"),
    Item('s1oa_60m', "Table 2's softmax-1 + OrthoAdam 60M row: the same data, recipe, steps and evaluation", 'rows',
         ('table2', 'table3'), ('gpt2_60m_s1oa',),
         expect="10,000 steps at ~0.76 M tokens/s: 7.2 min of steps + 1 min compile in call 1; call 2: the rest"),
    Item('gpu_tests', "GPU correctness: the 7 tests that failed on the H200 (the fsdp=True one-rank NCCL test among "
         "them) first, then pytest -m gpu", 'tests', minutes=(8.0, 4.5),
         expect="the first tests ~2 min, pytest -m gpu with 8 workers ~3.5 min (H200: 200 s)"),
    Item('vanilla_60m_bits', "Table 2's vanilla 60M row again, quantised at 4-8 bits as the softmax-1 + OrthoAdam row is "
         "(vanilla_60m predates the bit widths; its checkpoint ended with its window)", 'rows', ('table2', 'table3'),
         ('gpt2_60m_vanilla',), expect="as vanilla_60m"),
    Item('oa_60m', "Table 2's OrthoAdam-only 60M row", 'rows', ('table2',), ('gpt2_60m_oa',),
         expect="10,000 steps at ~0.80 M tokens/s"),
    Item('s1_60m', "Table 2's softmax-1-only 60M row", 'rows', ('table2',), ('gpt2_60m_s1',),
         expect="10,000 steps at ~0.76 M tokens/s"),
    Item('bench', "bench: attention at T = 256 / 1024 with the bias variant, the fused OrthoAdam step, MFU at 60M / "
         "130M; two 60M rows side by side on one GPU against each alone", 'bench', minutes=(9.0, 4.0),
         expect="attn+optim ~2.5 min, train ~4 min in call 1; side by side ~4 min in call 2"),
    Item('pilots', "the BOS x weight-decay pilots (vanilla 60M, 3,000 steps each, probed every 120)", 'rows',
         ('pilots',), ('bos0_wd01', 'bos0_wd05', 'bos1_wd01', 'bos1_wd05'),
         expect="4 x (2 min of steps + compile): two pilots per call"),
)
BY_NAME = {i.name: i for i in ITEMS}
# the tests that failed on the H200 (docs/results/h200-2026-11-26/tests_gpu.log), fixed since, run first
FIRST_TESTS = ('tests/test_flash_sink.py::test_log_sum_exp_includes_the_sink',
               'tests/test_orthoadam.py::test_fused_kernel_matches_dense_reference',
               'tests/test_gpu.py::test_fsdp_one_rank_on_device_matches_a_plain_process_and_resumes')
MINI_GPU_TESTS = 'test_log_sum_exp_includes_the_sink'   # --mini: one quick gpu test, on the CPU


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
    failures = []
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
            rc = run_step(call, f'reproduce {row}', cmd, call.left())
            if rc is None:
                break   # stopped (the deadline, a signal): the row is not finished; the next call continues it
            if rc != 0:   # failed (a refusal, a divergence): a row of its own may still train in this window
                failures.append(step_failure(call, f'reproduce {row}'))
            # exit 0 with the row not finished: its job's time budget ran out (reproduce.py --max_jobs 1), the next
            # call continues it
    finally:
        stop.set()
        stager.join()
    tables = [os.path.join(scale_dir(call), f'{t}{ext}') for t in item.tables for ext in ('.md', '.json')]
    figure = os.path.join(scale_dir(call), f'{item.tables[0]}_trajectories.png')
    pack_rows(call, dirs, extra=tables + [figure])
    if os.path.isfile(figure):
        copy_atomic(figure, call.out)
    call.status['rows'] = {os.path.basename(d): row_status(d, quant) for d in dirs.values()}
    if failures:   # packed above: what the failed rows wrote (train.out) comes back too
        raise StepFailed(failures)
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
    if rc is None:
        raise QueueError("preparing data/pinned_archive was stopped before it finished (300 s, or the call's deadline):"
                         " run the same command with more --minutes")
    if rc != 0:
        raise StepFailed([step_failure(call, 'prepare pinned_archive')])


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
    keep_outputs(call.out, call.state_dir, ('tests_first.log', 'tests_first.xml', 'tests.log', 'tests.xml'))
    return all(done.get(k, {}).get('rc') is not None for k in ('tests_first', 'tests'))


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
            keep_outputs(call.out, call.state_dir, (f'{name}.json', f'{name}.log'))
    if 'side_by_side' not in done and call.left() > (60 if call.mini else 240):
        if not call.dataset:
            prepare_archive(call)
        side_by_side(call)
        done['side_by_side'] = {'rc': 0, 'seconds': None}
    keep_outputs(call.out, call.state_dir,
                 ('bench.json', 'bench.log', 'bench_train.json', 'bench_train.log', 'side_by_side.json'))
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


def check_options(args, item):
    """--job_minutes and --dataset, as the step that reads them would refuse them, before anything starts: a refusal
    by reproduce.py or train.py would come after the call has begun, and again in every call."""
    if args.job_minutes is not None:
        if item.kind != 'rows':
            raise QueueError(f"--job_minutes: {item.name} trains no row (a {item.kind} item): it would be ignored; "
                             f"drop it")
        if not (math.isfinite(args.job_minutes) and args.job_minutes > 0):
            raise QueueError(f"--job_minutes {args.job_minutes:g}: give a training job's minutes, a finite number > 0")
    if args.dataset is not None:
        from harness.dataset import load_meta
        try:
            load_meta(os.path.abspath(args.dataset))
        except ValueError as e:
            raise QueueError(f"--dataset: {e}") from None


def cmd_run(args):
    item = BY_NAME.get(args.item)
    if item is None:
        raise QueueError(f"no queue item {args.item!r}: one of {', '.join(BY_NAME)}")
    if not (0 < args.minutes <= 10):
        raise QueueError(f"--minutes {args.minutes:g}: give the minutes this call may use, > 0 and <= 10 (one "
                         f"device command runs at most 10)")
    check_options(args, item)   # before anything starts: a child would refuse them, call after call
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
    except QueueError as e:   # a step that failed, or this script's own refusal: not unfinished work
        call.status.update(error=str(e), failed=getattr(e, 'failures', []), next=FIX_NEXT)
        call.save('failed')
        raise
    call.status['complete'] = bool(complete)
    call.status['next'] = 'nothing: the item is complete' if complete else 'call again with the same command'
    files, warning = brought_back(call.out)   # more than a device call brings back: a warning in status.json
    call.status['out_files'] = files
    if warning:
        call.status['warning'] = warning
    call.save('complete' if complete else 'unfinished')
    print(f"gpu_queue: {item.name}: call {len(call.status['calls'])} "
          f"{'complete' if complete else 'unfinished: call again with the same command'} "
          f"({time.time() - call.t0:.0f} s); {len(files)} files in {call.out}")
    return 0


def cmd_unpack(args):
    """A window's files into --into and out/reproduce/gpu/runs/ (harness/device_files.py unpack, which says why)."""
    into, runs_here = os.path.abspath(args.into), os.path.join(os.path.abspath(args.work), REPRO_OUT, 'gpu', 'runs')
    try:
        targets, packs, left_out = unpack(os.path.abspath(args.files), into, runs_here, 'gpu_queue.py')
    except UnpackError as e:
        raise QueueError(str(e)) from None
    print(f"unpacked {len(targets)} file(s) and {len(packs)} pack(s) into {os.path.relpath(into, ROOT)}"
          + (f"; runs also in {os.path.join(REPRO_OUT, 'gpu', 'runs')}" if packs else '')
          + (f"; {len(left_out)} file(s) left out (the line(s) above)" if left_out else ''))
    return 0


def done_items(results=os.path.join(ROOT, 'docs', 'results')):
    """{item: [its committed <item>.status.json files that say "complete": true]}. An item is done by what its own
    window's status says, never by a run folder's name: the laptop scale's rows have the 60M rows' names, and a window
    cut short (an unfinished call) leaves part of an item's files."""
    done = {}
    for item in ITEMS:
        done[item.name] = []
        for path in sorted(glob.glob(os.path.join(glob.escape(results), '*', f'{item.name}.status.json'))):
            try:
                with open(path) as f:
                    if json.load(f).get('complete') is True:
                        done[item.name].append(path)
            except (OSError, ValueError, AttributeError):   # unreadable, damaged or not an object: not done
                pass
    return done


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
    except QueueError as e:   # a refusal: 2 (as argparse's); a step that failed: 1 (as reproduce.py's failed rows)
        print(f"gpu_queue: error: {e}", file=sys.stderr)
        return 1 if isinstance(e, StepFailed) else 2


if __name__ == '__main__':
    run_script(main)
