"""Validate every CUDA path of the project in one command and write one report (Markdown + JSON).

    python gpu_suite.py --out out/gpu_suite --quick               # every part, smaller (H200: > 10 min; docs/gpu.md)
    python gpu_suite.py --out out/gpu_suite                       # every part at full size (each <= 5 minutes)
    python gpu_suite.py --out out/gpu_suite --parts tests         # one part; the report merges every part in --out
    python gpu_suite.py --out out/gpu_suite --parts bench,bench_train   # the speed parts only
    python gpu_suite.py --out out/gpu_suite --parts train --data data/pinned_archive --train_iters 300
    python gpu_suite.py --out out/gpu_suite --nproc 8             # a multi-GPU node: training through torchrun

Parts (each a subprocess with its own log; --timeout, default 300 s, bounds each part, whose subprocesses share
it; a part stopped there keeps what it saved; a failed part is reported, the others still run):
  env    GPU, driver, torch / CUDA / cuDNN versions, SDPA backends enabled (always written)
  tests  python -m pytest -m gpu tests (8 workers with pytest-xdist): softmax-1 and the attention bias in
         kernels/flash_sink.py's Triton kernel and on every SDPA kernel vs the formula, compiled vs eager, every model
         toggle with compile + bf16 vs fp32 eager, OrthoAdam's CUDA paths vs the dense reference, resume
         exactness on the device, torchrun DDP on NCCL (tests/test_gpu.py, and the CPU tests that also run on
         CUDA)
  bench  python bench.py --sections attn,optim: attention at the paper's shapes (GPU time of CUDA graph
         replays) and the optimizer step at 130M and 350M
  bench_train  python bench.py --sections train: the compiled bf16 training step of 60M and 130M at the
         paper's batch (--quick: 2 micro-batches): tokens/s, MFU, peak memory; with bench, bench_report.TARGETS judged
  train  the four Table 2 variants of config/table2/gpt2_60m_*.py (vanilla, softmax-1, OrthoAdam, both) for
         --train_iters steps each at the paper's batch (512 x 256 tokens) on --data (equal budgets; --quick:
         30 steps, uncompiled), then analyze.py on each run (--analyze_docs validation documents): loss,
         tokens/s, MFU, kurtosis, max |activation|, first-token attention

Outputs in --out: env.json; tests.log, tests.xml (JUnit); bench.log, bench.json, bench_train.log,
bench_train.json (bench.py's JSON of each part, rewritten as it goes);
train/<variant>/ (train.py's ckpt.pt, config.json, log.jsonl, train.log, analysis.json), train.json (rewritten
after each variant); report.md and report.json ({"env", "tests": {"passed", "failed", "skipped", "errors",
"failures": [{"test", "message"}]}, "bench": {"targets": [{"name", "key", "value", "target", "met"}], "json": [the
bench.py JSON files]}, "train": [{"variant", "val_loss", "val_ppl", "tokens_per_s", "mfu", "wall_s", "ppl",
"kurtosis_first", "kurtosis_rest", "max_abs_first", "max_abs_rest", "first_attn_argmax"}], "parts": {part:
{"returncode", "wall_s"}}}). A part that has not run in --out is absent from the report.
"""
from harness.entry import early_exit_on_signal   # first: a signal while torch loads is one line, not a traceback
early_exit_on_signal(__name__)

import argparse
import importlib.util
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

from harness import bench_report
from harness.entry import run_script, start_child, stop_child
from harness.fileio import atomic_write, check_output, comma_list, integer, path_arg, write_json
from pinned_corpus.build import ARCHIVE_FILE, find_archive

ROOT = os.path.dirname(os.path.abspath(__file__))
PARTS = ('tests', 'bench', 'bench_train', 'train')
VARIANTS = ('vanilla', 's1', 'oa', 's1oa')   # config/table2/gpt2_60m_<variant>.py


