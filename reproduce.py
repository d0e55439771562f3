"""Reproduce the paper's tables: train every row (train.py / torchrun), analyze it, quantise it, render the table.

    python reproduce.py table5 table2 --scale mini --jobs 2    # the CPU miniature (Bigram-Backcopy task)
    python reproduce.py table2 --scale gpu --rows gpt2_60m_vanilla --job_minutes 6 --max_jobs 1   # one H100 job
    python reproduce.py table2 table3 --nproc 8                # paper scale: each run on 8 GPUs, one at a time
    python reproduce.py table5 --jobs 8                        # paper scale: 8 single-GPU runs at once
    python reproduce.py table5 --rows orthoadam sgd            # only rows whose config name contains a word
    python reproduce.py table5 --dry_run                       # print the commands, run nothing
    python reproduce.py table5 --render                        # tables from the results that exist

Tables: table2 (main results), table3 (quantisation), table5 (ablation), table6 (sequence length), pilots
(the sink pilots: vanilla 60M, BOS x weight decay, config/pilots/), and mitigations (ours: the paper's
fixes beside other published ones, config/mitigations/). Each row is a
config file in config/<table>/ (shared settings live in the files they include); the paper's published
numbers sit in paper_tables.TABLES and are printed beside ours.

Scales: `paper` runs the config files as written (C4, GPUs). `gpu` trains every row with the sink recipe
(harness/recipe.py) at a size whose row fits one 15-minute H100 session (SCALES['gpu'] says how; the data,
tokens per run and expected wall time are printed before anything runs). `mini` and `smoke` shrink every row the
same way, keeping each row's differences: n_layer and the number of heads are multiplied by `depth`
and `width` (head size kept), block_size by `seq`, and a row trains `iters` iterations times its
schedule factor (8 for the SGD rows of Table 5, as in the paper), all with warmup `warmup` x `iters`. Scale
overrides (data, batch, evaluation) are the same for every row.

Runs go to <out>/<scale>/runs/<row> (train.py's ckpt.pt, config.json, log.jsonl, plus train.out,
analysis.json from analyze.py, quant.json from eval_quant.py, reproduce.json = the run's training
config). A run whose results exist is skipped; an interrupted run resumes (train.py --init_from=auto).
Rows of different tables with the same training config share one run (e.g. Table 2's 130M grid and
Table 5's rows at a scale where their schedules coincide).

Output, per table, in <out>/<scale>/: <table>.md (the table in the paper's layout, ours / paper in
each cell pair), <table>_trajectories.png (plots.plot_trajectories: the probe of every evaluation of
every run of the table against the tokens seen, one line per run), <table>_bits.{md,json,png} where the scale
quantises at 4-8 bits, table5_claims.png (each of Table 5's claims over training), mitigations_effects.png (each fix
as a point) and <table>.json: {"table", "title", "scale", "scale_description", "columns": [{"name", "key", "paper":
bool}], "rows": [{"config", "run_dir" (relative to the table's folder), "labels": [...], "ours": {key: value or null},
"paper": {key: value}}][, "claims": Table 5's at the laptop scale]} (docs/reproducing.md, "Outputs").
"""
from harness.entry import early_exit_on_signal   # first: a signal while torch loads is one line, not a traceback
early_exit_on_signal(__name__)

import argparse
import glob
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from configurator import ConfigError, load_config
from harness import sweep_report as report
from harness.dataset import load_meta, prepare_bigram_backcopy, resolve_dataset
from harness.entry import run_script, start_child, stopping
from harness.fileio import PrepareError, atomic_write, check_output, duration, number, path_arg, write_json
from harness.paper_tables import TABLES
from harness.recipe import (ETA_MIN_TRAINED, pack_runs, remaining_time, run_state, step_work, stopped_by,
                            tokens_per_iter, trained_iters, work_left)
from harness.scales import SCALES, Scale, scaled_overrides
from pinned_corpus.build import CorpusError, find_archive
from pinned_corpus.prepare import prepare_bb_shakespeare, prepare_pinned

ROOT = os.path.dirname(os.path.abspath(__file__))


# ----------------------------------------------------------------------------- scales (harness/scales.py)
# keys that do not change what a run computes (its weights): runs equal in everything else are one run
NOT_IDENTITY = ('out_dir', 'init_from', 'eval_only', 'log_interval', 'eval_interval', 'probe_docs', 'probe_interval',
                'always_save_checkpoint', 'divergence_factor', 'wandb_log', 'wandb_project', 'wandb_run_name',
                'compile', 'device')



class SweepError(Exception):
    """A one-line, user-facing error."""


class Interrupted(SweepError):
    """A command stopped by a signal (train.py: after its checkpoint); reproduce.py exits 128 + its number too."""

    def __init__(self, message, signum):
        super().__init__(message)
        self.signum = signum


