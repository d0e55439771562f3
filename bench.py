"""Speed and memory of softmax-1 + OrthoAdam against vanilla softmax + AdamW, side by side in one process.

    python bench.py                          # CUDA: paper shapes (130M / 350M, T = 256 / 1024), compile + bf16
    python bench.py --quick                  # small shapes, under a minute on a laptop CPU (CI smoke run)
    python bench.py --sections attn,optim --json out/bench.json
    python bench.py --device cpu --compile   # CPU with torch.compile for the training step
    python bench.py --suite gpu --out out/gpu_suite    # everything a GPU must validate, one report (see gpu_suite)

Sections (CUDA timed with events):
  attn   attention forward+backward, (B, H, T, d=64): softmax SDPA; softmax-1 as the training path runs it
         (attention.attention: the fused kernel's output scaled by sigmoid of its log-sum-exp); softmax-1 through
         an extra zero key (attention.extra_key_attention, the route dropout takes); a naive eager softmax-1
         (attention.attention_probs @ v, the T x T matrix materialised);
  optim  one optimizer step with every gradient set, on the parameter shapes of GPT-2 130M and 350M
         on CUDA (CPU: 'small' and 130M, --quick: 'tiny' and 'small'; train.py's parameter groups): torch's
         fused AdamW (the baseline of every ratio; train.py's AdamW) and its foreach variant vs OrthoAdam
         with rotation 'hadamard' (axes 'residual', train.py's default, and 'all') and 'haar' where
         affordable; time and optimizer-state bytes (moments plus rotation factors);
  train  a full training step (CUDA: 130M and 350M at T = 256 and 1024; CPU: a small config):
         --grad_accum micro-batches (forward, backward) then grad clip and the optimizer, as train.py runs
         it; vanilla (softmax + AdamW) vs softmax-1 + OrthoAdam; tokens/s, MFU (train.py's PEAK_FLOPS,
         CUDA only), peak memory (CUDA: max allocated) or, on CPU, parameters + gradients + optimizer state.

Timing: the variants of one measurement are timed in turn, one call each per round, for --repeats rounds
after warm-up, so that a change of machine load hits all of them alike. A ratio is the median over rounds
of the per-round ratio; its spread is the interquartile range of those ratios over their median. A ratio
whose spread exceeds 10%, or any ratio of a CPU run started while the machine was busy (1-minute load
average above max(0.5, cores / 10)), is marked unreliable: printed with '?' and listed in 'unreliable'.

--json PATH writes {"device", "torch", "quick", "load_avg": [start, end], "cpu_count", "unreliable": [...],
 "attn_softmax1_over_softmax" (worst shape), "attn_extra_key_over_softmax" (worst shape),
 "optim_state_orthoadam_over_adamw", "optim_step_orthoadam_over_adamw" (hadamard/residual on the largest
 model measured), "train_step_s1oa_over_vanilla" (first train case, first --grad_accum),
 "train_step_s1oa_over_vanilla_by_accum" ({accum: ratio}, first train case), "attention": [...],
 "optimizer": [...], "train": [...], "elapsed_s"}: one row per measurement with min_s, median_s, spread and
its ratios (each with a *_spread); a ratio is null when its section did not run.
"""
import argparse
import contextlib
import os
import statistics
import sys
import time

import torch

from attention import attention, attention_probs, extra_key_attention
from model import GPT, GPTConfig
from orthoadam import OrthoAdam
from prepare_c4 import write_json
from train import DEFAULTS, configure_optimizer, peak_flops

SECTIONS = ('attn', 'optim', 'train')
GPT2 = {  # the paper's GPT-2 shapes (config/gpt2_130m.py, config/gpt2_350m.py) and small CPU stand-ins
    '130m': dict(n_layer=12, n_head=12, n_embd=768, vocab_size=50257),
    '350m': dict(n_layer=24, n_head=16, n_embd=1024, vocab_size=50257),
    'small': dict(n_layer=4, n_head=4, n_embd=256, vocab_size=8192),
    'tiny': dict(n_layer=2, n_head=4, n_embd=128, vocab_size=2048),
}
PAPER = dict(bias=False, norm='rmsnorm_single', pos_emb='absolute', mlp='gelu')
MAX_SPREAD = 0.10   # a ratio whose per-round values scatter more than this (IQR / median) is unreliable


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def sync(device):
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def measure(fns, device, repeats, warmup):
    """{name: seconds per call, one value per round}: every round calls each fn once, in turn, after
    `warmup` untimed rounds."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    sync(device)
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            if device.type == 'cuda':
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times[name].append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    return times


def spread(values):
    """Interquartile range over the median (0 for fewer than 4 values' worth of quartiles)."""
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4, method='inclusive')
    return (q3 - q1) / statistics.median(values)