def log(msg):
    print(f"[gpu_suite {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_part(name, cmd, logfile, timeout):
    """Run cmd (a list) from the repository root, stdout+stderr to logfile; (returncode, wall seconds).
    124 means it ran past `timeout` seconds."""
    log(f"{name}: {' '.join(cmd)}  (log: {logfile}, limit {timeout} s)")
    t0 = time.time()
    with open(logfile, 'a') as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        proc = start_child(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                           env=dict(os.environ, PYTHONUNBUFFERED='1'))
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_child(proc, signal.SIGKILL)   # the part and every process it started (its group)
            rc = 124
            f.write(f"\n[gpu_suite] stopped after {timeout} s\n")
    wall = time.time() - t0
    log(f"{name}: exit {rc} after {wall:.0f} s")
    return rc, wall


def environment():
    import torch
    env = {'python': platform.python_version(), 'torch': torch.__version__, 'cuda': torch.version.cuda,
           'cudnn': torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
           'cuda_available': torch.cuda.is_available(), 'time': time.strftime('%Y-%m-%d %H:%M:%S %Z')}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(device=torch.cuda.get_device_name(0), device_count=torch.cuda.device_count(),
                   memory_gib=round(p.total_memory / 2**30, 1), capability=f"{p.major}.{p.minor}",
                   multiprocessors=p.multi_processor_count,
                   sdpa_enabled={k: getattr(torch.backends.cuda, f'{k}_sdp_enabled')()
                                 for k in ('flash', 'mem_efficient', 'cudnn', 'math')})
        try:
            env['driver'] = subprocess.run(['nvidia-smi', '--query-gpu=driver_version', '--format=csv,noheader'],
                                           capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
        except (OSError, IndexError, subprocess.SubprocessError):
            env['driver'] = None
    return env


def junit_summary(path):
    """Counts and failure messages from pytest's JUnit XML."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == 'testsuite' else list(root)
    out = {'passed': 0, 'failed': 0, 'skipped': 0, 'errors': 0, 'failures': []}
    for suite in suites:
        for case in suite.iter('testcase'):
            name = f"{case.get('classname', '')}::{case.get('name')}"
            bad = case.find('failure') if case.find('failure') is not None else case.find('error')
            if bad is not None:
                out['failed' if bad.tag == 'failure' else 'errors'] += 1
                out['failures'].append({'test': name, 'message': (bad.get('message') or '').splitlines()[0][:300]
                                        if bad.get('message') else ''})
            elif case.find('skipped') is not None:
                out['skipped'] += 1
            else:
                out['passed'] += 1
    return out


def merge_bench(parts):
    """One bench.py result from the JSON of the bench and bench_train parts (each ran some sections)."""
    res = dict(parts[0])
    for part in parts[1:]:
        for key, value in part.items():
            if isinstance(value, list) and key != 'load_avg':
                res[key] = res.get(key, []) + value
            elif value is not None and (res.get(key) is None or key not in res):
                res[key] = value
    return res


def train_part(args, out):
    """Train the four 60M variants with equal budgets, then analyze each; train.json is rewritten after each
    variant (a part stopped at its limit keeps the rows it finished). Returns train.json's content."""
    from harness.runs import read_log
    deadline = time.time() + args.timeout   # the part's limit, shared by its subprocesses

    def left():
        return max(1, int(deadline - time.time()))
    data = os.path.abspath(args.data)
    logfile = os.path.join(out, 'train.log')
    if not os.path.isfile(os.path.join(data, 'meta.json')):
        archive = find_archive(ROOT)
        rc, _ = run_part('train: data', [sys.executable, 'prepare_c4.py', '--source', 'pinned', '--subset', 'archive',
                                         *(['--corpus_archive', archive] if archive else []), '--out_dir', data],
                         logfile, left())
        if rc:
            return {'data': {'dir': data}, 'iters': args.train_iters, 'nproc': args.nproc,
                    'rows': [{'variant': v, 'returncode': rc, 'wall_s': 0.0,
                              'error': f'prepare_c4.py failed (exit {rc}); see train.log'} for v in VARIANTS]}
    n = args.train_iters
    launcher = ([sys.executable, '-m', 'torch.distributed.run', '--standalone', f'--nproc_per_node={args.nproc}']
                if args.nproc > 1 else [sys.executable])
    rows, tokens_per_step = [], None
    for v in VARIANTS:
        run_dir = os.path.join(out, 'train', v)
        os.makedirs(run_dir, exist_ok=True)
        cmd = launcher + ['train.py', os.path.join('config', 'table2', f'gpt2_60m_{v}.py'), f'--dataset={data}',
                          f'--out_dir={run_dir}', '--init_from=auto', f'--max_iters={n}', f'--lr_decay_iters={n}',
                          f'--warmup_iters={max(1, n // 10)}', f'--eval_interval={n}', f'--log_interval={max(1, n // 20)}',
                          f'--eval_tokens={args.eval_tokens}'] + shlex.split(args.train_args)
        rc, wall = run_part(f'train {v}', cmd, os.path.join(run_dir, 'train.log'), left())
        row = {'variant': v, 'returncode': rc, 'wall_s': wall}
        log_path = os.path.join(run_dir, 'log.jsonl')   # a resumed run logs some iterations twice: the last counts
        trains, evals = read_log(log_path) if os.path.isfile(log_path) else ([], [])
        trains = trains[1:]   # the first interval includes compilation
        if evals:
            row.update(val_loss=evals[-1]['val_loss'], val_ppl=evals[-1]['val_ppl'], iter=evals[-1]['iter'])
        if trains:
            row['tokens_per_s'] = statistics.median(e['tokens_per_s'] for e in trains)
            mfus = [e['mfu'] for e in trains if e['mfu'] is not None]
            row['mfu'] = statistics.median(mfus) if mfus else None
        if rc == 0:
            analysis = os.path.join(run_dir, 'analysis.json')
            arc, _ = run_part(f'analyze {v}', [sys.executable, 'analyze.py', '--ckpt', run_dir, '--data', data,
                                               '--max_docs', str(args.analyze_docs), '--json', analysis],
                              os.path.join(run_dir, 'train.log'), left())
            if arc == 0:
                a = json.load(open(analysis))
                row.update({k: a.get(k) for k in ('ppl', 'kurtosis_first', 'kurtosis_rest', 'max_abs_first',
                                                  'max_abs_rest', 'first_attn_argmax')})
        if os.path.isfile(os.path.join(run_dir, 'config.json')):
            c = json.load(open(os.path.join(run_dir, 'config.json')))
            tokens_per_step = c['batch_size'] * c['gradient_accumulation_steps'] * c['block_size']
        rows.append(row)
        result = {'data': data_info(data), 'iters': n, 'nproc': args.nproc, 'train_args': args.train_args,
                  'tokens_per_step': tokens_per_step, 'rows': rows}
        write_json(os.path.join(out, 'train.json'), result, indent=1)
    return result


def data_info(data):
    with open(os.path.join(data, 'meta.json')) as f:
        meta = json.load(f)
    return {'dir': data, 'tokenizer': meta.get('tokenizer'), 'vocab_size': meta.get('vocab_size'),
            'stand_in_for_c4': meta.get('stand_in_for_c4')}


def fmt(v, spec):
    return 'n/a' if v is None else format(v, spec)


def write_report(out):
    """report.md and report.json from whatever parts have run in `out`."""
    rep = {'parts': {}}
    path = lambda name: os.path.join(out, name)
    if os.path.isfile(path('parts.json')):
        rep['parts'] = json.load(open(path('parts.json')))
    lines = ['# GPU suite report', '']
    if os.path.isfile(path('env.json')):
        env = rep['env'] = json.load(open(path('env.json')))
        gpu = (f"**{env['device']}** (x{env.get('device_count', 0)}, {env.get('memory_gib')} GiB, capability "
               f"{env.get('capability')}), driver {env.get('driver')}, " if env.get('device') else
               "**no CUDA device** (the gpu tests skip, bench.py times the CPU), ")
        lines += [f"Device: {gpu}torch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']}, "
                  f"Python {env['python']}; {env['time']}.", '']
    for part, info in rep['parts'].items():
        lines.append(f"- part `{part}`: exit {info['returncode']}, {info['wall_s']:.0f} s")
    if os.path.isfile(path('tests.xml')):
        t = rep['tests'] = junit_summary(path('tests.xml'))
        lines += ['', '## Tests (`python -m pytest -m gpu tests`)', '',
                  f"{t['passed']} passed, {t['failed']} failed, {t['errors']} errors, {t['skipped']} skipped."]
        if t['failures']:
            lines += ['', '| test | message |', '| --- | --- |']
            lines += [f"| `{f['test']}` | {f['message'].replace('|', '/')} |" for f in t['failures']]
    if os.path.isfile(path('bench.json')) or os.path.isfile(path('bench_train.json')):
        res = merge_bench([json.load(open(path(f))) for f in ('bench.json', 'bench_train.json') if os.path.isfile(path(f))])
        rep['bench'] = {'targets': bench_report.judge(res), 'json': [f for f in ('bench.json', 'bench_train.json')
                                                               if os.path.isfile(path(f))]}
        lines += ['', '## Speed (`python bench.py`)', '', '| target | measured | wanted | met |', '| --- | ---: | ---: | :-: |']
        for t in rep['bench']['targets']:
            met = {None: 'not measured', True: 'yes', False: '**no**'}[t['met']]
            lines.append(f"| {t['name']} | {fmt(t['value'], '.3f')} | {t['target']} | {met} |")
        lines += ['', '```', bench_report.report(res), '```']
    if os.path.isfile(path('train.json')):
        tr = json.load(open(path('train.json')))
        rep['train'] = tr['rows']
        d = tr['data']
        lines += ['', f"## Training: GPT-2 60M, the four Table 2 variants, {tr['iters']} steps of "
                  f"{fmt(tr.get('tokens_per_step'), ',')} tokens each, {tr['nproc']} process(es)", '',
                  f"Data: `{d['dir']}` (tokenizer {d.get('tokenizer')}, vocabulary {d.get('vocab_size')}"
                  f"{', a stand-in for C4, not C4' if d.get('stand_in_for_c4') else ''})."
                  + (f" Extra train.py arguments: `{tr['train_args']}`." if tr.get('train_args') else ''), '',
                  '| variant | val loss | val PPL | tokens/s | MFU | wall | PPL (analyze) | kurtosis first / rest '
                  '| max abs first / rest | first-token argmax |', '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |']
        for r in tr['rows']:
            if 'error' in r:
                lines.append(f"| {r['variant']} | {r['error']} |||||||||")
                continue
            mfu = 'n/a' if r.get('mfu') is None else f"{100 * r['mfu']:.1f}%"
            lines.append(f"| {r['variant']} | {fmt(r.get('val_loss'), '.4f')} | {fmt(r.get('val_ppl'), '.2f')} | "
                         f"{fmt(r.get('tokens_per_s'), ',.0f')} | {mfu} | {r['wall_s']:.0f} s | "
                         f"{fmt(r.get('ppl'), '.2f')} | {fmt(r.get('kurtosis_first'), '.1f')} / "
                         f"{fmt(r.get('kurtosis_rest'), '.1f')} | {fmt(r.get('max_abs_first'), '.1f')} / "
                         f"{fmt(r.get('max_abs_rest'), '.1f')} | {fmt(r.get('first_attn_argmax'), '.3f')} |")
    with atomic_write(path('report.md')) as f:
        f.write('\n'.join(lines) + '\n')
    write_json(path('report.json'), rep, indent=1)
    return rep


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--out', required=True, type=path_arg, help='folder for logs, part results and report.md / report.json')
    p.add_argument('--parts', default=','.join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    p.add_argument('--quick', action='store_true', help='bench.py --quick and 30 training steps (a smoke run)')
    p.add_argument('--data', default='data/pinned_archive', type=path_arg,
                   help='prepared dataset for the train part (made with '
                   f'prepare_c4.py --source pinned --subset archive when missing, from data/{ARCHIVE_FILE} when there)')
    p.add_argument('--train_iters', type=integer, default=100, help='training steps per variant (train part)')
    p.add_argument('--eval_tokens', type=integer, default=262_144, help='validation tokens of each run (train part)')
    p.add_argument('--analyze_docs', type=integer, default=200, help='validation documents analysed per run')
    p.add_argument('--nproc', type=integer, default=1, help='GPUs for the train part (torchrun when > 1)')
    p.add_argument('--train_args', default='', help="extra train.py overrides for every variant, e.g. "
                   "'--batch_size=32 --gradient_accumulation_steps=16' (same global batch, less memory)")
    p.add_argument('--timeout', type=integer, default=300, help="seconds allowed to each part (a part's "
                   "subprocesses share it): the default fits a ten-minute call of a lent GPU")
    args = p.parse_args(argv)
    parts = comma_list(args.parts)
    if not parts or any(s not in PARTS for s in parts):
        p.error(f"--parts={args.parts!r}: allowed a comma-separated subset of {','.join(PARTS)}")
    for key in ('train_iters', 'eval_tokens', 'analyze_docs', 'nproc', 'timeout'):
        if getattr(args, key) < 1:
            p.error(f"--{key}={getattr(args, key)}: must be >= 1")
    out = os.path.abspath(args.out)
    try:   # before any part runs (fileio.check_output)
        check_output(args.out, '--out', folder=True, make=True)
    except ValueError as e:
        p.error(str(e))
    env = environment()
    write_json(os.path.join(out, 'env.json'), env, indent=1)
    if not env['cuda_available']:
        log("warning: no CUDA device; the gpu tests will be skipped and bench.py will time the CPU")
    done_path = os.path.join(out, 'parts.json')
    done = json.load(open(done_path)) if os.path.isfile(done_path) else {}
    if args.quick:
        args.train_iters = min(args.train_iters, 30)
        args.train_args = ' '.join(['--compile=False', args.train_args]).strip()   # the tests part compiles
    for part in parts:
        if part == 'tests':
            workers = ['-n', '8'] if importlib.util.find_spec('xdist') else []   # pytest-xdist: 3x faster
            rc, wall = run_part('tests', [sys.executable, '-m', 'pytest', '-q', '-m', 'gpu', 'tests', '-rfEs', *workers,
                                          f"--junitxml={os.path.join(out, 'tests.xml')}", '-p', 'no:cacheprovider'],
                                os.path.join(out, 'tests.log'), args.timeout)
        elif part in ('bench', 'bench_train'):
            sections = 'attn,optim' if part == 'bench' else 'train'
            rc, wall = run_part(part, [sys.executable, 'bench.py', f'--sections={sections}',
                                       f"--json={os.path.join(out, part + '.json')}"] + (['--quick'] if args.quick else []),
                                os.path.join(out, part + '.log'), args.timeout)
        else:
            t0 = time.time()
            result = train_part(args, out)
            rc, wall = max(r.get('returncode', 1) for r in result['rows']), time.time() - t0
        done[part] = {'returncode': rc, 'wall_s': wall}
        write_json(done_path, done, indent=1)
        write_report(out)
    rep = write_report(out)
    log(f"report: {os.path.join(out, 'report.md')}")
    print(open(os.path.join(out, 'report.md')).read())
    return 0 if all(info['returncode'] == 0 for info in rep['parts'].values()) else 1


if __name__ == '__main__':
    run_script(main)