# ----------------------------------------------------------------------------- planning
@dataclass
class Run:
    name: str                      # folder under runs/
    config: str                    # config/<config>.py
    overrides: list
    cfg: dict                      # resolved training config
    quant: bool = False            # eval_quant.py needed
    rows: list = field(default_factory=list)   # (table, Row) pairs it serves

    @property
    def identity(self):
        """The training config without NOT_IDENTITY keys, as JSON would store it (tuples as lists)."""
        return json.loads(json.dumps({k: v for k, v in self.cfg.items() if k not in NOT_IDENTITY}, default=str))


def resolve(config, overrides):
    """The training config train.py would use for config/<config>.py and the overrides."""
    from harness.train_config import CHOICES, DEFAULTS, RANGES   # imports torch: only when planning
    path = os.path.join(ROOT, 'config', f'{config}.py')
    try:
        return load_config(DEFAULTS, [path] + overrides, CHOICES, RANGES)
    except ConfigError as e:
        raise SweepError(str(e)) from None


def identity_key(identity):
    return json.dumps(identity, sort_keys=True)


def saved_identity(identity):
    """A run's saved identity with the config keys added to train.py since then at their defaults (which
    reproduce what the run did) and without the keys NOT_IDENTITY gained since (eval_interval), so that older
    runs still match."""
    from harness.train_config import DEFAULTS
    added = {k: v for k, v in DEFAULTS.items() if k not in identity and k not in NOT_IDENTITY}
    kept = {k: v for k, v in identity.items() if k not in NOT_IDENTITY}
    return json.loads(json.dumps({**added, **kept}, default=str))


def existing_runs(out):
    """{folder: identity key} of the runs already under <out>/runs (of any table)."""
    found = {}
    for path in sorted(glob.glob(os.path.join(out, 'runs', '*', 'reproduce.json'))):
        try:
            with open(path) as f:
                found[os.path.dirname(path)] = identity_key(saved_identity(json.load(f)['identity']))
        except (OSError, ValueError, KeyError):
            continue
    return found


def row_selected(config, words):
    """--rows: a WORD that names a row exactly (its config, e.g. table2/gpt2_60m_s1, or the name alone) selects that
    row alone; any other WORD, every row whose config contains it (gpt2_60m: the four 60M rows). A row's config may
    be folders deep (laptop/pilots/p07_archive): its name alone or any tail of whole folders names it."""
    names = {c for t in TABLES.values() for r in t.rows for c in (r.config, r.config.split('/')[-1])}
    return any(config == word or config.endswith('/' + word) if word in names else word in config for word in words)


def plan(tables, scale: Scale, out, row_filter=(), dataset=None):
    """The runs the tables need, one per distinct training config, in table order. A row whose training
    config matches a run already in <out>/runs (trained for another table) uses that run."""
    runs, by_identity, existing, left_out = [], {}, existing_runs(out), {}
    for name in tables:
        for row in TABLES[name].rows:
            if row_filter and not row_selected(row.config, row_filter):
                continue
            base = resolve(row.config, [])
            overrides = scaled_overrides(base, scale, row.steps, name)
            if overrides is None:
                left_out.setdefault(name, []).append(row.config)
                continue
            overrides += [f'--dataset={dataset}'] if dataset else []
            run_name = row.config.replace('/', '-')
            run = Run(run_name, row.config, overrides, resolve(row.config, overrides))
            key = identity_key(run.identity)
            if key not in by_identity:
                own = os.path.join(out, 'runs', run_name)
                folder = own if existing.get(own) == key else next((f for f, k in existing.items() if k == key), own)
                run.name = os.path.basename(folder)
                run.overrides.append(f'--out_dir={in_root(folder)}')
                run.cfg['out_dir'] = folder
            run = by_identity.setdefault(key, run)
            if not any(r is run for r in runs):
                runs.append(run)
            run.quant |= any(c[1] == 'quant' for c in TABLES[name].columns) or name in scale.quant_tables
            run.rows.append((name, row))
    for name, configs in left_out.items():
        print(f"{name}: not at this scale: {', '.join(configs)}", file=sys.stderr)
    if not runs and row_filter:
        here = [r.config.split('/')[-1] for t in tables for r in TABLES[t].rows
                if scaled_overrides(resolve(r.config, []), scale, r.steps, t) is not None]
        raise SweepError(f"--rows {' '.join(row_filter)} matches no row of {', '.join(tables)} at this scale"
                         + (f"; the rows it runs here: {', '.join(dict.fromkeys(here))}" if here else
                            " (none of its rows runs at this scale)"))
    if not runs:
        fits = [n for n, other in SCALES.items() if any(scaled_overrides(resolve(r.config, []), other, r.steps, t)
                                                         is not None for t in tables for r in TABLES[t].rows)]
        raise SweepError(f"no row of {', '.join(tables)} runs at this scale (the line above lists them); "
                         f"--scale {' or '.join(fits)} runs {'them' if len(tables) == 1 else 'some'}")
    return runs


def data_dir(dataset):
    """The folder of a run's dataset, as train.py (run in ROOT) resolves it: dataset.resolve_dataset's rule."""
    return dataset if os.path.isabs(dataset) else os.path.join(ROOT, resolve_dataset(dataset))


