"""Speed and memory of softmax-1 + OrthoAdam against vanilla softmax + AdamW, side by side in one process.

    python bench.py                          # CUDA: paper shapes (130M / 350M), compile + bf16
    python bench.py --quick                  # small shapes, under a minute on a laptop CPU (CI smoke run)
    python bench.py --sections attn,optim --json out/bench.json
    python bench.py --device cpu --compile   # CPU with torch.compile for the training step

Sections (each timing is min / median over --repeats, after warm-up; CUDA timed with events):
  attn   attention forward+backward, (B, H=12, T, d=64): softmax SDPA, softmax-1 SDPA (model.attention),
         and a naive eager softmax-1 (model.attention_probs @ v, the T x T matrix materialised);
  optim  one optimizer step with every gradient set, on the parameter shapes of GPT-2 130M and 350M
         on CUDA (CPU: 'small' and 130M, --quick: 'tiny' and 'small'; train.py's parameter groups): torch's
         fused AdamW (the baseline of every ratio; train.py's AdamW) and its foreach variant vs OrthoAdam
         with rotation 'hadamard' (axes 'residual', train.py's default, and 'all') and 'haar' where
         affordable; time and optimizer-state bytes (moments plus rotation factors);
  train  a full training step of the 130M config on CUDA (a small config on CPU): --grad_accum micro-batches
         (forward, backward) then grad clip and the optimizer, as train.py runs it; the config's 16 x 32
         sequences and, as the worst case, 1 x 32; vanilla (softmax + AdamW) vs softmax-1 + OrthoAdam;
         tokens/s, MFU (train.py's PEAK_FLOPS, CUDA only), peak memory (CUDA: max allocated) or, on CPU, the
         bytes of parameters + gradients + optimizer state.

Ratios are medians of the softmax-1 / OrthoAdam variant over the vanilla one. --json PATH writes
{"device", "torch", "quick", "attn_softmax1_over_softmax" (worst over the attention shapes),
 "optim_state_orthoadam_over_adamw", "optim_step_orthoadam_over_adamw" (hadamard/residual on the
 largest model measured), "train_step_s1oa_over_vanilla" (at the first --grad_accum),
 "train_step_s1oa_over_vanilla_by_accum" ({accum: ratio}), "attention": [...], "optimizer": [...],
 "train": [...]}: one row per measurement with its times in seconds; a ratio is null when its
section did not run.
"""
import argparse
import contextlib
import os
import statistics
import sys
import time

import torch

