"""The sink recipe of `reproduce.py --scale gpu` as data, and what a row of it needs around training:
its knobs with their evidence (RECIPE, docs/reproducing.md says the same at length), a row's overrides at that scale
(gpu_rows), the state of a row's run from
its log.jsonl (finished, stopped at a job's time budget or by a signal, diverged) and a job's exit code
(stopped_by: a signal's 128 + N), one tarball of a row's results (pack_run), and
the check whether the vanilla and softmax-1 + OrthoAdam rows meet the sink goal (check_goal: a vanilla row with a
sink and outliers, a softmax-1 + OrthoAdam row without them at the same perplexity).

    python reproduce.py table2 --scale gpu --rows gpt2_60m_vanilla --job_minutes 6 --pack out/pack
    python reproduce.py table2 --scale gpu --rows gpt2_60m --render --goal
"""
import functools
import io
import json
import math
import os
import signal
import sys
import tarfile

from harness.fileio import atomic_write, disk_full, disk_full_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Every knob: (config key, value, evidence). sink-recipe.md (the science notes) holds the sources; G = Gu et al.,
# ICLR 2025 (60M LLaMA, share of heads whose first-token mass > 0.3), B = Bondarenko et al., NeurIPS 2023.
RECIPE = (
    ('windows', 'document', "a fixed first token in every window: G Table 10, 74.1% vs 18.2% (random first token "
                            "27.0%); here the eot that precedes a document, so every window starts with it"),
    ('weight_decay', 0.5, "G Table 2: wd 0 -> 15.2%, 0.1 -> 18.2%, 0.5 -> 41.1%, 1.0 -> 37.7%, 2.0 -> 6.1%; on "
                          "matrices only (optimizers.configure_optimizer: >= 2-D parameters decay, norm gains and "
                          "biases do not; B: decaying LayerNorm gains cut OPT's max |x| from 340 to 88)"),
    ('learning_rate', None, "G Table 9: lr 8e-4 -> 32.2%, 4e-4 -> 18.2%, 1e-4 -> 2.9%; the row's own stays: the "
                            "paper's 1e-3 with cosine to 1e-4 (config/paper_common.py) is already at the top of that "
                            "range, and Table 5's SGD rows need their own"),
)
RECIPE_KEYS = tuple(k for k, _, _ in RECIPE)
# what the pilots vary themselves (config/pilots/): the scale leaves these keys as the pilot's config sets them
PILOT_KEYS = ('windows', 'weight_decay')
TOKENS_PER_STEP = 32_768   # 128 x 256 (Table 6: 64 x 512, 32 x 1024), as the H100 miniature of the README
# The GPU sessions this project gets hold one H100 for 15 minutes (the machine's start included), one command for
# at most 10, and nothing survives a session but files of <= 16 MiB: a row is trained, measured and packed in one
# session, as two jobs on the warm machine (docs/gpu-queue.md, tools/gpu_queue.py). The H100 trained the 60M rows at
# 0.71-0.84 M tokens/s (../shared/gpu-reports/2026-11-23-h100.md), so 10,000 steps (0.33 B tokens) take 6.5-7.7
# minutes; a pilot's 3,000 steps (0.10 B) about 2.
STEPS = {'60m': 10_000, '130m': 4_000, 'shaped': 3_000, 'pilot': 3_000}
PACK_LIMIT = 16 * 2 ** 20   # bytes: what one file back from the device machine may hold
PACK_FILES = ('analysis.json', 'quant.json', 'log.jsonl', 'reproduce.json', 'config.json', 'train.out')


def recipe_overrides(table, cfg):
    """The recipe's config keys for a row of `table` whose resolved config is `cfg` (None values: the row's own;
    the pilots keep the keys they vary). Weight decay only with an optimizer whose decay is decoupled
    (optimizers.DECOUPLED_WEIGHT_DECAY), where wd 0.5 means what Gu et al. measured; RMSProp's and SGD's is torch's
    coupled L2 term, which at their learning rates would be another experiment: those rows keep 0."""
    from harness.optimizers import DECOUPLED_WEIGHT_DECAY   # imports torch: only when planning, as train_config does
    return {k: v for k, v, _ in RECIPE if v is not None and not (table == 'pilots' and k in PILOT_KEYS)
            and not (k == 'weight_decay' and cfg['optimizer'] not in DECOUPLED_WEIGHT_DECAY)}