def scale_dataset(scale: Scale):
    """The first of the scale's datasets that is prepared (else its last), or None for scales without a choice."""
    for dataset in scale.datasets:
        if os.path.isfile(os.path.join(data_dir(dataset), 'meta.json')):
            return dataset
    return scale.datasets[-1] if scale.datasets else None


def ensure_data(runs, dry_run=False):
    """Check every dataset the runs read; the ones a scale names by default are prepared when missing (seconds to a
    minute): the Bigram-Backcopy tasks, the bytes of the pinned corpus's CPU subset, and its archive subset in GPT-2
    tokens or in bytes (from corpus-archive.jsonl.xz in data/ or the working directory, else from its registry
    artifacts). dry_run: one line per dataset that is not ready, saying what the runs would do, and nothing done."""
    for dataset in dict.fromkeys(r.cfg['dataset'] for r in runs):
        d = data_dir(dataset)
        try:
            load_meta(d)
            continue
        except ValueError as e:
            problem = str(e)
        where = '' if d in problem else f" (the runs read {d})"
        archive = find_archive() if dataset in ('pinned_archive', 'pinned_archive_bytes') else None
        from_archive = f' --corpus_archive {archive}' if archive else ''
        how = {'bigram_backcopy': ('bigram_backcopy', lambda: prepare_bigram_backcopy(d)),
               'bb_shakespeare': ('bb_shakespeare', lambda: prepare_bb_shakespeare(d)),
               'pinned_cpu_bytes': ('pinned --tokenizer bytes', lambda: prepare_pinned(d, 'cpu', tokenizer='bytes')),
               'pinned_laptop_bytes': ('pinned --subset laptop --tokenizer bytes',
                                       lambda: prepare_pinned(d, 'laptop', tokenizer='bytes')),
               'pinned_archive': ('pinned --subset archive' + from_archive, lambda: prepare_pinned(d, 'archive', archive)),
               'pinned_archive_bytes': ('pinned --subset archive --tokenizer bytes' + from_archive,
                                        lambda: prepare_pinned(d, 'archive', archive, tokenizer='bytes'))}.get(dataset)
        if not os.path.exists(os.path.join(d, 'meta.json')) and how:
            print(f"{'data: not prepared yet: a run would prepare' if dry_run else 'preparing'} {d} (python "
                  f"prepare_c4.py --source {how[0]} --out_dir {d})", file=sys.stderr)
            if dry_run:
                continue
            try:
                how[1]()
            except (PrepareError, CorpusError) as e:
                raise SweepError(f"{e}{'' if d in str(e) else where}") from None
            continue
        if dry_run:
            print(f"data: a run would stop here: {problem}{where}", file=sys.stderr)
            continue
        raise SweepError(f"{problem}{where}")


H100_MFU = 0.30   # vanilla 60M and 130M steps reached 30-35% of the H100's bf16 peak (docs/performance.md)
RUN_OVERHEAD_S = 90   # compilation, the final evaluation, analyze.py and eval_quant.py of one run


def expected_seconds(run):
    """One run's expected wall time on one H100: its training FLOPs at H100_MFU, eager attention (attention.EAGER:
    the T x T matrix) at half that, plus RUN_OVERHEAD_S."""
    import torch
    from model import GPT, GPTConfig
    from harness.train_config import MODEL_KEYS
    vocab = load_meta(data_dir(run.cfg['dataset']))['vocab_size']
    with torch.device('meta'):
        model = GPT(GPTConfig(**{k: run.cfg[k] for k in MODEL_KEYS} | {'vocab_size': vocab}))
    c = run.cfg
    tokens = c['max_iters'] * tokens_per_iter(c)
    rate = H100_MFU * 989e12 / model.flops_per_token(c['block_size'])
    return tokens / rate * step_work(c) / tokens_per_iter(c) + RUN_OVERHEAD_S, tokens


CPU_ROW_OVERHEAD_S = 300   # a laptop row's compilation, evaluations and probes, analyze.py and eval_quant.py's passes