def summary(times):
    return {'min_s': min(times), 'median_s': statistics.median(times), 'spread': spread(times)}


def paired_ratio(times, base):
    """Median and spread of the per-round ratios times[i] / base[i]."""
    ratios = [t / b for t, b in zip(times, base)]
    return statistics.median(ratios), spread(ratios)


def fmt_bytes(n):
    return 'n/a' if n is None else f"{n / 2**20:,.1f} MiB"


def fmt_ratio(r, s=None):
    if r is None:
        return 'n/a'
    return f"{r:.3f}x" + ('' if s is None else f" ±{100 * s:.0f}%" + ('?' if s > MAX_SPREAD else ''))


# ----------------------------------------------------------------------------- 1. attention
def bench_attention(device, dtype, shapes, repeats, warmup):
    rows = []
    for B, H, T, d in shapes:
        g = torch.Generator(device='cpu').manual_seed(0)
        x = torch.randn(B, T, 3 * H * d, generator=g).to(device, dtype).requires_grad_()   # as c_attn makes it
        dy = torch.randn(B, H, T, d, generator=g).to(device, dtype)
        cfgs = {a: GPTConfig(attn=a, n_head=H, n_embd=H * d, block_size=T) for a in ('softmax', 'softmax1')}

        def fwd_bwd(forward):
            def step():
                x.grad = None
                q, k, v = (t.view(B, T, H, d).transpose(1, 2) for t in x.split(H * d, dim=2))
                forward(q, k, v).backward(dy)
            return step

        variants = {
            'softmax_sdpa': fwd_bwd(lambda q, k, v: attention(q, k, v, cfgs['softmax'])),
            'softmax1': fwd_bwd(lambda q, k, v: attention(q, k, v, cfgs['softmax1'])),
            'softmax1_extra_key': fwd_bwd(extra_key_attention),
            'softmax1_eager': fwd_bwd(lambda q, k, v: attention_probs(q, k, cfgs['softmax1']).to(dtype) @ v),
        }
        log(f"attn B={B} H={H} T={T} d={d}: {', '.join(variants)}")
        times = measure(variants, device, repeats, warmup)
        row = {'shape': [B, H, T, d], 'dtype': str(dtype).removeprefix('torch.')}
        row.update({name: summary(t) for name, t in times.items()})
        for name, key in (('softmax1', 'softmax1_over_softmax'), ('softmax1_extra_key', 'extra_key_over_softmax'),
                          ('softmax1_eager', 'eager_over_softmax')):
            row[key], row[key + '_spread'] = paired_ratio(times[name], times['softmax_sdpa'])
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------- 2. optimizer step
def model_for_optimizer(size, device):
    """The GPT of that size with random weights and gradients (built on meta, then materialised)."""
    with torch.device('meta'):
        model = GPT(GPTConfig(**GPT2[size], **PAPER))
    model.to_empty(device=device)
    model.transformer.wte.weight = model.lm_head.weight   # to_empty unties the shared weight
    g = torch.Generator(device='cpu').manual_seed(0)
    for p in model.parameters():
        p.data.copy_(torch.randn(p.shape, generator=g) * 0.02)
        p.grad = torch.randn(p.shape, generator=g).to(device) * 1e-3
    return model


def optimizer_for(model, device, name, rotation='hadamard', axes='residual'):
    """train.py's optimizer and parameter groups; 'adamw' is torch's fused AdamW (as train.py uses it on CPU
    and CUDA), 'adamw_foreach' its multi-tensor implementation."""
    cfg = dict(DEFAULTS, n_embd=model.config.n_embd, optimizer='orthoadam' if name == 'orthoadam' else 'adamw',
               weight_decay=0.1, orthoadam_rotation=rotation, orthoadam_axes=axes)
    opt = configure_optimizer(model, cfg, device.type)
    if name == 'adamw_foreach':
        groups = [{k: g[k] for k in ('params', 'param_names', 'weight_decay')} for g in opt.param_groups]
        opt = torch.optim.AdamW(groups, lr=cfg['learning_rate'], betas=(cfg['beta1'], cfg['beta2']),
                                eps=cfg['eps'], foreach=True)
    return opt


