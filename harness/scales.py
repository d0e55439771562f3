"""The scales reproduce.py runs a table at: how each one turns a row's config file into the run it trains (Scale,
SCALES, scaled_overrides). `paper` runs the config files as written; `gpu` and `laptop` train chosen rows at a size
that fits one machine (recipe.gpu_rows, recipe.laptop_rows); `mini` and `smoke` shrink every row the same way."""
from dataclasses import dataclass, field

from harness.recipe import PILOT_KEYS, gpu_rows, laptop_rows


# one laptop row's training speed, fp32 compiled on one thread with another row beside it (2026-11-29, the 2-core Ice
# Lake Xeon without bf16 units; alone 4,750): what the laptop scale's expected wall time is computed from
LAPTOP_TOKENS_PER_S = 4_200
# a laptop step of eager attention costs about what a fused one does, as measured (2026-11-29, each beside another
# row: clipped 4,490, sigmoid 4,397, softpick 3,875 tokens/s against the fused rows' 4,200-4,700)
LAPTOP_EAGER_COST = 1.0
# the laptop and gpu scales' quantisation: Table 3's four schemes and the per-tensor ones at 4 to 7 bits (coarse =
# coarse8), for the bits table and figure (a few seconds a row on a GPU)
BITS_SCHEMES = ('coarse', 'moderate', 'fine', 'zeropoint4') + tuple(
    f'{family}{bits}' for family in ('coarse', 'moderate') for bits in (4, 5, 6, 7))


@dataclass
class Scale:
    description: str
    depth: float = 1.0
    width: float = 1.0
    seq: float = 1.0
    iters: int | None = None       # None: the config's max_iters and warmup_iters
    warmup: float = 0.05           # warmup_iters as a fraction of iters (the same for every row)
    overrides: dict = field(default_factory=dict)
    max_docs: int = 100_000        # validation documents for analyze.py and eval_quant.py
    batch_size: int = 8            # their batch size
    row_overrides: object = None   # (table, resolved row config) -> extra overrides, or None: not run at this scale
    datasets: tuple = ()           # the first of these that is prepared replaces overrides['dataset']
    expected: bool = False         # print the expected wall time on one H100 before running
    row_steps: bool = True         # row_overrides' max_iters x the row's schedule factor (laptop: its own factor)
    quant_tables: tuple = ()       # tables whose every row is quantised at this scale (else: those with quant columns)
    quant_schemes: tuple = ()      # eval_quant.py's schemes at this scale (empty: its default, Table 3's four)
    cpu_tokens_per_s: float = 0    # a CPU row's measured training speed: the wall time is estimated at the start
    eager_cost: float = 2.0        # a step of eager attention (attention.EAGER) against a fused one: the ETAs' weight