def describe(runs, scale: Scale, jobs=1):
    """The data, tokens per run and (for scales that say) the expected wall time, printed first: on one H100, or on
    the CPU at the scale's measured speed (eager attention weighed by Scale.eager_cost), `jobs` rows at a time."""
    data = dict.fromkeys(r.cfg['dataset'] for r in runs)
    lines = [f"data: {', '.join(data_dir(d) for d in data)}"]
    todo = [r for r in runs if status(r, scale) == 'todo']
    if scale.cpu_tokens_per_s:
        trained = {r.name: trained_iters(r) for r in todo}   # one read of each row's log
        left = {r.name: max(0, r.cfg['max_iters'] - trained[r.name]) * tokens_per_iter(r.cfg) for r in todo}
        secs = sum(work_left(r.cfg, trained[r.name], scale.eager_cost) / scale.cpu_tokens_per_s + CPU_ROW_OVERHEAD_S
                   for r in todo)
        eager = ('measured at the same speed' if scale.eager_cost == 1 else
                 f'assumed at 1/{scale.eager_cost:g} of that')
        lines.append(f"expected wall time: ~{duration(secs / max(1, min(jobs, len(todo) or 1)))} for the {len(todo)} "
                     f"run(s) to do, {jobs} at a time ({sum(left.values()) / 1e6:,.1f} M tokens at "
                     f"{scale.cpu_tokens_per_s:,.0f} tokens/s a row as measured on a 2-core Xeon without bf16 units, "
                     f"eager attention {eager}; +{CPU_ROW_OVERHEAD_S} s a row)")
    if not scale.expected:
        return lines
    try:
        est = {r.name: expected_seconds(r) for r in runs}
    except (ValueError, OSError) as e:   # data not prepared yet: no vocabulary size
        return lines + [f"expected time: unknown until the data is prepared ({e})"]
    lines += [f"  {r.name}: {est[r.name][1] / 1e6:,.0f} M tokens, ~{duration(est[r.name][0])}" for r in runs]
    lines.append(f"expected wall time on one H100: ~{duration(sum(est[r.name][0] for r in todo))} for the "
                 f"{len(todo)} runs to do (estimate: {H100_MFU:.0%} MFU as measured on an H100, eager attention "
                 f"at half that, +{RUN_OVERHEAD_S} s per run)")
    return lines


def block_params(cfg):
    """The transformer blocks' parameters of a config, 12 L d^2 (attention 4 d^2, MLP 8 d^2), without embeddings."""
    return 12 * cfg['n_layer'] * cfg['n_embd'] ** 2


CPU_FLOPS = 100e9   # more than a laptop's cores sustain in training, so a time from it is a lower bound
CPU_HOUR = 3600     # the paper and gpu scales refuse to start rows whose lower bound on a CPU is more than this


def vocab_size(dataset):
    """The vocabulary of a run's data: its meta.json's once prepared, else 257 for a bytes dataset (by name: the
    pinned corpus's *_bytes), else GPT-2's 50,257."""
    try:
        return int(load_meta(data_dir(dataset))['vocab_size'])
    except (ValueError, OSError):   # not prepared yet (or unreadable: ensure_data says so later)
        return 257 if str(dataset).endswith('_bytes') else 50257


def cpu_bound(run):
    """(tokens, seconds at least) of a run on a CPU: 6 FLOPs per parameter and token at CPU_FLOPS, parameters
    counted as 12 L d^2 for the blocks plus the embedding of the data's vocabulary (vocab_size)."""
    c = run.cfg
    tokens = c['max_iters'] * tokens_per_iter(c)
    params = block_params(c) + vocab_size(c.get('dataset', '')) * c['n_embd']
    return tokens, 6 * params * tokens / CPU_FLOPS


def span(seconds):
    """duration() for the long times of a refusal: years or days where hours would be unreadable."""
    days = seconds / 86400
    return f"{days / 365.25:,.0f} years" if days >= 730 else f"{days:,.0f} days" if days >= 2 else duration(seconds)


# ----------------------------------------------------------------------------- running
def status(run, scale: Scale):
    """'done' when every result the run's rows need exists for this training config, 'todo' when some is
    missing; SweepError when the folder holds a run of another config."""
    d = run.cfg['out_dir']
    saved_path = os.path.join(d, 'reproduce.json')
    if os.path.isfile(saved_path):
        with open(saved_path) as f:
            saved = saved_identity(json.load(f).get('identity') or {})
        if saved != run.identity:
            changed = sorted(k for k in set(saved) | set(run.identity) if saved.get(k) != run.identity.get(k))
            raise SweepError(f"{d} holds a run of another config (differs in {', '.join(changed)}): delete it or "
                             f"pass another --out")
    return 'todo' if to_measure(run, scale) else 'done'


def data_val_sha256(run):
    """The sha256 of the val split the run's data holds now (meta.json's), or None when it is not prepared."""
    try:
        meta = load_meta(data_dir(run.cfg['dataset']))
    except (ValueError, OSError):
        return None
    return ((meta.get('splits') or {}).get('val') or {}).get('sha256')