GPU_SHAPE = dict(n_layer=10, n_head=8, n_embd=512)   # config/gpt2_60m.py
PROBE_DOCS = 32   # documents of each probe at the gpu scale (the pilots' configs say the same)


def gpu_rows(table, cfg):
    """The gpu scale of one row (reproduce.py's SCALES['gpu']): None for rows it leaves out, else its overrides: the
    sink recipe (RECIPE: document windows, weight decay with a decoupled optimizer) and the row's steps (STEPS) of
    TOKENS_PER_STEP tokens, each row at its own context."""
    shaped = table in ('table5', 'mitigations')
    if not shaped and cfg['n_embd'] > 768:
        return None                                        # 350M and 1.4B rows
    iters = STEPS['pilot' if table == 'pilots' else 'shaped' if shaped else '60m' if cfg['n_embd'] <= 512 else '130m']
    out = dict(GPU_SHAPE) if shaped else {}
    probes = 25 if table == 'pilots' else 40     # the trajectory: a probe every 120 (pilots) or 250 (60M) steps
    # two evaluations and the last: each writes ckpt.pt and best.pt (1.4 GB at 60M), which a GPU session cannot keep
    out.update(recipe_overrides(table, cfg), batch_size=TOKENS_PER_STEP // cfg['block_size'], max_iters=iters,
               warmup_iters=round(0.06 * iters), lr_decay_iters=0, eval_interval=iters // 2,
               probe_interval=iters // probes, probe_docs=PROBE_DOCS, log_interval=max(1, iters // 100))
    return out


# ----------------------------------------------------------------------------- a row's state
def run_state(run_dir, max_iters):
    """What log.jsonl says of a row's training: {'state': 'finished' | 'stopped' | 'diverged' | 'started' | 'none',
    'iter': the last iteration logged, and for 'diverged' the event}. 'finished' = an evaluation at max_iters."""
    path = os.path.join(run_dir, 'log.jsonl')
    if not os.path.isfile(path):
        return {'state': 'none', 'iter': 0}
    last, state = {}, {'state': 'started', 'iter': 0}
    with open(path, errors='replace') as f:   # damaged bytes: a line that does not parse, skipped
        for line in f:
            try:
                e = json.loads(line)
            except ValueError:   # a line cut by a kill: the next job rewrites what it meant
                continue
            if not isinstance(e, dict) or 'iter' not in e:
                continue
            last = e
            state['iter'] = max(state['iter'], e['iter'])
            if e.get('event') == 'diverged':
                state = {'state': 'diverged', 'iter': e['iter'], 'event': e}
            elif e.get('event') == 'eval' and e['iter'] >= max_iters:
                state = {'state': 'finished', 'iter': e['iter']}
    if state['state'] == 'started' and last.get('event') == 'stopped':
        state['state'] = 'stopped'
    return state


ETA_MIN_TRAINED = 0.05   # the share of a sweep's iterations trained before its ETA is estimated


def remaining_time(elapsed, progress):
    """The ETA of a sweep from the iterations trained so far, in flight included (a row half done beside a
    finished one counts its half): progress = [(iteration at the sweep's start, max_iters, iteration now)] per row
    to do; elapsed seconds × iterations left / iterations trained in them. Rows weigh by their iterations, and a
    resumed row by what it has left. Under ETA_MIN_TRAINED of the iterations trained, no estimate (inf): the rate
    of the first minutes is mostly compilation and the rows that only measure, and it said 61 h for a 16 h sweep."""
    trained = sum(max(0, now - begin) for begin, _, now in progress)
    left = sum(max(0, end - max(begin, now)) for begin, end, now in progress)
    if not left:
        return 0.0   # nothing left: no '?'
    return elapsed * left / trained if trained and trained >= ETA_MIN_TRAINED * (trained + left) else float('inf')


def tokens_per_iter(cfg):
    """Tokens one optimiser step of a config trains: batch x accumulation x block."""
    return cfg['batch_size'] * cfg['gradient_accumulation_steps'] * cfg['block_size']


def trained_iters(run):
    """The steps a row has trained so far (0 before its first checkpoint, its max_iters once finished): read once per
    row by a sweep, for its order, its ETA and the tokens it has left."""
    return run_state(run.cfg['out_dir'], run.cfg['max_iters'])['iter']


def step_work(cfg, eager_cost=2.0):
    """The work of one training step, in tokens at the speed of fused attention: tokens_per_iter, times eager_cost for
    eager attention (attention.EAGER: the T x T matrix; about half the speed on a GPU, the same at the laptop scale's
    T = 256 on a CPU: Scale.eager_cost). The unit of the ETAs and of the order of a sweep's rows."""
    from attention import EAGER
    return tokens_per_iter(cfg) * (eager_cost if cfg['attn'] in EAGER else 1)


def work_left(cfg, trained, eager_cost=2.0):
    """A row's training still to do (step_work units) after `trained` steps: the order of a sweep's rows, the most
    work first, so that the rows still training at the end are short ones."""
    return max(0, cfg['max_iters'] - trained) * step_work(cfg, eager_cost)


def stopped_by(returncode):
    """The signal that stopped a command, from its exit code, or None: train.py exits 128 + the signal's number after
    writing its checkpoint (130 for SIGINT, 143 for SIGTERM, as a shell reports a process a signal ended), and
    subprocess reports a process a signal killed outright as minus its number. Such a job is not finished: the same
    command continues it."""
    number = -returncode if returncode is not None and returncode < 0 else (
        returncode - 128 if returncode is not None and 128 < returncode < 128 + signal.NSIG else None)
    try:
        return signal.Signals(number) if number else None
    except ValueError:
        return None


# ----------------------------------------------------------------------------- packing
def pack_run(run_dir, dest, extra=(), limit=PACK_LIMIT):
    """<dest>: one .tar.gz of a row's results (PACK_FILES that exist, every .png of the folder, and `extra` paths),
    named inside as <row>/<file>. Written to a temporary file and renamed: an existing dest is replaced only by a
    complete pack. ValueError (one line) when nothing is there to pack, the pack exceeds `limit` bytes, or the
    disk is full; the run folder is never changed. Returns (dest, size, names)."""
    row = os.path.basename(os.path.normpath(run_dir))
    files = [os.path.join(run_dir, f) for f in PACK_FILES if os.path.isfile(os.path.join(run_dir, f))]
    files += sorted(os.path.join(run_dir, f) for f in os.listdir(run_dir) if f.endswith('.png')) if os.path.isdir(
        run_dir) else []
    files += [p for p in extra if os.path.isfile(p)]
    if not any(os.path.basename(p) in ('analysis.json', 'log.jsonl') for p in files):
        raise ValueError(f"{run_dir} holds no analysis.json or log.jsonl to pack: train the row first")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode='w:gz') as tar:
        for p in files:
            tar.add(p, arcname=f'{row}/{os.path.basename(p)}')
    data = buf.getvalue()
    if len(data) > limit:
        big = max(files, key=os.path.getsize)
        raise ValueError(f"the pack of {run_dir} would be {len(data) / 2 ** 20:.1f} MiB > {limit / 2 ** 20:.0f} MiB "
                         f"(largest file {big}, {os.path.getsize(big) / 2 ** 20:.1f} MiB): log less often "
                         f"(--log_interval) or leave it out")
    try:   # a new temporary name (fileio.atomic_write): two packs of one row at once do not collide
        os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
        with atomic_write(dest, 'wb') as f:
            f.write(data)
    except OSError as e:
        if disk_full(e):
            raise ValueError(disk_full_text(dest)) from None
        raise ValueError(f"cannot write {dest} ({e.strerror}); choose another --pack folder") from None
    return dest, len(data), [f'{row}/{os.path.basename(p)}' for p in files]


