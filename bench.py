"""Speed and memory of softmax-1 + OrthoAdam against vanilla softmax + AdamW, side by side in one process.

    python bench.py                          # CUDA: paper shapes (130M / 350M, T = 256 / 1024), compile + bf16
    python bench.py --quick                  # small shapes, under a minute on a laptop CPU (CI smoke run)
    python bench.py --sections attn,optim --json out/bench.json
    python bench.py --device cpu --compile   # CPU with torch.compile for the training step
    python bench.py --sections bf16          # CPU: fp32 eager vs bf16 eager vs bf16 compiled at the CPU configs
    python bench.py --sections tune          # CUDA: time every tile shape of kernels/flash_sink.py's Triton kernel

Sections:
  attn   attention forward+backward, (B, H, T, d=64), as the model calls it (q, k, v views of c_attn's output):
         softmax SDPA (the baseline); softmax-1 and the attention bias as the training path runs them (CUDA:
         kernels/flash_sink.py's Triton kernel; CPU: the SDPA sink route); softmax-1 by the SDPA sink route (CUDA's
         fallback); through an extra zero key (the route dropout takes); eager (the T x T matrix). CUDA times
         are GPU time: each variant's calls are captured in a CUDA graph and its replays timed with events.
  optim  one optimizer step with every gradient set, on the parameter shapes of GPT-2 130M and 350M
         on CUDA (CPU: 'small' and 130M, --quick: 'tiny' and 'small'; train.py's parameter groups): torch's
         fused AdamW (the baseline of every ratio; train.py's AdamW) and its foreach variant vs OrthoAdam
         with rotation 'hadamard' (axes 'residual', train.py's default, and 'all'; on CUDA also the default
         with kernels/orthoadam.py's fused step turned off, 'stacked') and 'haar' where affordable; time and
         optimizer-state bytes (moments plus rotation factors);
  train  a full training step (CUDA: 60M and 130M at T = 256, the paper's 512 x 256 tokens per step with the
         configs' micro-batches; CPU: a small config): --grad_accum micro-batches (forward, backward) then
         grad clip and the optimizer, as train.py runs it, compiled on CUDA; vanilla (softmax + AdamW) vs
         softmax-1 + OrthoAdam; tokens/s, MFU (train.py's PEAK_FLOPS, CUDA only), peak memory (CUDA: max
         allocated) or, on CPU, parameters + gradients + optimizer state.
  bf16   (CPU) the training step of each CPU config (config/laptop/base.py: 4 layers x 256, 16 x 256 tokens;
         config/bb/base.py: Guo et al.'s 1-layer model, 8 x 64 x 256 tokens) in fp32 eager, bf16 eager (autocast)
         and bf16 compiled, timed in turn: tokens/s, the speed-up over fp32 eager, and the peak memory of a step
         (in a process of its own per path: parameters, optimizer state, gradients and activations); --quick:
         micro-batches of 2, one a step.
  tune   (CUDA, not in the default sections) every tile shape of kernels/flash_sink.py's candidates on each attention
         shape: the numbers behind flash_sink.blocks().

Timing: the variants of one measurement are timed in turn, one call each per round, for --repeats rounds
after warm-up, so that a change of machine load hits all of them alike; --quick on the CPU calls them in
turn 3 times per round and keeps each one's fastest (a call the scheduler interrupted is not the round's
time). A ratio is the median over rounds of the per-round ratio; its spread is the interquartile range of
those ratios over their median. A ratio whose spread exceeds 10%, or any ratio of a CPU run started while
the machine was busy (1-minute load average above max(0.5, cores / 10)), is marked unreliable: printed with
'?' and listed in 'unreliable'.

--json PATH writes {"device", "torch", "quick", "load_avg": [start, end], "cpu_count", "unreliable": [...],
 the target ratios of TARGETS ("attn_softmax1_over_softmax", "attn_bias_over_softmax" (worst shape),
 "optim_step_orthoadam_over_adamw", "optim_state_orthoadam_over_adamw" (hadamard/residual on the largest model),
 "train_step_s1oa_over_vanilla_60m", "train_step_s1oa_over_vanilla_130m", "mfu_vanilla_130m"), and
 "attn_extra_key_over_softmax", "train_step_s1oa_over_vanilla" (first train case, first --grad_accum),
 "train_step_s1oa_over_vanilla_by_accum", "bf16_speedup_laptop" (target), "bf16_speedup_bb" (the path each config
 trains with: compiled, eager), "attention": [...], "optimizer": [...], "train": [...], "bf16": [...], "tune": [...],
 "elapsed_s"}: one row per measurement with min_s, median_s, spread and its ratios (each with a *_spread); a
ratio is null when its section did not run. The file is rewritten after every section and training case, so a
run stopped at a time limit keeps what it measured.
"""
from harness.entry import early_exit_on_signal   # first: a signal while torch loads is one line, not a traceback
early_exit_on_signal(__name__)

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import torch