def state_bytes(opt):
    """Bytes held by the optimizer: every state tensor, plus OrthoAdam's rotation factors (shared ones once)."""
    seen, total = set(), 0
    for s in opt.state.values():
        for t in s.values():
            if isinstance(t, torch.Tensor) and t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
    return total + (opt.factor_bytes() if isinstance(opt, OrthoAdam) else 0)


def bench_optimizer(device, sizes, variants, repeats, warmup):
    rows = []
    for size in sizes:
        model = model_for_optimizer(size, device)
        n_params = model.num_params()
        opts = {}
        for name, rotation, axes in variants(size):
            opt = optimizer_for(model, device, name, rotation, axes)
            for group in opt.param_groups:
                group['lr'] = 1e-6      # steps run repeatedly on the same gradients
            opts[name if name.startswith('adamw') else f"orthoadam {rotation}/{axes}"] = opt
        log(f"optim {size} ({n_params / 1e6:.1f}M params): {', '.join(opts)}")
        times = measure({label: opt.step for label, opt in opts.items()}, device, repeats, warmup)
        base = next(iter(opts))
        for label, opt in opts.items():
            row = {'model': size, 'params': n_params, 'optimizer': label, **summary(times[label]),
                   'state_bytes': state_bytes(opt)}
            row['step_over_adamw'], row['step_over_adamw_spread'] = paired_ratio(times[label], times[base])
            row['state_over_adamw'] = row['state_bytes'] / state_bytes(opts[base])
            rows.append(row)
        del opts, model
        if device.type == 'cuda':
            torch.cuda.empty_cache()
    return rows