def pack_runs(run_dirs, folder, extra=()):
    """<folder>/<name>.tar.gz of every run of {name: run folder} (pack_run, with the `extra` files), a line each on
    stderr. Returns why each run that was not packed was not (empty: all were)."""
    missing = []
    for name, run_dir in run_dirs.items():
        try:
            dest, size, names = pack_run(run_dir, os.path.join(folder, f'{name}.tar.gz'), extra)
            print(f"packed {dest}: {size / 2 ** 20:.2f} MiB, {len(names)} files", file=sys.stderr)
        except ValueError as e:
            print(f"not packed: {e}", file=sys.stderr)
            missing.append(str(e))
    return missing


# ----------------------------------------------------------------------------- the laptop scale
LAPTOP_BASE, LAPTOP_OF = 'laptop/base', 'table2/gpt2_60m_vanilla'   # config/<...>.py
LAPTOP_AS_WRITTEN = ('main', 'bb', 'bb_pilots', 'laptop_pilots', 'spread')   # tables whose configs are laptop-sized already


@functools.lru_cache(maxsize=1)
def laptop_setting():
    """The laptop scale as overrides: config/laptop/base.py's differences from Table 2's vanilla 60M row (its out_dir
    aside), resolved as train.py resolves them."""
    from configurator import load_config
    from harness.train_config import CHOICES, DEFAULTS, RANGES   # imports torch: only when planning
    base, of = (load_config(DEFAULTS, [os.path.join(ROOT, 'config', f'{c}.py')], CHOICES, RANGES)
                for c in (LAPTOP_BASE, LAPTOP_OF))
    return {k: v for k, v in base.items() if v != of[k] and k != 'out_dir'}