from attention import attention, attention_probs, extra_key_attention, sink_route
from harness.bench_report import attn_key, derive, report, spread, unreliable
from harness.devices import peak_flops
from harness.entry import run_script
from harness.fileio import check_output, disk_full, disk_full_text, integer, path_arg, write_json
from harness import provenance
from harness.optimizers import configure_optimizer
from harness.train_config import DEFAULTS
from model import GPT, GPTConfig
from orthoadam import OrthoAdam

SECTIONS = ('attn', 'optim', 'train', 'bf16', 'tune')
GPT2 = {  # the paper's GPT-2 shapes (config/gpt2_130m.py, config/gpt2_350m.py) and small CPU stand-ins
    '60m': dict(n_layer=10, n_head=8, n_embd=512, vocab_size=50257),
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


def measure(fns, device, repeats, warmup, best_of=1):
    """{name: seconds per call, one value per round}: every round calls each fn once, in turn, `best_of` times
    over (a b c a b c ...), and keeps each fn's fastest call of the round; `warmup` untimed rounds first. On a
    shared CPU a call that the scheduler interrupts takes several times as long: the best of a few calls in
    turn is the round's time of the code itself, and the variants still share every round's conditions."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    sync(device)
    times = {name: [] for name in fns}
    for _ in range(repeats):
        best = {name: float('inf') for name in fns}
        for _ in range(best_of):
            for name, fn in fns.items():
                best[name] = min(best[name], time_call(fn, device))
        for name in fns:
            times[name].append(best[name])
    return times


def time_call(fn, device):
    """Seconds of one call: CUDA events around it on CUDA, wall time on the CPU."""
    if device.type == 'cuda':
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0




def summary(times):
    return {'min_s': min(times), 'median_s': statistics.median(times), 'spread': spread(times)}


def paired_ratio(times, base):
    """Median and spread of the per-round ratios times[i] / base[i]."""
    ratios = [t / b for t, b in zip(times, base)]
    return statistics.median(ratios), spread(ratios)






# ----------------------------------------------------------------------------- 1. attention
def cuda_graph(fn, inner):
    """A callable replaying `inner` calls of fn captured in one CUDA graph: the GPU time of fn without the
    launch gaps of Python dispatch (which a compiled training step hides behind the GPU's work)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):   # warm-up outside the graph: Triton compiles, cuDNN plans
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    return graph.replay


def attention_inputs(B, H, T, d, device, dtype, seed=0):
    """x as c_attn makes it (q, k, v are views of it), an output gradient, attn_bias's key and value."""
    g = torch.Generator(device='cpu').manual_seed(seed)
    x = torch.randn(B, T, 3 * H * d, generator=g).to(device, dtype).requires_grad_()
    dy = torch.randn(B, H, T, d, generator=g).to(device, dtype)
    sink = tuple((torch.randn(1, H, 1, d, generator=g) * 0.5).to(device).requires_grad_() for _ in range(2))
    return x, dy, sink


def fwd_bwd(forward, x, dy, sink=None):
    """One forward and backward of forward(q, k, v) on views of x (as the model's c_attn output)."""
    B, T = x.shape[:2]
    H, d = dy.shape[1], dy.shape[3]

    def step():
        x.grad = None
        if sink is not None:
            sink[0].grad = sink[1].grad = None
        q, k, v = (t.view(B, T, H, d).transpose(1, 2) for t in x.split(H * d, dim=2))
        forward(q, k, v).backward(dy)
    return step


def time_variants(variants, device, repeats, warmup, inner, best_of=1):
    """{name: seconds per call per round}: CUDA graph replays of `inner` calls on CUDA (GPU time), plain calls
    on the CPU. A variant that cannot be captured is timed by plain calls and named in the returned set."""
    eager = set()
    if device.type == 'cuda':
        fns = {}
        for name, fn in variants.items():
            try:
                fns[name] = cuda_graph(fn, inner)
            except RuntimeError as e:
                log(f"  {name}: cannot be captured in a CUDA graph ({str(e).splitlines()[0][:120]}); timed eagerly")
                torch.cuda.synchronize()
                fns[name] = lambda fn=fn: [fn() for _ in range(inner)]
                eager.add(name)
        times = measure(fns, device, repeats, warmup)
        return {name: [t / inner for t in ts] for name, ts in times.items()}, eager
    return measure(variants, device, repeats, warmup, best_of), eager




def bench_attention(device, dtype, shapes, repeats, warmup, inner=10, best_of=1):
    rows = []
    for B, H, T, d in shapes:
        x, dy, sink = attention_inputs(B, H, T, d, device, dtype)
        cfgs = {a: GPTConfig(attn=a, n_head=H, n_embd=H * d, block_size=T) for a in ('softmax', 'softmax1')}
        bias_cfg = GPTConfig(attn='softmax', attn_bias=True, n_head=H, n_embd=H * d, block_size=T)
        variants = {
            'softmax_sdpa': fwd_bwd(lambda q, k, v: attention(q, k, v, cfgs['softmax']), x, dy),
            'softmax1': fwd_bwd(lambda q, k, v: attention(q, k, v, cfgs['softmax1']), x, dy),
            'attn_bias': fwd_bwd(lambda q, k, v: attention(q, k, v, bias_cfg, 0.0, sink), x, dy, sink),
            'softmax1_sdpa_route': fwd_bwd(sink_route, x, dy),
            'softmax1_extra_key': fwd_bwd(extra_key_attention, x, dy),
            'softmax1_eager': fwd_bwd(lambda q, k, v: attention_probs(q, k, cfgs['softmax1']).to(dtype) @ v, x, dy),
        }
        log(f"attn B={B} H={H} T={T} d={d}: {', '.join(variants)}")
        times, eager = time_variants(variants, device, repeats, warmup, inner if device.type == 'cuda' else 1,
                                     best_of)
        row = {'shape': [B, H, T, d], 'dtype': str(dtype).removeprefix('torch.'),
               'timing': 'cuda_graph' if device.type == 'cuda' else 'wall', 'timed_eagerly': sorted(eager)}
        row.update({name: summary(t) for name, t in times.items()})
        for name in list(variants)[1:]:
            key = attn_key(name)
            row[key], row[key + '_spread'] = paired_ratio(times[name], times['softmax_sdpa'])
        rows.append(row)
    return rows


def bench_tune(device, shapes, repeats, warmup, inner=10):
    """Every tile shape of flash_sink's candidates on each shape: the forward alone, then forward + backward with
    the best forward; the rows say which to put in flash_sink.blocks()."""
    from kernels import flash_sink
    rows = []
    for B, H, T, d in shapes + [(64, 8, 256, 64), (32, 12, 256, 64)]:   # + the 60M and 130M configs' micro-batches
        x, dy, _ = attention_inputs(B, H, T, d, device, torch.bfloat16)
        q, k, v = (t.view(B, T, H, d).transpose(1, 2) for t in x.detach().split(H * d, dim=2))
        default = flash_sink.blocks(T, d, torch.bfloat16)
        fwd = {}
        for tiles in flash_sink.FWD_CANDIDATES:
            flash_sink.FORCE = (tiles, default[1])
            fwd[tiles] = (lambda: flash_sink.flash_sink_attention(q, k, v))
            try:
                fwd[tiles] = cuda_graph(fwd[tiles], inner)
            except Exception as e:   # a tile shape this GPU cannot run (shared memory)
                log(f"  fwd {tiles}: {str(e).splitlines()[0][:120]}")
                del fwd[tiles]
        flash_sink.FORCE = None
        t_fwd = {tiles: statistics.median(t) / inner for tiles, t in measure(fwd, device, repeats, warmup).items()}
        best_fwd = min(t_fwd, key=t_fwd.get)
        both = {}
        for tiles in flash_sink.BWD_CANDIDATES:
            flash_sink.FORCE = (best_fwd, tiles)
            try:
                both[tiles] = cuda_graph(fwd_bwd(lambda q, k, v: flash_sink.flash_sink_attention(q, k, v), x, dy), inner)
            except Exception as e:
                log(f"  bwd {tiles}: {str(e).splitlines()[0][:120]}")
        flash_sink.FORCE = None
        t_both = {tiles: statistics.median(t) / inner for tiles, t in measure(both, device, repeats, warmup).items()}
        best_bwd = min(t_both, key=t_both.get)
        row = {'shape': [B, H, T, d], 'default': [list(default[0]), list(default[1])],
               'forward_ms': {str(k): v * 1e3 for k, v in t_fwd.items()},
               'forward_backward_ms': {str(k): v * 1e3 for k, v in t_both.items()},
               'best': [list(best_fwd), list(best_bwd)]}
        log(f"tune {B},{H},{T},{d}: best fwd {best_fwd} {t_fwd[best_fwd] * 1e3:.3f} ms (default "
            f"{t_fwd.get(default[0], float('nan')) * 1e3:.3f}); best bwd {best_bwd} fwd+bwd {t_both[best_bwd] * 1e3:.3f} ms "
            f"(default {t_both.get(default[1], float('nan')) * 1e3:.3f})")
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


def optimizer_for(model, device, name, rotation='hadamard', axes='residual', kernel=True):
    """train.py's optimizer and parameter groups; 'adamw' is torch's fused AdamW (as train.py uses it on CPU
    and CUDA), 'adamw_foreach' its multi-tensor implementation."""
    cfg = dict(DEFAULTS, n_embd=model.config.n_embd, optimizer='orthoadam' if name == 'orthoadam' else 'adamw',
               weight_decay=0.1, orthoadam_rotation=rotation, orthoadam_axes=axes)
    opt = configure_optimizer(model, cfg, device.type)
    if isinstance(opt, OrthoAdam):
        opt.kernel = kernel
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


def bench_optimizer(device, sizes, variants, repeats, warmup, best_of=1):
    rows = []
    for size in sizes:
        model = model_for_optimizer(size, device)
        n_params = model.num_params()
        opts = {}
        for name, rotation, axes in variants(size):
            stacked = name == 'orthoadam_stacked'
            opt = optimizer_for(model, device, 'orthoadam' if stacked else name, rotation, axes, kernel=not stacked)
            for group in opt.param_groups:
                group['lr'] = 1e-6      # steps run repeatedly on the same gradients
            label = name if name.startswith('adamw') else f"orthoadam {rotation}/{axes}"
            opts[label + (' stacked' if stacked else '')] = opt
        log(f"optim {size} ({n_params / 1e6:.1f}M params): {', '.join(opts)}")
        times = measure({label: opt.step for label, opt in opts.items()}, device, repeats, warmup, best_of)
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
def bench_train(device, size, batch_size, block_size, dtype, compile, repeats, warmup, accums, best_of=1):
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
        times = measure({label: step_fn(label, accum) for label in variants}, device, repeats, warmup, best_of)
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


# ----------------------------------------------------------------------------- 4. bf16 on the CPU
# The CPU configs' training steps: (label, config file, vocabulary of its data, micro-batch, micro-batches a step).
BF16_CASES = (('laptop', 'config/laptop/base.py', 257, 16, 1),   # data/pinned_cpu_bytes: 256 bytes and eot
              ('bb', 'config/bb/base.py', 86, 64, 8))            # data/bb_shakespeare: 84 characters, <s>, <d>
BF16_PATHS = (('fp32 eager', torch.float32, False), ('bf16 eager', torch.bfloat16, False),
              ('bf16 compiled', torch.bfloat16, True))


def bf16_step(case, path, quick):
    """A training step of a CPU config as train.py runs it (its model, optimizer, grad clip; a fixed batch) on one
    precision path: (step function, parameter + optimizer-state bytes, tokens a step)."""
    from configurator import load_config
    from harness.train_config import CHOICES, MODEL_KEYS, RANGES
    _, config, vocab, batch, accum = next(c for c in BF16_CASES if c[0] == case)
    _, dtype, compiled = next(p for p in BF16_PATHS if p[0] == path)
    cfg = load_config(DEFAULTS, [config], CHOICES, RANGES)
    batch, accum = (2, 1) if quick else (batch, accum)
    torch.manual_seed(0)
    raw = GPT(GPTConfig(**{k: cfg[k] for k in MODEL_KEYS if k in cfg and k != 'vocab_size'}, vocab_size=vocab))
    opt = configure_optimizer(raw, cfg, 'cpu')
    model = torch.compile(raw) if compiled else raw
    g = torch.Generator(device='cpu').manual_seed(0)
    x, y = (torch.randint(0, vocab, (batch, cfg['block_size']), generator=g) for _ in range(2))
    autocast = torch.autocast('cpu', dtype=dtype) if dtype != torch.float32 else contextlib.nullcontext()

    def step():
        for _ in range(accum):
            with autocast:
                _, loss = model(x, y)
            (loss / accum).backward()
        if cfg['grad_clip'] > 0:
            torch.nn.utils.clip_grad_norm_(raw.parameters(), cfg['grad_clip'])
        opt.step()
        opt.zero_grad(set_to_none=True)
    persistent = sum(p.numel() * p.element_size() for p in raw.parameters())
    return step, persistent, accum * batch * cfg['block_size'], opt


def _resident(field):
    with open('/proc/self/status') as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ':'))