from model import GPT, GPTConfig, attention, attention_probs
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


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def sync(device):
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def timeit(fn, device, repeats, warmup):
    """Seconds per call of fn, one value per repeat, after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        if device.type == 'cuda':
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return times


def summary(times):
    return {'min_s': min(times), 'median_s': statistics.median(times)}


def fmt_bytes(n):
    return 'n/a' if n is None else f"{n / 2**20:,.1f} MiB"


def fmt_ratio(r):
    return 'n/a' if r is None else f"{r:.3f}x"


# ----------------------------------------------------------------------------- 1. attention
def bench_attention(device, dtype, shapes, repeats, warmup):
    rows = []
    for B, H, T, d in shapes:
        g = torch.Generator(device='cpu').manual_seed(0)
        q, k, v, dy = (torch.randn(B, H, T, d, generator=g).to(device, dtype) for _ in range(4))
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        cfgs = {a: GPTConfig(attn=a, n_head=H, n_embd=H * d, block_size=T) for a in ('softmax', 'softmax1')}

        def fwd_bwd(forward):
            def step():
                q.grad = k.grad = v.grad = None
                forward().backward(dy)
            return step

        variants = {
            'softmax_sdpa': fwd_bwd(lambda: attention(q, k, v, cfgs['softmax'])),
            'softmax1_sdpa': fwd_bwd(lambda: attention(q, k, v, cfgs['softmax1'])),
            'softmax1_eager': fwd_bwd(lambda: attention_probs(q, k, cfgs['softmax1']).to(dtype) @ v),
        }
        row = {'shape': [B, H, T, d], 'dtype': str(dtype).removeprefix('torch.')}
        for name, fn in variants.items():
            log(f"attn B={B} H={H} T={T} d={d}: {name}")
            row[name] = summary(timeit(fn, device, repeats, warmup))
        base = row['softmax_sdpa']['median_s']
        row['softmax1_over_softmax'] = row['softmax1_sdpa']['median_s'] / base
        row['eager_over_softmax'] = row['softmax1_eager']['median_s'] / base
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
        base = None
        for name, rotation, axes in variants(size):
            label = name if name.startswith('adamw') else f"orthoadam {rotation}/{axes}"
            log(f"optim {size} ({n_params / 1e6:.1f}M params): {label}")
            opt = optimizer_for(model, device, name, rotation, axes)
            for group in opt.param_groups:
                group['lr'] = 1e-6      # steps run repeatedly on the same gradients
            row = {'model': size, 'params': n_params, 'optimizer': label,
                   **summary(timeit(opt.step, device, repeats, warmup)), 'state_bytes': state_bytes(opt)}
            if base is None:
                base = row
            row['step_over_adamw'] = row['median_s'] / base['median_s']
            row['state_over_adamw'] = row['state_bytes'] / base['state_bytes']
            rows.append(row)
            del opt
        del model
        if device.type == 'cuda':
            torch.cuda.empty_cache()
    return rows


# ----------------------------------------------------------------------------- 3. training step
def bench_train(device, size, batch_size, block_size, dtype, compile, repeats, warmup, accums):
    """One row per variant and gradient accumulation: a step is `accum` micro-batches of batch_size x
    block_size (forward, backward) and one clip + optimizer step, as train.py runs it."""
    rows = []
    peak = peak_flops(device.type)
    g = torch.Generator(device='cpu').manual_seed(0)
    vocab = GPT2[size]['vocab_size']
    x, y = (torch.randint(0, vocab, (batch_size, block_size), generator=g).to(device) for _ in range(2))
    autocast = (torch.autocast(device_type=device.type, dtype=dtype) if dtype != torch.float32
                else contextlib.nullcontext())
    for label, attn, opt_name in (('vanilla', 'softmax', 'adamw'), ('softmax1+orthoadam', 'softmax1', 'orthoadam')):
        if device.type == 'cuda':
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        torch.manual_seed(0)
        raw = GPT(GPTConfig(**GPT2[size], **PAPER, attn=attn, block_size=block_size)).to(device)
        opt = optimizer_for(raw, device, opt_name)
        model = torch.compile(raw) if compile else raw

        def step(accum):
            for _ in range(accum):
                with autocast:
                    _, loss = model(x, y)
                (loss / accum).backward()
            torch.nn.utils.clip_grad_norm_(raw.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

        for accum in accums:
            log(f"train {size} {accum} x B={batch_size} x T={block_size}: {label}{' (compiling)' if compile else ''}")
            times = timeit(lambda: step(accum), device, repeats, warmup)
            row = {'model': size, 'variant': label, 'grad_accum': accum, 'batch_size': batch_size,
                   'block_size': block_size, 'dtype': str(dtype).removeprefix('torch.'), 'compile': compile,
                   **summary(times)}
            row['tokens_per_s'] = accum * batch_size * block_size / row['median_s']
            row['mfu'] = raw.flops_per_token(block_size) * row['tokens_per_s'] / peak if peak else None
            if device.type == 'cuda':   # over this variant's rows so far
                row['peak_memory_bytes'], row['memory_kind'] = torch.cuda.max_memory_allocated(device), 'cuda_max_allocated'
            else:   # no allocator statistics on CPU: the bytes that persist between steps
                opt.step()   # with gradients set, as during a step
                row['peak_memory_bytes'] = sum(2 * p.numel() * p.element_size() for p in raw.parameters()) + state_bytes(opt)
                row['memory_kind'] = 'params+grads+optimizer_state'
                opt.zero_grad(set_to_none=True)
            rows.append(row)
        del model, raw, opt
    for row in rows[len(accums):]:
        vanilla = next(r for r in rows if r['variant'] == 'vanilla' and r['grad_accum'] == row['grad_accum'])
        row['step_over_vanilla'] = row['median_s'] / vanilla['median_s']
    return rows


# ----------------------------------------------------------------------------- main
def plan(device, quick):
    """Shapes and repeats per device: paper shapes on CUDA, small ones on CPU."""
    cuda = device.type == 'cuda'
    if cuda:
        attn_shapes, attn_dtype = [(16, 12, 256, 64), (16, 12, 1024, 64)], torch.bfloat16
        optim_sizes, train_size, train_bt, train_dtype = ['130m', '350m'], '130m', (32, 256), torch.bfloat16
        accums = [16, 1]   # config/gpt2_130m.py on one GPU: 16 x 32 sequences per optimizer step
        repeats, warmup = (5, 2) if quick else (20, 5)
    elif quick:
        attn_shapes, attn_dtype = [(2, 12, 128, 64), (1, 12, 256, 64)], torch.float32
        optim_sizes, train_size, train_bt, train_dtype = ['tiny', 'small'], 'tiny', (8, 64), torch.float32
        accums = [2, 1]
        repeats, warmup = 5, 1
    else:
        attn_shapes, attn_dtype = [(4, 12, 256, 64), (2, 12, 1024, 64)], torch.float32
        optim_sizes, train_size, train_bt, train_dtype = ['small', '130m'], 'small', (8, 256), torch.float32
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
                train_size=train_size, train_bt=train_bt, train_dtype=train_dtype, accums=accums, repeats=repeats,
                warmup=warmup)


def report(res):
    lines = [f"device: {res['device']} | torch {res['torch']} | {'quick' if res['quick'] else 'full'} | "
             f"times: min / median over repeats"]
    if res['attention']:
        lines += ['', '1. attention forward+backward (ms)',
                  f"{'B,H,T,d':<16} {'dtype':<9} {'softmax SDPA':>17} {'softmax-1 SDPA':>17} {'softmax-1 eager':>17}"
                  f" {'s1/s':>7} {'eager/s':>8}"]
        for r in res['attention']:
            ms = [f"{r[k]['min_s'] * 1e3:.2f} / {r[k]['median_s'] * 1e3:.2f}"
                  for k in ('softmax_sdpa', 'softmax1_sdpa', 'softmax1_eager')]
            lines.append(f"{','.join(map(str, r['shape'])):<16} {r['dtype']:<9} {ms[0]:>17} {ms[1]:>17} {ms[2]:>17}"
                         f" {r['softmax1_over_softmax']:>6.2f}x {r['eager_over_softmax']:>7.2f}x")
    if res['optimizer']:
        lines += ['', '2. optimizer step (ms) and state',
                  f"{'model':<6} {'params':>8} {'optimizer':<28} {'min / median':>17} {'state':>13} {'step/AdamW':>11}"
                  f" {'state/AdamW':>12}"]
        for r in res['optimizer']:
            lines.append(f"{r['model']:<6} {r['params'] / 1e6:>7.1f}M {r['optimizer']:<28} "
                         f"{r['min_s'] * 1e3:>7.1f} / {r['median_s'] * 1e3:>7.1f} {fmt_bytes(r['state_bytes']):>13} "
                         f"{r['step_over_adamw']:>10.2f}x {r['state_over_adamw']:>11.4f}x")
    if res['train']:
        lines += ['', '3. training step (forward, backward, clip, optimizer)',
                  f"{'model':<6} {'variant':<20} {'accum x B x T':>14} {'dtype':<9} {'compile':<7} {'min / median ms':>19}"
                  f" {'tokens/s':>10} {'MFU':>6} {'memory':>22} {'step/vanilla':>13}"]
        for r in res['train']:
            mfu = 'n/a' if r['mfu'] is None else f"{100 * r['mfu']:.1f}%"
            mem = f"{fmt_bytes(r['peak_memory_bytes'])} {'peak' if r['memory_kind'].startswith('cuda') else 'p+g+s'}"
            shape = f"{r['grad_accum']}x{r['batch_size']}x{r['block_size']}"
            lines.append(f"{r['model']:<6} {r['variant']:<20} {shape:>14} {r['dtype']:<9} "
                         f"{str(r['compile']):<7} {r['min_s'] * 1e3:>8.1f} / {r['median_s'] * 1e3:>8.1f} "
                         f"{r['tokens_per_s']:>10,.0f} {mfu:>6} {mem:>22} {fmt_ratio(r.get('step_over_vanilla')):>13}")
    lines += ['', 'ratios (median; target in brackets)',
              f"  attn_softmax1_over_softmax       {fmt_ratio(res['attn_softmax1_over_softmax']):>8}  (<= 1.10x, worst shape)",
              f"  optim_state_orthoadam_over_adamw {fmt_ratio(res['optim_state_orthoadam_over_adamw']):>8}  (<= 1.05x)",
              f"  optim_step_orthoadam_over_adamw  {fmt_ratio(res['optim_step_orthoadam_over_adamw']):>8}  (<= 1.5x on CUDA)",
              f"  train_step_s1oa_over_vanilla     {fmt_ratio(res['train_step_s1oa_over_vanilla']):>8}  (<= 1.05x on CUDA; "
              f"grad_accum {next(iter(res['train_step_s1oa_over_vanilla_by_accum']), '-')})"]
    return '\n'.join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--quick', action='store_true', help='small shapes and few repeats')
    parser.add_argument('--json', metavar='PATH', help='write all measurements and ratios to PATH')
    parser.add_argument('--sections', default=','.join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    parser.add_argument('--device', default='auto', help="'auto' (cuda if available), 'cpu', 'cuda', 'cuda:1'")
    parser.add_argument('--repeats', type=int, default=0, help='timed repeats per measurement (0: per device)')
    parser.add_argument('--compile', action=argparse.BooleanOptionalAction, default=None,
                        help='torch.compile the training step (default: on CUDA only)')
    parser.add_argument('--grad_accum', default='', metavar='N[,N...]',
                        help='micro-batches per training step, one row each; the first gives the ratio '
                             '(default: CUDA 16,1 as config/gpt2_130m.py on one GPU; CPU 4,1; --quick 2,1)')
    args = parser.parse_args(argv)
    if args.grad_accum and not all(a.isdigit() and int(a) > 0 for a in args.grad_accum.split(',')):
        parser.error(f"--grad_accum={args.grad_accum!r}: allowed a comma-separated list of positive integers")
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
    res = {'device': name, 'torch': torch.__version__, 'quick': args.quick, 'attention': [], 'optimizer': [], 'train': []}
    t0 = time.time()
    if 'attn' in sections:
        res['attention'] = bench_attention(device, p['attn_dtype'], p['attn_shapes'], repeats, p['warmup'])
    if 'optim' in sections:
        res['optimizer'] = bench_optimizer(device, p['optim_sizes'], p['optim_variants'], repeats, p['warmup'])
    if 'train' in sections:
        B, T = p['train_bt']
        accums = [int(a) for a in args.grad_accum.split(',')] if args.grad_accum else p['accums']
        res['train'] = bench_train(device, p['train_size'], B, T, p['train_dtype'], compile, repeats,
                                   p['warmup'] + (2 if compile else 0), accums)
    default = [r for r in res['optimizer'] if r['optimizer'] == 'orthoadam hadamard/residual']
    res['attn_softmax1_over_softmax'] = max((r['softmax1_over_softmax'] for r in res['attention']), default=None)
    res['optim_state_orthoadam_over_adamw'] = default[-1]['state_over_adamw'] if default else None
    res['optim_step_orthoadam_over_adamw'] = default[-1]['step_over_adamw'] if default else None
    ratios = [r for r in res['train'] if 'step_over_vanilla' in r]
    res['train_step_s1oa_over_vanilla'] = ratios[0]['step_over_vanilla'] if ratios else None
    res['train_step_s1oa_over_vanilla_by_accum'] = {str(r['grad_accum']): r['step_over_vanilla'] for r in ratios}
    res['elapsed_s'] = time.time() - t0
    print(report(res))
    print(f"\n{res['elapsed_s']:.1f} s")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        write_json(args.json, res, indent=1)
    return res


if __name__ == '__main__':
    main()