# Table 5's SGD rows at the laptop scale (the paper trains them 8x longer at LR 0.2 with momentum and without): this
# many times the base's steps, at the LR the SGD pilot chose for each momentum (config/laptop/pilots/sgd.py,
# docs/reproducing.md, "Table 5, the mitigations and where quantisation breaks"); a momentum not in it: not chosen yet,
# its row is left out. Momentum 0.9: 0.02 (2.6105 at step 400; 0.01 2.6156, 0.05 2.6166). Momentum 0: 0.05
# (2.6837; 0.02 2.7425, 0.1 2.6943)
LAPTOP_SGD_STEPS, LAPTOP_SGD_LR = 2, {0.9: 0.02, 0.0: 0.05}


def laptop_rows(table, cfg):
    """The laptop scale of one row (SCALES['laptop']): the configs of the Bigram-Backcopy table, the laptop pilots and
    the seed replicas as written; the 60M GPT-2 rows of Tables 2 and 3, and every row of Table 5 and the mitigations,
    with laptop_setting() (data, size, steps, schedule, fp32), each keeping its own attention, normalisation,
    position encoding, biases and optimiser. The optimisers whose weight decay is torch's coupled L2 term (RMSProp,
    SGD) train without it, as at the gpu scale (recipe_overrides); the SGD rows train LAPTOP_SGD_STEPS times longer at
    LAPTOP_SGD_LR (cosine to a tenth of it). Every other row is left out (None)."""
    from harness.optimizers import DECOUPLED_WEIGHT_DECAY   # imports torch: only when planning
    if table in LAPTOP_AS_WRITTEN:
        return {}
    if table in ('table2', 'table3') and not (cfg['n_embd'] == 512 and cfg['n_layer'] == 10):   # GPT-2 60M's shape
        return None
    if table not in ('table2', 'table3', 'table5', 'mitigations'):
        return None
    out = dict(laptop_setting())
    if cfg['optimizer'] not in DECOUPLED_WEIGHT_DECAY:
        out['weight_decay'] = 0.0
    if cfg['optimizer'] == 'sgd':
        lr = (LAPTOP_SGD_LR or {}).get(cfg['momentum'])
        if lr is None:
            return None
        out.update(max_iters=out['max_iters'] * LAPTOP_SGD_STEPS, learning_rate=lr, min_lr=lr / 10)
    return out


# ----------------------------------------------------------------------------- the sink goal (issue 27)
GOAL_RATIO = 5.0      # vanilla's quantisation penalty at least this many times softmax-1 + OrthoAdam's
GOAL_FLOOR = 0.01     # PPL: a penalty below this counts as this much (a ratio to ~0 means nothing)


def _get(d, *keys):
    """d[keys[0]][keys[1]]... when it is a finite number, else None (missing: a hand-edited or truncated file says
    nothing)."""
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return d if isinstance(d, (int, float)) and not isinstance(d, bool) and math.isfinite(d) else None


def _crit(name, value, test):
    """One goal criterion: (name, value, ok), ok None where the value is missing."""
    return (name, value, None if value is None else bool(test(value)))