def _bf16_peak_child(case, path, quick, queue):
    """In a process of its own: the peak resident memory of one step after warm-up (compilation included in the
    warm-up): the step's growth of the resident set (gradients, activations, temporaries) plus the parameters and
    the optimizer state it holds throughout. None where Linux's peak counter cannot be reset."""
    try:
        step, persistent, _, opt = bf16_step(case, path, quick)
        step(), step()
        with open('/proc/self/clear_refs', 'w') as f:   # resets VmHWM, the peak resident set, to the current one
            f.write('5')
        before = _resident('VmRSS')
        step()
        queue.put(_resident('VmHWM') - before + persistent + state_bytes(opt))
    except (OSError, StopIteration):
        queue.put(None)


def bf16_peak(case, path, quick):
    import multiprocessing
    ctx = multiprocessing.get_context('spawn')   # a fresh process: no other path's memory or compiled code in it
    queue = ctx.Queue()
    child = ctx.Process(target=_bf16_peak_child, args=(case, path, quick, queue))
    child.start()
    try:
        return queue.get(timeout=1800)
    finally:
        child.join()


def bench_bf16(cases, repeats, warmup, quick, best_of=1):
    """One row per CPU config and precision path: tokens/s of its training step, timed in turn with the other
    paths of the same config (ratios over fp32 eager per round), and the peak memory of a step in a process of
    its own."""
    rows = []
    for case in cases:
        log(f"bf16 {case}: {', '.join(p[0] for p in BF16_PATHS)} (compiling; then peak memory, one process each)")
        steps = {path: bf16_step(case, path, quick) for path, _, _ in BF16_PATHS}
        times = measure({path: s[0] for path, s in steps.items()}, torch.device('cpu'), repeats, warmup + 2, best_of)
        base = times[BF16_PATHS[0][0]]
        for path, dtype, compiled in BF16_PATHS:
            row = {'case': case, 'path': path, 'dtype': str(dtype).removeprefix('torch.'), 'compile': compiled,
                   'tokens': steps[path][2], **summary(times[path])}
            row['tokens_per_s'] = row['tokens'] / row['median_s']
            row['speedup'], row['speedup_spread'] = paired_ratio(base, times[path])   # fp32 eager time / this one
            rows.append(row)
        del steps
        for row in rows[-len(BF16_PATHS):]:
            row['peak_memory_bytes'] = bf16_peak(case, row['path'], quick)
    return rows