def to_measure(run, scale: Scale, say=False):
    """{step: why} of the measurements ('analyze', 'quant') a run still needs: a result file that is missing or
    unreadable, a quant.json without one of the scale's schemes (or, at a scale that names them, without the
    inputs' residual-reader summary), or a measurement of a val split whose sha256 is not
    the data's now (the data was prepared again: the row is measured again, and say=True prints why)."""
    d, now, out = run.cfg['out_dir'], data_val_sha256(run), {}
    for step, name in (('analyze', 'analysis.json'), ('quant', 'quant.json')) if run.quant else (
            ('analyze', 'analysis.json'),):
        path = os.path.join(d, name)
        if not os.path.isfile(path):
            out[step] = 'missing'
            continue
        try:
            with open(path) as f:
                result = json.load(f)
            measured = result if step == 'analyze' else result['models'][0]
            sha = (measured.get('data') or {}).get('val_sha256')
            schemes = set(result.get('schemes') or ()) if step == 'quant' else set()
            inputs = (measured.get('inputs') or {}) if step == 'quant' else {}
        except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
            out[step] = f'{name} cannot be read'
            continue
        if now and sha and sha != now:
            out[step] = (f"{name} measured a val split of sha256 {sha[:12]}..., the data's is now {now[:12]}... "
                         f"(prepared again)")
        elif step == 'quant' and not set(scale.quant_schemes) <= schemes:
            out[step] = f"{name} lacks {', '.join(sorted(set(scale.quant_schemes) - schemes))}"
        elif step == 'quant' and scale.quant_schemes and 'residual' not in inputs:   # the bits table's ratio
            out[step] = f"{name} lacks the residual readers' max|x| / median|x| (measured before 2026-11-29)"
    if say:
        for step, why in out.items():
            if why != 'missing':
                print(f"{run.name}: {why}: {step} runs again", file=sys.stderr, flush=True)
    return out


def warn_stale(runs, scale: Scale):
    """--render: a line for each measurement rendered as it is though out of date (to_measure's reasons); a file
    that cannot be read is named by sweep_report.read_results (its cells are empty, not old)."""
    for run in runs:
        for step, why in to_measure(run, scale).items():
            if why != 'missing' and not why.endswith('cannot be read'):
                print(f"warning: {run.name}: {why}; its cells are the old measurement's: run the same command "
                      f"without --render to {step} it again", file=sys.stderr)


FSDP_FROM_PARAMS = 1e9   # --nproc > 1: rows with at least this many block parameters train with fsdp=True


def needs_fsdp(cfg, nproc):
    """Whether a row trains sharded (train.py --fsdp=True): on several GPUs, a model whose DDP copy per GPU (fp32
    weights, gradients, two moments: 16 bytes a parameter, plus activations) crowds a GPU, i.e. the 1.4B rows
    (docs/training.md, "Past one GPU's memory")."""
    return nproc > 1 and block_params(cfg) >= FSDP_FROM_PARAMS


def in_root(path):
    """A path as a row's commands name it: they run in ROOT, so a path under ROOT is given relative to it and no file
    a row writes (train.out, config.json, reproduce.json) names this machine's folders; a path elsewhere stays."""
    rel = os.path.relpath(os.path.abspath(path), ROOT)
    return path if rel == os.pardir or rel.startswith(os.pardir + os.sep) else rel


def commands(run, scale: Scale, nproc):
    d = in_root(run.cfg['out_dir'])
    launcher = [sys.executable] if nproc == 1 else [sys.executable, '-m', 'torch.distributed.run', '--standalone',
                                                    f'--nproc_per_node={nproc}']
    ckpt, data = os.path.join(d, 'ckpt.pt'), in_root(data_dir(run.cfg['dataset']))
    evaluation = ['--data', data, '--max_docs', str(scale.max_docs), '--batch_size', str(scale.batch_size)]
    if 'device' in scale.overrides:
        evaluation += ['--device', scale.overrides['device']]
    cmds = [('train', launcher + ['train.py', os.path.join('config', f'{run.config}.py'), *run.overrides,
                                  '--init_from=auto', *(['--fsdp=True'] if needs_fsdp(run.cfg, nproc) else [])]),
            ('analyze', [sys.executable, 'analyze.py', '--ckpt', ckpt, *evaluation,
                         '--json', os.path.join(d, 'analysis.json')])]
    if run.quant:
        schemes = ['--schemes', ','.join(scale.quant_schemes)] if scale.quant_schemes else []
        cmds.append(('quant', [sys.executable, 'eval_quant.py', '--ckpt', ckpt, *evaluation, *schemes,
                               '--json', os.path.join(d, 'quant.json')]))
    return cmds


@dataclass
class Chain:
    job_minutes: float = 0.0       # train.py's max_minutes per job (0: one job trains the whole row)
    max_jobs: int = 0              # training jobs this invocation may start per row (0: as many as it takes)


def execute(run, scale, nproc, env, echo, chain=Chain()):
    """Train, analyze and quantise one run; its output goes to <run>/train.out, and to the console if echo
    (else the latest training progress line once a minute). Training is a chain of jobs (train.py
    --init_from=auto, each stopping at chain.job_minutes with a checkpoint) until log.jsonl shows the final
    evaluation. Returns 'done', or 'unfinished' when chain.max_jobs jobs ran and the row is not finished yet."""
    d = run.cfg['out_dir']
    os.makedirs(d, exist_ok=True)
    write_json(os.path.join(d, 'reproduce.json'), {'config': run.config, 'overrides': run.overrides,
                                                   'identity': run.identity})
    cmds = commands(run, scale, nproc)
    train_cmd = cmds[0][1] + ([f'--max_minutes={chain.job_minutes:g}'] if chain.job_minutes else [])
    jobs = 0
    while run_state(d, run.cfg['max_iters'])['state'] != 'finished':
        if chain.max_jobs and jobs >= chain.max_jobs:
            return 'unfinished'
        before = run_state(d, run.cfg['max_iters'])['iter']
        _subprocess(run, 'train', train_cmd, env, echo)
        jobs += 1
        after = run_state(d, run.cfg['max_iters'])
        if after['state'] == 'diverged' or (after['state'] != 'finished' and after['iter'] <= before):
            raise SweepError(f"{run.name}: train stopped at iteration {after['iter']} without progress; see "
                             f"{os.path.join(d, 'train.out')}")
    needed = to_measure(run, scale, say=True)
    for step, cmd in cmds[1:]:
        if step in needed:
            _subprocess(run, step, cmd, env, echo)
    return 'done'