def check_goal(vanilla, s1oa, vanilla_quant=None, s1oa_quant=None):
    """Whether the vanilla and softmax-1 + OrthoAdam rows meet the sink goal. vanilla, s1oa: analyze.py --json
    results (ppl, kurtosis_first, kurtosis_rest, first_attn_argmax); *_quant: eval_quant.py's model entry (its
    'delta' per scheme), or None to leave the quantisation criteria out. Returns [(criterion, value, ok)] with ok
    None where a value is missing."""
    out = [_crit('vanilla first_attn_argmax >= 0.30', _get(vanilla, 'first_attn_argmax'), lambda v: v >= 0.30),
           _crit('vanilla E_m kurtosis first >= 50', _get(vanilla, 'kurtosis_first'), lambda v: v >= 50),
           _crit('s1+OA first_attn_argmax <= 0.05', _get(s1oa, 'first_attn_argmax'), lambda v: v <= 0.05)]
    k = [_get(s1oa, 'kurtosis_first'), _get(s1oa, 'kurtosis_rest')]
    out.append(_crit('s1+OA E_m kurtosis first and rest <= 5', None if None in k else max(k), lambda v: v <= 5))
    pv, ps = (p if p is not None and p >= 1 else None for p in (_get(vanilla, 'ppl'), _get(s1oa, 'ppl')))  # ppl >= 1
    out.append(_crit('s1+OA PPL within 2% of vanilla (ratio)', None if None in (pv, ps) else ps / pv,
                     lambda v: v <= 1.02))
    if vanilla_quant is not None or s1oa_quant is not None:
        for scheme in ('coarse', 'zeropoint4'):   # per-tensor absmax W8A8, and 4-bit zeropoint weights
            dv, ds = _get(vanilla_quant, 'delta', scheme), _get(s1oa_quant, 'delta', scheme)
            ratio = None if None in (dv, ds) else dv / max(ds, GOAL_FLOOR)
            out.append(_crit(f'{scheme} dPPL vanilla / s1+OA >= {GOAL_RATIO:g}', ratio, lambda v: v >= GOAL_RATIO))
    return out


def check_laptop_goal(vanilla, s1oa, vanilla_quant=None, s1oa_quant=None):
    """The goal of the laptop scale, as check_goal: what two CPU cores can reach on text (docs/reproducing.md,
    "Budgets"): vanilla's first token with outlier kurtosis, softmax-1 + OrthoAdam's without, at the same perplexity.
    A first-token sink on natural text has not been seen below about a billion tokens, nor a quantisation penalty
    without it: laptop_measures shows them, the goal does not require them. The quantisation arguments are unused
    (the signature is check_goal's)."""
    out = [_crit('vanilla E_m kurtosis first >= 20', _get(vanilla, 'kurtosis_first'), lambda v: v >= 20),
           _crit('s1+OA E_m kurtosis first <= 5', _get(s1oa, 'kurtosis_first'), lambda v: v <= 5)]
    pv, ps = (p if p is not None and p >= 1 else None for p in (_get(vanilla, 'ppl'), _get(s1oa, 'ppl')))
    out.append(_crit('s1+OA PPL within 2% of vanilla (ratio)', None if None in (pv, ps) else ps / pv,
                     lambda v: v <= 1.02))
    return out


def laptop_measures(vanilla, s1oa, vanilla_quant=None, s1oa_quant=None):
    """What the laptop goal shows without requiring it: [(name, vanilla's value, softmax-1 + OrthoAdam's)], None
    where not measured: first-token attention (argmax share and mass), the residual-state peak (max over layers),
    and the per-tensor W8A8 (coarse) and 4-bit penalties."""
    rows = [(f'{key} ({what})', _get(vanilla, key), _get(s1oa, key)) for key, what in (
        ('first_attn_argmax', 'share of rows whose largest weight is on the first token'),
        ('first_attn_mass', 'mean weight on the first token'), ('resid_peak', 'max over layers'))]
    rows += [(f'{scheme} dPPL', _get(vanilla_quant, 'delta', scheme), _get(s1oa_quant, 'delta', scheme))
             for scheme in ('coarse', 'zeropoint4')]
    return rows


def goal_text(results, name='sink goal'):
    """check_goal's (or check_laptop_goal's) result as lines, then one verdict line."""
    lines = [f"{'met' if ok else 'MISSING' if ok is None else 'not met'}: {name}"
             + ('' if value is None else f" ({value:.4g})") for name, value, ok in results]
    verdict = all(ok for _, _, ok in results)
    return lines + [f"{name}: {'met' if verdict else 'not met'}"], verdict