# ----------------------------------------------------------------------------- main
def plan(device, quick):
    """Shapes and repeats per device: paper shapes on CUDA, small ones on CPU."""
    cuda = device.type == 'cuda'
    if cuda:
        attn_shapes, attn_dtype = [(16, 12, 256, 64), (4, 12, 1024, 64), (16, 16, 256, 64), (4, 16, 1024, 64)], \
            torch.bfloat16
        optim_sizes, train_dtype = ['130m', '350m'], torch.bfloat16
        # (size, micro-batch, T, grad accums): the paper's step of 512 x 256 tokens on one GPU with the configs'
        # micro-batches (config/gpt2_60m.py: 8 x 64, config/gpt2_130m.py: 16 x 32); --quick: 2 micro-batches
        train_cases = [('60m', 64, 256, [2 if quick else 8]), ('130m', 32, 256, [2 if quick else 16])]
        repeats, warmup = (5, 2) if quick else (15, 3)
    elif quick:
        attn_shapes, attn_dtype = [(2, 12, 128, 64), (1, 12, 256, 64)], torch.float32
        optim_sizes, train_cases, train_dtype = ['tiny', 'small'], [('tiny', 8, 64, [2, 1])], torch.float32
        repeats, warmup = 11, 1
    else:
        attn_shapes, attn_dtype = [(4, 12, 256, 64), (2, 12, 1024, 64)], torch.float32
        optim_sizes, train_cases, train_dtype = ['small', '130m'], [('small', 8, 256, [4, 1])], torch.float32
        repeats, warmup = 7, 2

    def optim_variants(size):
        v = [('adamw', None, None), ('adamw_foreach', None, None), ('orthoadam', 'hadamard', 'residual'),
             ('orthoadam', 'hadamard', 'all')]
        if cuda:   # the default without kernels/orthoadam.py's fused step: the stacked-matmul path
            v.insert(3, ('orthoadam_stacked', 'hadamard', 'residual'))
        v.append(('orthoadam', 'haar', 'residual'))       # n x n factors on n_embd axes only
        if size in ('tiny', 'small') or (cuda and size == '130m'):
            v.append(('orthoadam', 'haar', 'all'))        # 3072 x 3072 QRs: too slow for big CPU runs
        return v
    return dict(attn_shapes=attn_shapes, attn_dtype=attn_dtype, optim_sizes=optim_sizes, optim_variants=optim_variants,
                train_cases=train_cases, train_dtype=train_dtype, repeats=repeats, warmup=warmup,
                best_of=3 if quick and not cuda else 1)   # quick CPU calls (ms) are where preemption scatters most