_SAY = threading.Lock()


def say(line):
    """One line to stderr in one write: rows print from their threads side by side, and print() writes a line and its
    newline apart, so two rows' [start] lines could share one line of the log."""
    with _SAY:
        sys.stderr.write(line + '\n')
        sys.stderr.flush()


def _subprocess(run, step, cmd, env, echo):
    """One command of a run, its output appended to train.out; a failure is a SweepError that quotes the command's
    own error line (e.g. train.py's refusal of a resume with changed data)."""
    path, last, error = os.path.join(run.cfg['out_dir'], 'train.out'), time.time(), ''
    with open(path, 'a') as log:
        log.write(f"$ {' '.join('python' if a == sys.executable else a for a in cmd)}\n")   # no path of this machine
        log.flush()
        proc = start_child(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
        for line in proc.stdout:
            log.write(line)
            log.flush()   # train.out can be followed (tail -f) as the row trains
            error = line.strip() if line.startswith('error:') or ': error: ' in line else error   # train.py's, a script's
            if echo:
                print(line, end='', flush=True)
            elif line.startswith('iter ') and time.time() - last >= 60:
                last = time.time()
                say(f"  {run.name}: {line.strip()}")
    stopped = proc.wait() != 0 and (stopped_by(proc.returncode) or stopping())   # torchrun exits 1 on a signal
    if stopped:   # not finished, not failed: no further job of the chain
        raise Interrupted(f"{run.name}: {step} stopped by {stopped.name} (exit {proc.returncode}); the same command "
                          f"continues it", stopped)
    if proc.returncode != 0:   # the same command runs the step again (a row resumes from its last checkpoint)
        raise SweepError(f"{run.name}: {step} failed (exit {proc.returncode}{': ' + error if error else ''}); "
                         f"see {path}; once that is fixed, the same reproduce.py command continues the row")


def run_all(runs, scale, nproc, jobs, chain=Chain()):
    todo = [r for r in runs if status(r, scale) == 'todo']
    start = {r.name: trained_iters(r) for r in todo}   # resumed rows: one read of each row's log
    todo.sort(key=lambda r: -work_left(r.cfg, start[r.name], scale.eager_cost))   # the most work first
    print(f"{len(runs)} runs, {len(runs) - len(todo)} done, {len(todo)} to do"
          + (f", {jobs} at a time" if jobs > 1 and todo else ''), file=sys.stderr)
    t0, lock, failures, finished = time.time(), threading.Lock(), [], []
    slots = list(range(jobs))

    def one(run):
        with lock:
            slot = slots.pop()
        env = dict(os.environ, PYTHONUNBUFFERED='1')     # progress lines reach train.out as they are printed
        if jobs > 1:
            if run.cfg['device'].startswith('cuda') or (run.cfg['device'] == 'auto' and _cuda()):
                env['CUDA_VISIBLE_DEVICES'] = ','.join(str(slot * nproc + i) for i in range(nproc))
            else:
                env['OMP_NUM_THREADS'] = str(max(1, (os.cpu_count() or 1) // jobs))
        try:
            t = time.time()
            say(f"[start] {run.name} -> {run.cfg['out_dir']}")
            if execute(run, scale, nproc, env, jobs == 1, chain) == 'unfinished':
                say(f"[unfinished] {run.name}: {chain.max_jobs} training job(s) of --job_minutes "
                    f"{chain.job_minutes:g} ran; the same command continues it")
                return
            with lock:
                finished.append(run)
                now = {r.name: r.cfg['max_iters'] if r in finished else trained_iters(r) for r in todo}
                eta = remaining_time(time.time() - t0, [(start[r.name] * w, r.cfg['max_iters'] * w, now[r.name] * w)
                                                        for r in todo for w in [step_work(r.cfg, scale.eager_cost)]])
                when = (duration(eta) if eta < float('inf') else
                        f"not known until {ETA_MIN_TRAINED:.0%} of the iterations are trained")
                measured = report.headline(run.cfg['out_dir'])
                say(f"[done {len(finished)}/{len(todo)}] {run.name} in {duration(time.time() - t)}"
                    f"{': ' + measured if measured else ''}; elapsed {duration(time.time() - t0)}, ETA {when}")
        except SweepError as e:
            with lock:
                failures.append(e)
            say(f"[{'stopped' if isinstance(e, Interrupted) else 'failed'}] {e}")
        finally:
            with lock:
                slots.append(slot)

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        list(pool.map(one, todo))
    return failures


def _cuda():
    import torch
    return torch.cuda.is_available()


# ----------------------------------------------------------------------------- command line
def print_commands(runs, scale, args):
    """--dry_run: which data is missing (nothing prepared), then each run's commands as they would run."""
    ensure_data(runs, dry_run=True)
    print(f"the commands run in the repository's folder (cd {ROOT}): their paths are relative to it", file=sys.stderr)
    for run in runs:
        state = status(run, scale)
        for step, cmd in commands(run, scale, args.nproc):
            cmd += [f'--max_minutes={args.job_minutes:g}'] if step == 'train' and args.job_minutes else []
            print(f"# {run.name} ({state}) {step}\n{' '.join(cmd)}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument('tables', nargs='+', choices=sorted(TABLES), metavar='TABLE',
                   help=f"one or more of {', '.join(sorted(TABLES))}")
    p.add_argument('--scale', default='paper', choices=sorted(SCALES),
                   help='paper (default), gpu (one H100, the sink recipe, a row per 15-minute session), laptop (two '
                   'CPU cores, about an hour a table), mini (CPU, minutes), smoke (tests)')
    p.add_argument('--rows', nargs='+', default=[], metavar='WORD', help='only rows whose config name contains a WORD '
                   '(a WORD that is a row\'s whole name, e.g. gpt2_60m_s1, selects that row alone)')
    p.add_argument('--nproc', type=number(int, 1), default=1, help='processes (GPUs) per training run, through torchrun')
    p.add_argument('--jobs', type=number(int, 1), default=1, help='runs at once (CUDA: each gets its own --nproc GPUs)')
    p.add_argument('--out', default=os.path.join('out', 'reproduce'), type=path_arg,
                   help='results root (default out/reproduce)')
    p.add_argument('--dataset', type=path_arg,
                   help='train and evaluate every row on this prepared folder (overrides the scale)')
    p.add_argument('--iters', type=number(int, 1), help="iterations per row (x the row's schedule factor) instead of the scale's")
    p.add_argument('--dry_run', action='store_true', help='print the commands of the runs to do; run nothing')
    p.add_argument('--render', action='store_true', help='render the tables from existing results; run nothing')
    p.add_argument('--job_minutes', type=number(float, 0), default=0.0, help="train a row as a chain of jobs, each stopping "
                   "after this many minutes of training with a checkpoint (train.py --max_minutes); 0 = one job")
    p.add_argument('--max_jobs', type=number(int, 0), default=0, help='training jobs per row in this invocation (0 = until '
                   'the row is finished); the same command continues an unfinished row exactly')
    p.add_argument('--pack', metavar='DIR', type=path_arg,
                   help="after rendering, pack each row's results and the tables' files into "
                   "DIR/<run>.tar.gz (<= 16 MiB each: recipe.pack_run)")
    p.add_argument('--goal', action='store_true', help="check the 60M vanilla and softmax-1 + OrthoAdam rows against "
                   "the goal of the scale (recipe.check_laptop_goal at --scale laptop, else recipe.check_goal); exit 1 "
                   "when it is not met")
    p.add_argument('--allow_cpu', action='store_true', help='start the paper or gpu scale on a machine without a CUDA '
                   'GPU (days of work; without this flag such a run shows its plan and stops)')
    args = p.parse_args(argv)   # the numbers are checked where they are parsed (fileio.number)
    ignored = [o for o, given in (('--render', args.render), ('--pack', args.pack), ('--goal', args.goal),
                                  ('--max_jobs', args.max_jobs)) if given]
    if args.dry_run and ignored:   # it runs and reads nothing: an option that would, refused rather than ignored
        p.error(f"--dry_run prints the commands and runs nothing: {' and '.join(ignored)} cannot be honoured; drop one")
    if any(not word.strip() for word in args.rows):
        p.error("--rows: an empty WORD would select every row (an unset shell variable?); give part of a config name")
    scale = SCALES[args.scale]
    if args.iters is not None:
        scale = replace(scale, iters=args.iters, description=f"{scale.description}; --iters {args.iters}")
    if args.dataset and (os.sep in args.dataset or os.path.isabs(args.dataset)):
        args.dataset = os.path.abspath(args.dataset)   # a path from here: the runs' subprocesses work in ROOT
    if not args.dataset and scale_dataset(scale):
        scale = replace(scale, overrides={**scale.overrides, 'dataset': scale_dataset(scale)})
    out = os.path.join(os.path.abspath(args.out), args.scale)
    t0 = time.time()
    try:
        try:   # the outputs, before any work (fileio.check_output): a folder for the results, one for the packs
            for path, option in ((args.out, '--out'), (out, '--out'), (args.pack, '--pack')):
                if path:
                    check_output(path, option, folder=True)
            if args.pack and os.path.commonpath([os.path.abspath(args.pack), out]) == out:
                raise ValueError(f"--pack {args.pack} is inside the results folder {out} (a row's folder would pack "
                                 f"its own packs); choose a folder outside it")
        except ValueError as e:
            raise SweepError(str(e)) from None
        if args.scale == 'laptop' and 'table5' in args.tables and 'spread' not in args.tables:
            args.tables.append('spread')   # Table 5's --goal reads the run-to-run spread of its seed replicas
            print("table5 at the laptop scale trains the spread table's seed replicas too", file=sys.stderr)
        args.tables = list(dict.fromkeys(args.tables))
        runs = plan(args.tables, scale, out, args.rows, args.dataset)
        print('\n'.join(describe(runs, scale, args.jobs)), file=sys.stderr, flush=True)
        if args.dry_run:
            return print_commands(runs, scale, args)
        failures = []
        todo = [r for r in runs if status(r, scale) == 'todo'] if args.scale in ('paper', 'gpu') else []
        est = {r.name: cpu_bound(r) for r in todo}   # rows sized for a CPU (the main job's) run at any scale
        if not args.render and sum(sec for _, sec in est.values()) > CPU_HOUR and not args.allow_cpu and not _cuda():
            print('\n'.join(f"  {name}: {tokens / 1e6:,.0f} M tokens, at least {span(sec)} on this CPU"
                             for name, (tokens, sec) in est.items()), file=sys.stderr)
            total = sum(sec for _, sec in est.values())
            raise SweepError(f"--scale {args.scale} trains {len(todo)} run(s) sized for GPUs, at least "
                             f"{span(total)} here (6 x params x tokens FLOPs at an optimistic {CPU_FLOPS / 1e9:g} "
                             f"GFLOP/s; the plan above); this machine has no CUDA GPU: use --scale mini (the CPU "
                             f"miniature, minutes), --dry_run to see the commands, or --allow_cpu to start anyway")
        if not args.render:
            ensure_data(runs)
            failures = run_all(runs, scale, args.nproc, args.jobs, Chain(args.job_minutes, args.max_jobs))
        else:
            warn_stale(runs, scale)
        figures, found = [], report.found_results(runs)   # each row's results read once, for every table and goal
        for name in args.tables:
            md, doc = report.render(name, runs, args.scale, scale, out, found)
            os.makedirs(out, exist_ok=True)
            with atomic_write(os.path.join(out, f'{name}.md')) as f:
                f.write(md + '\n')
            write_json(os.path.join(out, f'{name}.json'), doc, indent=1)
            drawn = [report.draw_trajectories(name, runs, out)]
            drawn += [report.draw_bits(name, runs, out, args.scale, found)] if name in scale.quant_tables else []
            drawn += [report.draw_bb_dynamics(name, runs, out)] if name in ('bb', 'bb_pilots') else []
            drawn += [report.draw_claims(runs, out, found)] if name == 'table5' else []
            drawn += [report.draw_effects(name, runs, out, found)] if name == 'mitigations' else []
            figures += [p for p in drawn if p]
            print(md + '\n')
            if name == 'main' and (line := report.main_summary(runs)):   # the main job's point, in one sentence
                print(f"{line}\nfigure: {os.path.relpath(drawn[0]) if drawn[0] else 'none yet'} (the first "
                      f"token's kurtosis, largest activation and attention, both runs over training)\n")
        print(f"wrote {', '.join([os.path.join(out, n) + '.{md,json}' for n in args.tables] + figures)} "
              f"in {duration(time.time() - t0)}", file=sys.stderr)
        files = [os.path.join(out, f'{n}.{ext}') for n in args.tables for ext in ('md', 'json')] + figures
        unpacked = pack_runs({r.name: r.cfg['out_dir'] for r in runs}, args.pack, files) if args.pack else []
        met = report.goal(runs, args.scale, args.tables, found) if args.goal else True
        for e in failures:   # a job a signal stopped: exit as train.py did, 128 + its number
            if isinstance(e, Interrupted):
                print(f"reproduce.py: {e}", file=sys.stderr)
                sys.exit(128 + e.signum)
        if failures:
            sys.exit(f"reproduce.py: error: {len(failures)} run(s) failed: " + '; '.join(map(str, failures)))
        if unpacked:   # a script or a GPU job must not read success when a pack is missing
            sys.exit(f"reproduce.py: error: {len(unpacked)} of {len(runs)} row(s) not packed: " + '; '.join(unpacked))
        if not met:
            sys.exit(f"reproduce.py: the {'laptop' if args.scale == 'laptop' else 'sink'} goal is not met (the lines "
                     f"above say which part)")
    except SweepError as e:
        sys.exit(f'reproduce.py: error: {e}')


if __name__ == '__main__':
    run_script(main, note='the same command continues')   # a signal reaches train.py through it: its checkpoint