SCALES = {
    'paper': Scale("the config files as written (Appendix A): C4, batch 512, the paper's step counts"),
    'mini': Scale(
        "CPU miniature: the Bigram-Backcopy task (data/bigram_backcopy), layers and heads / 6 (head size 64), "
        "sequence length / 4, 3000 iterations of 32 sequences per row (SGD rows 8x), 5% warmup",
        depth=1 / 6, width=1 / 6, seq=1 / 4, iters=3000, warmup=0.05,
        overrides=dict(dataset='bigram_backcopy', windows='document', batch_size=32, gradient_accumulation_steps=1,
                       compile=False, eval_tokens=32_768, device='cpu'),
        max_docs=200, batch_size=50),
    'gpu': Scale(
        "one H100 session per row (15 device minutes, two jobs of <= 10): the sink recipe on every row "
        "(windows start at documents, an end-of-text token at position 0; weight decay 0.5 on matrices with "
        "AdamW, OrthoAdam and Muon; each row's own learning rate; harness/recipe.py, docs/reproducing.md); the rows of up "
        "to 130M parameters at their own shapes "
        "(Tables 2, 3 and 6; the 350M and 1.4B rows are left out), Table 5 and the mitigations at the 60M shape "
        "(10 layers, 8 heads of 64); 32,768 tokens per step (128 x 256, Table 6: 64 x 512 and 32 x 1024); 10,000 "
        "steps at 60M (0.33 B tokens), 4,000 at 130M (0.13 B), 3,000 for Table 5 and the mitigations (0.10 B; SGD "
        "rows 8x), 3,000 for the pilots (0.10 B); 6% warmup; C4 when data/c4 is prepared, else the pinned corpus's "
        "archive subset (data/pinned_archive, NOT C4); every quantised row (all of Tables 2 and 3's) with Table 3's "
        "schemes and per-tensor absmax at 4 to 8 bits",
        row_overrides=gpu_rows, datasets=('c4', 'pinned_archive'), expected=True,
        quant_tables=('table2', 'table3'), quant_schemes=BITS_SCHEMES,
        overrides=dict(dataset='pinned_archive', gradient_accumulation_steps=1, eval_tokens=131_072, compile=True),
        max_docs=300, batch_size=8),
    'laptop': Scale(
        "two CPU cores, about an hour a row (fp32, one thread a row), two rows at a time with --jobs 2: Table 2's "
        "60M GPT-2 rows (and Table 3's quantisation of them), Table 5's rows and the mitigations at the setting of "
        "config/laptop/base.py (the pilots chose it: bytes of the pinned corpus's laptop subset, 4 x 256, 4,000 "
        "steps of 16 x 256, fp32 compiled; docs/reproducing.md), each row its own attention, normalisation, "
        "positions, biases and optimiser (RMSProp and SGD without weight decay; SGD 2x the steps at the LR its "
        "pilot chose); Guo et al.'s Bigram-Backcopy table, the laptop pilots and the seed replicas as their "
        "configs are written (config/bb/, config/laptop/)",
        row_overrides=laptop_rows, max_docs=200, batch_size=1, row_steps=False,
        quant_tables=('table2', 'table3', 'table5', 'mitigations', 'spread'), quant_schemes=BITS_SCHEMES,
        cpu_tokens_per_s=LAPTOP_TOKENS_PER_S, eager_cost=LAPTOP_EAGER_COST),
    'smoke': Scale(
        "seconds, for the tests: 1 layer, 1 head of 64, sequences of 16, 4 iterations",
        depth=0.01, width=0.01, seq=1 / 16, iters=4, warmup=0.25,
        overrides=dict(dataset='bigram_backcopy', batch_size=4, gradient_accumulation_steps=1, compile=False,
                       eval_tokens=256, device='cpu'),
        max_docs=8, batch_size=4),
}
def scaled_overrides(cfg, scale: Scale, steps: int, table=None):
    """--key=value items that shrink one row's resolved config `cfg` to `scale` (nothing for paper); None when
    the scale leaves the row out."""
    out = dict(scale.overrides)
    if scale.row_overrides is not None:
        extra = scale.row_overrides(table, cfg)
        if extra is None:
            return None
        out.update(extra, **({'max_iters': extra['max_iters'] * steps} if 'max_iters' in extra and scale.row_steps
                             else {}))
    if scale.depth != 1 or scale.width != 1:
        head = cfg['n_embd'] // cfg['n_head']
        n_head = max(1, round(cfg['n_head'] * scale.width))
        out.update(n_layer=max(1, round(cfg['n_layer'] * scale.depth)), n_head=n_head, n_embd=n_head * head)
    if scale.seq != 1:
        out['block_size'] = max(8, round(cfg['block_size'] * scale.seq))
    if table == 'pilots':   # a pilot's own windows and weight decay are what it measures
        out = {k: v for k, v in out.items() if k not in PILOT_KEYS}
    if scale.iters is not None:
        iters = scale.iters * steps
        out.update(max_iters=iters, warmup_iters=round(scale.iters * scale.warmup), lr_decay_iters=0,   # 21 evaluations:
                   eval_interval=max(1, iters // 20), log_interval=max(1, iters // 10))   # points of the trajectories
    return [f'--{k}={v!r}' if isinstance(v, str) else f'--{k}={v}' for k, v in out.items()]