MAX_REPEATS = 10_000   # rounds of one measurement: more is hours of a single benchmark, not a steadier number


def earlier_result(path):
    """Whether the file at path is a bench.py --json result (which --json may replace)."""
    try:
        with open(path) as f:
            res = json.load(f)
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(res, dict) and {'device', 'torch'} <= set(res)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--quick', action='store_true', help='small shapes and few repeats')
    parser.add_argument('--json', metavar='PATH', type=path_arg, help='write all measurements and ratios to PATH')
    parser.add_argument('--sections', default=None, help=f"comma-separated subset of {','.join(SECTIONS)} (default: "
                        f"attn,optim,train, and bf16 on the CPU)")
    parser.add_argument('--device', default='auto', help="'auto' (cuda if available), 'cpu', 'cuda', 'cuda:1'")
    parser.add_argument('--repeats', type=integer, default=0, help='timed rounds per measurement (0: per device)')
    parser.add_argument('--compile', action=argparse.BooleanOptionalAction, default=None,
                        help='torch.compile the training step (default: on CUDA only)')
    parser.add_argument('--grad_accum', default='', metavar='N[,N...]',
                        help='micro-batches per training step, one row each; the first gives the ratio '
                             '(default: CUDA the paper batch per model, 60M 8, 130M 16; CPU 4,1; --quick 2,1)')
    args = parser.parse_args(argv)
    if args.grad_accum and not all(a.isdigit() and int(a) > 0 for a in args.grad_accum.split(',')):
        parser.error(f"--grad_accum={args.grad_accum!r}: allowed a comma-separated list of positive integers")
    if not 0 <= args.repeats <= MAX_REPEATS:
        parser.error(f"--repeats={args.repeats}: must be in [0, {MAX_REPEATS:,}] (0 = the device's default)")
    if args.json:   # before the benchmark, not after it (fileio.check_output)
        try:
            check_output(args.json, '--json', make=True)
        except ValueError as e:
            parser.error(str(e))
        if os.path.isfile(args.json) and not earlier_result(args.json):   # a config, a user's file: never replaced
            parser.error(f"--json {args.json} exists and is not a bench.py result (a JSON object with its 'device' "
                         f"and 'torch'); nothing is overwritten: choose another path")
    device = torch.device('cuda' if args.device == 'auto' and torch.cuda.is_available() else
                          'cpu' if args.device == 'auto' else args.device)
    if device.type == 'cuda' and not torch.cuda.is_available():
        parser.error(f"--device={args.device}: CUDA is not available here; use --device=cpu")
    sections = [s for s in (args.sections or 'attn,optim,train' + (',bf16' if device.type == 'cpu' else '')).split(',')
                if s]
    if not sections or any(s not in SECTIONS for s in sections):
        parser.error(f"--sections={args.sections!r}: allowed a comma-separated subset of {','.join(SECTIONS)}")
    if 'bf16' in sections and device.type != 'cpu':
        parser.error("--sections=bf16 compares the CPU configs' precision paths: it runs with --device=cpu")
    if device.type == 'cuda':
        torch.backends.cuda.matmul.allow_tf32 = True   # as train.py
        torch.backends.cudnn.allow_tf32 = True
    p = plan(device, args.quick)
    repeats = args.repeats or p['repeats']
    compile = device.type == 'cuda' if args.compile is None else args.compile

    # a CPU names its model and threads: two CPUs' ratios differ
    name = provenance.device_name(device, detail=f'{torch.get_num_threads()} threads')
    load_start = os.getloadavg()[0]
    busy = (f"the machine was busy at the start: 1-minute load average {load_start:.2f} on {os.cpu_count()} cores"
            if device.type == 'cpu' and load_start > max(0.5, os.cpu_count() / 10) else None)
    if busy:
        log(f"warning: {busy}; CPU timings will scatter")
    res = {'device': name, 'torch': torch.__version__, 'quick': args.quick, 'cpu_count': os.cpu_count(),
           'attention': [], 'optimizer': [], 'train': [], 'bf16': []}
    t0 = time.time()

    def save():   # after every section and training case: a run stopped at its time limit keeps what it measured
        derive(res)
        res['elapsed_s'] = time.time() - t0
        res['load_avg'] = [load_start, os.getloadavg()[0]]
        res['unreliable'] = unreliable(res, busy)
        if args.json:
            try:
                os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
                write_json(args.json, res, indent=1)
            except OSError as e:
                if not disk_full(e):
                    raise
                sys.exit(f"bench.py: error: {disk_full_text(args.json)} (what an earlier section wrote into it is "
                         f"kept)")
    if 'tune' in sections and device.type != 'cuda':
        parser.error("--sections=tune times the Triton kernel's tile shapes: it needs CUDA")
    if 'tune' in sections:
        res['tune'] = bench_tune(device, p['attn_shapes'], repeats, p['warmup'])
        save()
    if 'attn' in sections:
        res['attention'] = bench_attention(device, p['attn_dtype'], p['attn_shapes'], repeats, p['warmup'],
                                           best_of=p['best_of'])
        save()
    if 'optim' in sections:
        res['optimizer'] = bench_optimizer(device, p['optim_sizes'], p['optim_variants'], repeats, p['warmup'],
                                           p['best_of'])
        save()
    if 'train' in sections:
        for size, B, T, accums in p['train_cases']:
            accums = [int(a) for a in args.grad_accum.split(',')] if args.grad_accum else accums
            res['train'] += bench_train(device, size, B, T, p['train_dtype'], compile, repeats,
                                        p['warmup'] + (2 if compile else 0), accums, p['best_of'])
            if device.type == 'cuda':
                torch.cuda.empty_cache()
            save()
    if 'bf16' in sections:
        res['bf16'] = bench_bf16([c[0] for c in BF16_CASES], repeats, p['warmup'], args.quick, p['best_of'])
        save()
    save()
    print(report(res))
    print(f"\n{res['elapsed_s']:.1f} s")
    return res


if __name__ == '__main__':
    run_script(main)