# ----------------------------------------------------------------------------- 3. training step
def bench_train(device, size, batch_size, block_size, dtype, compile, repeats, warmup, accums):
    """One row per variant and gradient accumulation: a step is `accum` micro-batches of batch_size x
    block_size (forward, backward) and one clip + optimizer step, as train.py runs it."""
    peak = peak_flops(device.type)
    g = torch.Generator(device='cpu').manual_seed(0)
    vocab = GPT2[size]['vocab_size']
    x, y = (torch.randint(0, vocab, (batch_size, block_size), generator=g).to(device) for _ in range(2))
    autocast = (torch.autocast(device_type=device.type, dtype=dtype) if dtype != torch.float32
                else contextlib.nullcontext())
    variants = {}
    for label, attn, opt_name in (('vanilla', 'softmax', 'adamw'), ('softmax1+orthoadam', 'softmax1', 'orthoadam')):
        torch.manual_seed(0)
        raw = GPT(GPTConfig(**GPT2[size], **PAPER, attn=attn, block_size=block_size)).to(device)
        variants[label] = (raw, optimizer_for(raw, device, opt_name), torch.compile(raw) if compile else raw)

    def step_fn(label, accum):
        raw, opt, model = variants[label]

        def step():
            for _ in range(accum):
                with autocast:
                    _, loss = model(x, y)
                (loss / accum).backward()
            torch.nn.utils.clip_grad_norm_(raw.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    rows = []
    for accum in accums:
        log(f"train {size} {accum} x B={batch_size} x T={block_size}: {', '.join(variants)}"
            f"{' (compiling)' if compile and accum == accums[0] else ''}")
        if device.type == 'cuda':
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        times = measure({label: step_fn(label, accum) for label in variants}, device, repeats, warmup)
        for label, (raw, opt, _) in variants.items():
            row = {'model': size, 'variant': label, 'grad_accum': accum, 'batch_size': batch_size,
                   'block_size': block_size, 'dtype': str(dtype).removeprefix('torch.'), 'compile': compile,
                   **summary(times[label])}
            row['tokens_per_s'] = accum * batch_size * block_size / row['median_s']
            row['mfu'] = raw.flops_per_token(block_size) * row['tokens_per_s'] / peak if peak else None
            if device.type == 'cuda':   # both variants' memory together: they run side by side
                row['peak_memory_bytes'], row['memory_kind'] = (torch.cuda.max_memory_allocated(device),
                                                                'cuda_max_allocated_both_variants')
            else:   # no allocator statistics on CPU: the bytes that persist between steps
                row['peak_memory_bytes'] = sum(2 * p.numel() * p.element_size() for p in raw.parameters()) + \
                    state_bytes(opt)
                row['memory_kind'] = 'params+grads+optimizer_state'
            if label != 'vanilla':
                row['step_over_vanilla'], row['step_over_vanilla_spread'] = paired_ratio(times[label],
                                                                                         times['vanilla'])
            rows.append(row)
    return rows


# ----------------------------------------------------------------------------- main
def plan(device, quick):
    """Shapes and repeats per device: paper shapes on CUDA, small ones on CPU."""
    cuda = device.type == 'cuda'
    if cuda:
        attn_shapes, attn_dtype = [(16, 12, 256, 64), (4, 12, 1024, 64), (16, 16, 256, 64), (4, 16, 1024, 64)], \
            torch.bfloat16
        optim_sizes, train_dtype = ['130m', '350m'], torch.bfloat16
        # (size, micro-batch, T): the configs' 32 x 256 sequences per micro-batch, and the same tokens at T = 1024
        train_cases = [('130m', 32, 256)] if quick else [('130m', 32, 256), ('130m', 8, 1024), ('350m', 32, 256),
                                                          ('350m', 8, 1024)]
        accums = [16, 1]   # config/gpt2_130m.py on one GPU: 16 x 32 sequences per optimizer step
        repeats, warmup = (5, 2) if quick else (20, 5)
    elif quick:
        attn_shapes, attn_dtype = [(2, 12, 128, 64), (1, 12, 256, 64)], torch.float32
        optim_sizes, train_cases, train_dtype = ['tiny', 'small'], [('tiny', 8, 64)], torch.float32
        accums = [2, 1]
        repeats, warmup = 5, 1
    else:
        attn_shapes, attn_dtype = [(4, 12, 256, 64), (2, 12, 1024, 64)], torch.float32
        optim_sizes, train_cases, train_dtype = ['small', '130m'], [('small', 8, 256)], torch.float32
        accums = [4, 1]
        repeats, warmup = 7, 2

    def optim_variants(size):
        v = [('adamw', None, None), ('adamw_foreach', None, None), ('orthoadam', 'hadamard', 'residual'),
             ('orthoadam', 'hadamard', 'all')]
        v.append(('orthoadam', 'haar', 'residual'))       # n x n factors on n_embd axes only
        if size in ('tiny', 'small') or (cuda and size == '130m'):
            v.append(('orthoadam', 'haar', 'all'))        # 3072 x 3072 QRs: too slow for big CPU runs
        return v
    return dict(attn_shapes=attn_shapes, attn_dtype=attn_dtype, optim_sizes=optim_sizes, optim_variants=optim_variants,
                train_cases=train_cases, train_dtype=train_dtype, accums=accums, repeats=repeats, warmup=warmup)


def report(res):
    lines = [f"device: {res['device']} | torch {res['torch']} | {'quick' if res['quick'] else 'full'} | "
             f"times: min / median over rounds; ratios: median of per-round ratios ± spread (IQR / median)"]
    if res['attention']:
        lines += ['', '1. attention forward+backward (ms)',
                  f"{'B,H,T,d':<16} {'dtype':<9} {'softmax SDPA':>17} {'softmax-1':>17} {'s-1 extra key':>17}"
                  f" {'s-1 eager':>17} {'s1/s':>13} {'extra key/s':>13} {'eager/s':>13}"]
        for r in res['attention']:
            ms = [f"{r[k]['min_s'] * 1e3:.2f} / {r[k]['median_s'] * 1e3:.2f}"
                  for k in ('softmax_sdpa', 'softmax1', 'softmax1_extra_key', 'softmax1_eager')]
            ratios = [fmt_ratio(r[k], r[k + '_spread'])
                      for k in ('softmax1_over_softmax', 'extra_key_over_softmax', 'eager_over_softmax')]
            lines.append(f"{','.join(map(str, r['shape'])):<16} {r['dtype']:<9} " + ' '.join(f"{m:>17}" for m in ms)
                         + ' ' + ' '.join(f"{x:>13}" for x in ratios))
    if res['optimizer']:
        lines += ['', '2. optimizer step (ms) and state',
                  f"{'model':<6} {'params':>8} {'optimizer':<28} {'min / median':>17} {'state':>13} {'step/AdamW':>13}"
                  f" {'state/AdamW':>12}"]
        for r in res['optimizer']:
            lines.append(f"{r['model']:<6} {r['params'] / 1e6:>7.1f}M {r['optimizer']:<28} "
                         f"{r['min_s'] * 1e3:>7.1f} / {r['median_s'] * 1e3:>7.1f} {fmt_bytes(r['state_bytes']):>13} "
                         f"{fmt_ratio(r['step_over_adamw'], r['step_over_adamw_spread']):>13} "
                         f"{r['state_over_adamw']:>11.4f}x")
    if res['train']:
        lines += ['', '3. training step (forward, backward, clip, optimizer)',
                  f"{'model':<6} {'variant':<20} {'accum x B x T':>14} {'dtype':<9} {'compile':<7} {'min / median ms':>19}"
                  f" {'tokens/s':>10} {'MFU':>6} {'memory':>22} {'step/vanilla':>14}"]
        for r in res['train']:
            mfu = 'n/a' if r['mfu'] is None else f"{100 * r['mfu']:.1f}%"
            mem = f"{fmt_bytes(r['peak_memory_bytes'])} {'peak' if r['memory_kind'].startswith('cuda') else 'p+g+s'}"
            shape = f"{r['grad_accum']}x{r['batch_size']}x{r['block_size']}"
            ratio = fmt_ratio(r['step_over_vanilla'], r['step_over_vanilla_spread']) if 'step_over_vanilla' in r else '-'
            lines.append(f"{r['model']:<6} {r['variant']:<20} {shape:>14} {r['dtype']:<9} "
                         f"{str(r['compile']):<7} {r['min_s'] * 1e3:>8.1f} / {r['median_s'] * 1e3:>8.1f} "
                         f"{r['tokens_per_s']:>10,.0f} {mfu:>6} {mem:>22} {ratio:>14}")
    lines += ['', 'ratios (median; target in brackets)',
              f"  attn_softmax1_over_softmax       {fmt_ratio(res['attn_softmax1_over_softmax']):>8}  (<= 1.10x CPU, "
              f"<= 1.05x CUDA; worst shape)",
              f"  attn_extra_key_over_softmax      {fmt_ratio(res['attn_extra_key_over_softmax']):>8}  (the extra-key "
              f"route, for comparison)",
              f"  optim_state_orthoadam_over_adamw {fmt_ratio(res['optim_state_orthoadam_over_adamw']):>8}  (<= 1.05x)",
              f"  optim_step_orthoadam_over_adamw  {fmt_ratio(res['optim_step_orthoadam_over_adamw']):>8}  (<= 2x on CUDA)",
              f"  train_step_s1oa_over_vanilla     {fmt_ratio(res['train_step_s1oa_over_vanilla']):>8}  (<= 1.10x CPU, "
              f"<= 1.05x CUDA; grad_accum {next(iter(res['train_step_s1oa_over_vanilla_by_accum']), '-')})"]
    if res['unreliable']:
        lines += ['', 'UNRELIABLE timings (rerun on an idle machine, or with more --repeats):']
        lines += [f"  {u}" for u in res['unreliable']]
    return '\n'.join(lines)


def unreliable(res, busy):
    """The reasons to distrust this run's ratios: a busy machine, and each ratio that scatters too much."""
    reasons = [busy] if busy else []
    for r in res['attention']:
        for key in ('softmax1_over_softmax', 'extra_key_over_softmax'):
            if r[key + '_spread'] > MAX_SPREAD:
                reasons.append(f"attn {','.join(map(str, r['shape']))} {key}: spread {100 * r[key + '_spread']:.0f}%")
    for r in res['optimizer']:
        if r['step_over_adamw_spread'] > MAX_SPREAD:
            reasons.append(f"optim {r['model']} {r['optimizer']}: spread {100 * r['step_over_adamw_spread']:.0f}%")
    for r in res['train']:
        if r.get('step_over_vanilla_spread', 0) > MAX_SPREAD:
            reasons.append(f"train {r['model']} {r['grad_accum']}x{r['batch_size']}x{r['block_size']}: spread "
                           f"{100 * r['step_over_vanilla_spread']:.0f}%")
    return reasons


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--quick', action='store_true', help='small shapes and few repeats')
    parser.add_argument('--json', metavar='PATH', help='write all measurements and ratios to PATH')
    parser.add_argument('--sections', default=','.join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    parser.add_argument('--device', default='auto', help="'auto' (cuda if available), 'cpu', 'cuda', 'cuda:1'")
    parser.add_argument('--repeats', type=int, default=0, help='timed rounds per measurement (0: per device)')
    parser.add_argument('--compile', action=argparse.BooleanOptionalAction, default=None,
                        help='torch.compile the training step (default: on CUDA only)')
    parser.add_argument('--grad_accum', default='', metavar='N[,N...]',
                        help='micro-batches per training step, one row each; the first gives the ratio '
                             '(default: CUDA 16,1 as config/gpt2_130m.py on one GPU; CPU 4,1; --quick 2,1)')
    parser.add_argument('--suite', choices=['gpu'], help="run the GPU validation suite instead (gpu_suite.py): "
                        "python bench.py --suite gpu --out DIR [suite options, see python gpu_suite.py --help]")
    args, rest = parser.parse_known_args(argv)
    if args.suite:
        import gpu_suite
        sys.exit(gpu_suite.main(rest))
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.grad_accum and not all(a.isdigit() and int(a) > 0 for a in args.grad_accum.split(',')):
        parser.error(f"--grad_accum={args.grad_accum!r}: allowed a comma-separated list of positive integers")
    if args.repeats < 0:
        parser.error(f"--repeats={args.repeats}: must be >= 0 (0 = the device's default)")
    sections = [s for s in args.sections.split(',') if s]
    if not sections or any(s not in SECTIONS for s in sections):
        parser.error(f"--sections={args.sections!r}: allowed a comma-separated subset of {','.join(SECTIONS)}")
    device = torch.device('cuda' if args.device == 'auto' and torch.cuda.is_available() else
                          'cpu' if args.device == 'auto' else args.device)
    if device.type == 'cuda' and not torch.cuda.is_available():
        parser.error(f"--device={args.device}: CUDA is not available here; use --device=cpu")
    if device.type == 'cuda':
        torch.backends.cuda.matmul.allow_tf32 = True   # as train.py
        torch.backends.cudnn.allow_tf32 = True
    p = plan(device, args.quick)
    repeats = args.repeats or p['repeats']
    compile = device.type == 'cuda' if args.compile is None else args.compile

    name = torch.cuda.get_device_name(device) if device.type == 'cuda' else f"cpu ({os.cpu_count()} cores, " \
        f"{torch.get_num_threads()} threads)"
    load_start = os.getloadavg()[0]
    busy = (f"the machine was busy at the start: 1-minute load average {load_start:.2f} on {os.cpu_count()} cores"
            if device.type == 'cpu' and load_start > max(0.5, os.cpu_count() / 10) else None)
    if busy:
        log(f"warning: {busy}; CPU timings will scatter")
    res = {'device': name, 'torch': torch.__version__, 'quick': args.quick, 'cpu_count': os.cpu_count(),
           'attention': [], 'optimizer': [], 'train': []}
    t0 = time.time()
    if 'attn' in sections:
        res['attention'] = bench_attention(device, p['attn_dtype'], p['attn_shapes'], repeats, p['warmup'])
    if 'optim' in sections:
        res['optimizer'] = bench_optimizer(device, p['optim_sizes'], p['optim_variants'], repeats, p['warmup'])
    if 'train' in sections:
        accums = [int(a) for a in args.grad_accum.split(',')] if args.grad_accum else p['accums']
        for size, B, T in p['train_cases']:
            res['train'] += bench_train(device, size, B, T, p['train_dtype'], compile, repeats,
                                        p['warmup'] + (2 if compile else 0), accums)
            if device.type == 'cuda':
                torch.cuda.empty_cache()
    default = [r for r in res['optimizer'] if r['optimizer'] == 'orthoadam hadamard/residual']
    res['attn_softmax1_over_softmax'] = max((r['softmax1_over_softmax'] for r in res['attention']), default=None)
    res['attn_extra_key_over_softmax'] = max((r['extra_key_over_softmax'] for r in res['attention']), default=None)
    res['optim_state_orthoadam_over_adamw'] = default[-1]['state_over_adamw'] if default else None
    res['optim_step_orthoadam_over_adamw'] = default[-1]['step_over_adamw'] if default else None
    first = [r for r in res['train'] if 'step_over_vanilla' in r and (r['model'], r['block_size']) ==
             (res['train'][0]['model'], res['train'][0]['block_size'])]
    res['train_step_s1oa_over_vanilla'] = first[0]['step_over_vanilla'] if first else None
    res['train_step_s1oa_over_vanilla_by_accum'] = {str(r['grad_accum']): r['step_over_vanilla'] for r in first}
    res['elapsed_s'] = time.time() - t0
    res['load_avg'] = [load_start, os.getloadavg()[0]]
    res['unreliable'] = unreliable(res, busy)
    print(report(res))
    print(f"\n{res['elapsed_s']:.1f} s")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        write_json(args.json, res, indent=1)
    return res


if __name__ == '__main__':
    main()
