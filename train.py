"""Train a GPT-2 / Llama-2 style model with softmax or softmax-1 and AdamW, OrthoAdam, RMSProp or SGD.

    python train.py config/tiny_cpu.py                        # CPU, under a minute
    python train.py config/gpt2_130m.py --attn=softmax1 --optimizer=orthoadam
    torchrun --standalone --nproc_per_node=8 train.py config/gpt2_130m.py
    python train.py config/gpt2_130m.py --init_from=resume    # continue exactly where it stopped
    python train.py config/finetune_smollm2.py                # init_from='hf:...': fine-tune a public model

Every key of DEFAULTS below can be set in a config file or as --key=value (see README, "Config keys").
Outputs in out_dir: ckpt.pt (checkpoint), config.json (resolved config), log.jsonl (one JSON event
per line). SIGINT/SIGTERM write a checkpoint and exit; a non-finite loss stops without writing one.
"""
import contextlib
import json
import math
import os
import signal
import sys
import time
from dataclasses import asdict, fields

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from configurator import ConfigError, load_config, save_config
from model import CHOICES as MODEL_CHOICES, GPT, GPTConfig, load_hf
from orthoadam import OrthoAdam
from prepare_c4 import PrepareError, duration, eot_offsets, load_meta, load_tokenizer, tokenizer_mismatch

DEFAULTS = dict(
    # I/O
    out_dir='out', init_from='scratch', eval_interval=1000, eval_tokens=1_048_576, eval_only=False,
    log_interval=10, always_save_checkpoint=True,
    wandb_log=False, wandb_project='softmax1-orthoadam', wandb_run_name='run',
    # data: data/<dataset>/{train,val}.bin + meta.json (an absolute path works too)
    dataset='c4', batch_size=32, gradient_accumulation_steps=16,   # global accumulation over all ranks
    windows='random',   # 'random': windows start anywhere; 'document': at a document's eot (BOS), see get_batch
    # model (GPTConfig); vocab_size=0 takes it from meta.json
    n_layer=12, n_head=12, n_embd=768, block_size=256, vocab_size=0, dropout=0.0, bias=True,
    attn='softmax', norm='layernorm', pos_emb='absolute', mlp='gelu', causal_free_prefix=0,
    n_kv_head=0, mlp_hidden=0, rope_base=10000.0, norm_eps=1e-5, tie_embeddings=True,
    # optimiser
    optimizer='adamw', learning_rate=1e-3, weight_decay=0.0, beta1=0.9, beta2=0.999, eps=1e-8,
    momentum=0.9, grad_clip=1.0,
    orthoadam_rotation='hadamard', orthoadam_axes='residual', orthoadam_vocab_axis='skip', orthoadam_seed=0,
    # schedule: linear warmup, cosine decay to min_lr at lr_decay_iters (0 = max_iters)
    max_iters=40000, warmup_iters=2000, lr_decay_iters=0, min_lr=1e-4, decay_lr=True,
    # system
    device='auto', dtype='auto', compile=True, seed=1337,
)
CHOICES = dict(
    MODEL_CHOICES,
    windows=('random', 'document'),
    optimizer=('adamw', 'orthoadam', 'rmsprop', 'sgd'),
    orthoadam_rotation=('hadamard', 'haar'),
    orthoadam_axes=('all', 'residual'),
    orthoadam_vocab_axis=('skip', 'rotate'),
    dtype=('auto', 'float32', 'bfloat16', 'float16'),
)
MODEL_KEYS = [f.name for f in fields(GPTConfig)]
INIT_FROM = ('scratch', 'resume', 'auto', 'hf:NAME_OR_DIR', 'hf:FILE.gguf')
# the model keys a public model fixes (init_from='hf:...'); attn, dropout, block_size, causal_free_prefix stay the config's
PUBLIC_MODEL_KEYS = ('n_layer', 'n_head', 'n_embd', 'vocab_size', 'bias', 'norm', 'pos_emb', 'mlp', 'n_kv_head',
                     'mlp_hidden', 'rope_base', 'norm_eps', 'tie_embeddings')
# dense bf16 tensor-core peak FLOP/s per device, for MFU (first matching substring wins)
PEAK_FLOPS = [('H200', 989e12), ('H100 PCIe', 756e12), ('H100', 989e12), ('A100', 312e12),
              ('L40S', 362e12), ('A10G', 125e12), ('RTX 4090', 165e12), ('V100', 125e12)]


class TrainingError(RuntimeError):
    """A one-line, user-facing error that ends the run."""


# ----------------------------------------------------------------------------- distributed / device
def setup_distributed(cfg):
    """Returns (rank, local_rank, world_size, device, device_type)."""
    ddp = 'RANK' in os.environ
    if cfg['device'] == 'auto':
        cfg['device'] = 'cuda' if torch.cuda.is_available() else 'cpu'
    if ddp:
        rank, local_rank, world = int(os.environ['RANK']), int(os.environ['LOCAL_RANK']), int(os.environ['WORLD_SIZE'])
        if cfg['device'].startswith('cuda'):
            cfg['device'] = f'cuda:{local_rank}'
            torch.cuda.set_device(cfg['device'])
        dist.init_process_group(backend='nccl' if cfg['device'].startswith('cuda') else 'gloo')
    else:
        rank, local_rank, world = 0, 0, 1
    device_type = 'cuda' if cfg['device'].startswith('cuda') else 'cpu'
    if cfg['dtype'] == 'auto':
        cfg['dtype'] = 'bfloat16' if device_type == 'cuda' and torch.cuda.is_bf16_supported() else 'float32'
    return rank, local_rank, world, cfg['device'], device_type


def all_reduce(t, op=dist.ReduceOp.SUM):
    if dist.is_initialized():
        dist.all_reduce(t, op=op)
    return t


def any_rank(flag):
    """True on every rank when the boolean tensor `flag` is true on any rank."""
    return bool(all_reduce(flag.to(torch.int32), dist.ReduceOp.MAX).item())


def peak_flops(device_type):
    if device_type != 'cuda':
        return None
    name = torch.cuda.get_device_name()
    return next((flops for key, flops in PEAK_FLOPS if key in name), None)


# ----------------------------------------------------------------------------- data
def open_data(cfg):
    """Validate data/<dataset> and return (meta, {'train': path, 'val': path})."""
    data_dir = os.path.join('data', cfg['dataset'])
    try:
        meta = load_meta(data_dir)
    except ValueError as e:
        raise TrainingError(str(e)) from None
    paths = {split: os.path.join(data_dir, f'{split}.bin') for split in ('train', 'val')}
    for split, path in paths.items():
        if meta['splits'][split]['tokens'] < cfg['block_size'] + 1:
            raise TrainingError(f"{path} holds {meta['splits'][split]['tokens']} tokens, fewer than block_size+1="
                                f"{cfg['block_size'] + 1}; prepare more data or lower --block_size")
    return meta, paths


def memmap(path, meta):
    return np.memmap(path, dtype=np.dtype(meta['dtype']), mode='r')


def check_tokens(x, vocab_size, where):
    top = int(x.max())
    if top >= vocab_size:
        raise TrainingError(f"{where} contains token id {top} >= vocab_size {vocab_size}; "
                            f"the data was prepared with another tokenizer (re-run prepare_c4.py or set --vocab_size)")


_starts = {}


def window_starts(path, meta, T):
    """Offsets of the eot tokens of `path` that have T tokens after them: windows='document' starts every
    window there, so position 0 is always an eot acting as BOS (GPT-2's document separator). One pass
    over the file per process, in chunks."""
    key = (path, T)
    if key not in _starts:
        data = memmap(path, meta)
        starts = np.concatenate(list(eot_offsets(data, meta['eot_token'], 1 << 24)))
        _starts[key] = starts[starts < len(data) - T - 1]
        if len(_starts[key]) == 0:
            raise TrainingError(f"{path} has no document with {T} tokens after it for windows='document'; "
                                f"use windows='random' or a smaller block_size")
    return _starts[key]


def get_batch(path, meta, cfg, iter_num, micro, device):
    """Training batch `micro` (global micro-batch index across ranks) of iteration `iter_num`. Offsets
    come from an RNG keyed by (seed, iter, micro), so the data position is a pure function of the
    iteration: resuming or changing the number of ranks at equal global batch sees the same tokens."""
    data = memmap(path, meta)   # re-opened per batch: np.memmap holds pages otherwise
    T, B = cfg['block_size'], cfg['batch_size']
    rng = np.random.default_rng([cfg['seed'], iter_num, micro])
    if cfg['windows'] == 'document':
        starts = window_starts(path, meta, T)
        ix = starts[rng.integers(0, len(starts), size=B)]
    else:
        ix = rng.integers(0, len(data) - T - 1, size=B)
    xy = torch.from_numpy(np.stack([data[i:i + T + 1] for i in ix]).astype(np.int64))
    check_tokens(xy, cfg['vocab_size'], f"{path} (iteration {iter_num})")
    x, y = xy[:, :-1], xy[:, 1:]
    if device.startswith('cuda'):
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.contiguous(), y.contiguous()


@torch.no_grad()
def evaluate(model, path, meta, cfg, rank, world, device, autocast):
    """Mean loss and perplexity on the first eval_tokens of val.bin, cut into non-overlapping windows of
    block_size (+1 target) that are dealt round-robin to the ranks: the same tokens for every run.
    windows='document': the first windows that start at an eot, as in training."""
    data = memmap(path, meta)
    T, B = cfg['block_size'], cfg['batch_size']
    n_windows = max(1, min(cfg['eval_tokens'] // T, (len(data) - 1) // T))
    offsets = window_starts(path, meta, T)[:n_windows] if cfg['windows'] == 'document' else np.arange(n_windows) * T
    mine = list(offsets[rank::world])
    total = torch.zeros(2, dtype=torch.float64, device=device)   # (sum of losses, number of targets)
    skipped = max(cfg['causal_free_prefix'] - 1, 0)                # targets the loss ignores per window
    model.eval()
    for start in range(0, len(mine), B):
        xy = torch.from_numpy(np.stack([data[w:w + T + 1] for w in mine[start:start + B]]).astype(np.int64))
        check_tokens(xy, cfg['vocab_size'], path)
        xy = xy.to(device)
        with autocast:
            _, loss = model(xy[:, :-1], xy[:, 1:])
        n = xy.size(0) * (T - skipped)
        total += torch.tensor([loss.item() * n, n], dtype=torch.float64, device=device)
    model.train()
    all_reduce(total)
    val_loss = (total[0] / total[1]).item()
    return val_loss, math.exp(min(val_loss, 700.0)), int(total[1].item())


# ----------------------------------------------------------------------------- optimiser / schedule
def configure_optimizer(model, cfg, device_type):
    """Weight decay on matrices only (not on norms, biases, other 1-D params), nanoGPT style."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    decay = [(n, p) for n, p in named if p.dim() >= 2]
    no_decay = [(n, p) for n, p in named if p.dim() < 2]
    groups = [{'params': [p for _, p in decay], 'param_names': [n for n, _ in decay], 'weight_decay': cfg['weight_decay']},
              {'params': [p for _, p in no_decay], 'param_names': [n for n, _ in no_decay], 'weight_decay': 0.0}]
    lr, betas, eps, name = cfg['learning_rate'], (cfg['beta1'], cfg['beta2']), cfg['eps'], cfg['optimizer']
    if name == 'adamw':
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=device_type in ('cuda', 'cpu'))
    if name == 'rmsprop':   # weight decay here is torch's coupled L2 term
        return torch.optim.RMSprop(groups, lr=lr, alpha=cfg['beta2'], eps=eps, momentum=cfg['momentum'])
    if name == 'sgd':
        return torch.optim.SGD(groups, lr=lr, momentum=cfg['momentum'])
    if cfg['orthoadam_vocab_axis'] == 'skip':   # token embedding and LM head (tied or not): vocabulary axis unrotated
        vocab = [model.transformer.wte.weight, model.lm_head.weight]
        keep = [i for i, p in enumerate(groups[0]['params']) if any(p is v for v in vocab)]
        groups.append({'params': [groups[0]['params'][i] for i in keep],
                       'param_names': [groups[0]['param_names'][i] for i in keep],
                       'weight_decay': cfg['weight_decay'], 'skip_axes': (0,)})
        for key in ('params', 'param_names'):
            groups[0][key] = [x for i, x in enumerate(groups[0][key]) if i not in keep]
    return OrthoAdam(groups, lr=lr, betas=betas, eps=eps, rotation=cfg['orthoadam_rotation'],
                     axes=cfg['orthoadam_axes'], residual_dim=cfg['n_embd'], seed=cfg['orthoadam_seed'])


def get_lr(it, cfg):
    """Linear warmup to learning_rate, cosine decay to min_lr at lr_decay_iters, then min_lr."""
    if not cfg['decay_lr']:
        return cfg['learning_rate']
    decay_iters = cfg['lr_decay_iters'] or cfg['max_iters']
    if it < cfg['warmup_iters']:
        return cfg['learning_rate'] * (it + 1) / (cfg['warmup_iters'] + 1)
    if it >= decay_iters:
        return cfg['min_lr']
    ratio = (it - cfg['warmup_iters']) / max(1, decay_iters - cfg['warmup_iters'])
    return cfg['min_lr'] + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg['learning_rate'] - cfg['min_lr'])


# ----------------------------------------------------------------------------- checkpoints
def rng_state(device_type):
    return {'torch': torch.get_rng_state(), 'cuda': torch.cuda.get_rng_state() if device_type == 'cuda' else None}


def save_checkpoint(path, ckpt):
    """Atomic: write to a temporary file in the same folder, fsync, then rename over the old one."""
    tmp = f"{path}.tmp"
    with open(tmp, 'wb') as f:
        torch.save(ckpt, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path, model_args):
    if not os.path.isfile(path):
        raise TrainingError(f"no checkpoint at {path} to resume or evaluate; train with --init_from=scratch first")
    try:
        ckpt = torch.load(path, map_location='cpu', weights_only=False)
    except Exception as e:
        raise TrainingError(f"cannot read checkpoint {path} ({type(e).__name__}: {e}); it is corrupt or not a checkpoint")
    saved = {f.name: f.default for f in fields(GPTConfig)} | ckpt['model_args']   # older checkpoints lack newer keys
    diff = {k: (saved.get(k), v) for k, v in model_args.items() if saved.get(k) != v}
    if diff:
        desc = ', '.join(f"{k}: checkpoint {a!r} vs requested {b!r}" for k, (a, b) in diff.items())
        raise TrainingError(f"checkpoint {path} was trained with another model config ({desc}); "
                            f"use the checkpoint's settings or another out_dir")
    return ckpt


# ----------------------------------------------------------------------------- public models
def public_model(cfg, meta):
    """init_from='hf:NAME_OR_DIR' or 'hf:FILE.gguf': a GPT holding the public model's weights (GPT.from_hf). The
    model keys it fixes (PUBLIC_MODEL_KEYS) are written into cfg; attn, dropout, block_size and causal_free_prefix
    stay the config's, so e.g. attn='softmax1' fine-tunes the pretrained weights with softmax-1. The data must be
    tokenised with the model's own tokenizer (prepare_c4.py --tokenizer hf:...)."""
    spec = cfg['init_from'][3:]
    try:
        hf = load_hf(spec)
        pretrained = GPT.from_hf(hf, block_size=cfg['block_size'])
    except ValueError as e:
        raise TrainingError(str(e)) from None
    try:
        mismatch = tokenizer_mismatch(meta.get('tokenizer_info'), load_tokenizer(f'hf:{spec}').record())
    except PrepareError:
        mismatch = None    # the model came without a tokenizer: only the vocabulary bound is checked
    if mismatch:
        raise TrainingError(f"data/{cfg['dataset']} does not fit {spec}: {mismatch}; prepare the data with "
                            f"python prepare_c4.py --tokenizer hf:{spec} ... and point --dataset at it")
    for k in PUBLIC_MODEL_KEYS:
        cfg[k] = getattr(pretrained.config, k)
    return pretrained


# ----------------------------------------------------------------------------- training
@contextlib.contextmanager
def stop_on_signals():
    """Yields a dict whose 'signal' is set by SIGINT/SIGTERM (checked once per step); restores handlers."""
    stop = {'signal': None}

    def on_signal(signum, _frame):
        stop['signal'] = signum
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def train(cfg):
    rank, local_rank, world, device, device_type = setup_distributed(cfg)
    master = rank == 0
    accum_global = cfg['gradient_accumulation_steps']
    if accum_global % world:
        raise TrainingError(f"gradient_accumulation_steps={accum_global} must be a multiple of the number of ranks ({world})")
    accum = accum_global // world
    ckpt_path = os.path.join(cfg['out_dir'], 'ckpt.pt')
    if cfg['init_from'] not in INIT_FROM[:3] and not (cfg['init_from'].startswith('hf:') and len(cfg['init_from']) > 3):
        raise TrainingError(f"config key 'init_from' must be one of {', '.join(map(repr, INIT_FROM))}, "
                            f"got {cfg['init_from']!r}")
    if cfg['init_from'] == 'auto':   # resume when out_dir holds a checkpoint, else start from scratch
        cfg['init_from'] = 'resume' if os.path.exists(ckpt_path) else 'scratch'
    if cfg['init_from'] == 'scratch' and os.path.exists(ckpt_path) and not cfg['eval_only']:
        raise TrainingError(f"{ckpt_path} exists; continue it with --init_from=resume, or choose another --out_dir")

    meta, paths = open_data(cfg)
    pretrained = public_model(cfg, meta) if cfg['init_from'].startswith('hf:') else None
    resume = cfg['init_from'] == 'resume' or (pretrained is not None and os.path.exists(ckpt_path))
    if cfg['vocab_size'] == 0:
        cfg['vocab_size'] = meta['vocab_size']
    elif cfg['vocab_size'] < meta['vocab_size']:
        raise TrainingError(f"vocab_size={cfg['vocab_size']} is smaller than the data's vocabulary ({meta['vocab_size']})")
    if master and not cfg['eval_only']:
        os.makedirs(cfg['out_dir'], exist_ok=True)
        save_config(cfg, os.path.join(cfg['out_dir'], 'config.json'))
    tokens_per_iter = accum_global * cfg['batch_size'] * cfg['block_size']

    torch.manual_seed(cfg['seed'])                   # identical initial weights on every rank
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    model_args = {k: cfg[k] for k in MODEL_KEYS}
    try:
        gptconf = GPTConfig(**model_args)
    except ValueError as e:
        raise TrainingError(str(e)) from None
    model = GPT(gptconf)
    ckpt = load_checkpoint(ckpt_path, model_args) if resume or cfg['eval_only'] else None
    if ckpt is not None:
        model.load_state_dict(ckpt['model'])
    elif pretrained is not None:     # the same parameters whatever attn, dropout and block_size say
        model.load_state_dict(pretrained.state_dict())
    del pretrained
    model.to(device)
    optimizer = configure_optimizer(model, cfg, device_type)
    ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[cfg['dtype']]
    scaler = torch.amp.GradScaler(device_type, enabled=cfg['dtype'] == 'float16')
    iter_num, best_val_loss = 0, float('inf')
    if ckpt is not None:
        if not cfg['eval_only']:
            optimizer.load_state_dict(ckpt['optimizer'])
            scaler.load_state_dict(ckpt['scaler'])
        iter_num, best_val_loss = ckpt['iter_num'], ckpt['best_val_loss']
        states = ckpt['rng']
        state = states[rank] if len(states) == world else states[0]
        torch.set_rng_state(state['torch'])
        if device_type == 'cuda' and state['cuda'] is not None:
            torch.cuda.set_rng_state(state['cuda'])
        del ckpt
    else:
        torch.manual_seed(cfg['seed'] + rank)         # per-rank dropout streams
        if device_type == 'cuda':
            torch.cuda.manual_seed(cfg['seed'] + rank)
    raw_model = model
    if cfg['compile']:
        model = torch.compile(model)
    if world > 1:
        model = DDP(model, device_ids=[local_rank] if device_type == 'cuda' else None)
    autocast = (torch.autocast(device_type=device_type, dtype=ptdtype) if ptdtype != torch.float32
                else contextlib.nullcontext())

    def checkpoint():
        states = [None] * world
        if world > 1:
            dist.all_gather_object(states, rng_state(device_type))
        else:
            states = [rng_state(device_type)]
        if not all(torch.isfinite(p).all() for p in raw_model.parameters()):   # same weights on every rank
            raise TrainingError("non-finite weights; not overwriting the last good checkpoint")
        if master:
            save_checkpoint(ckpt_path, {
                'model': raw_model.state_dict(), 'optimizer': optimizer.state_dict(), 'scaler': scaler.state_dict(),
                'model_args': model_args, 'iter_num': iter_num, 'best_val_loss': best_val_loss, 'config': cfg,
                'bos': meta['eot_token'] if cfg['windows'] == 'document' else None,
                'tokenizer': meta.get('tokenizer_info'),
                'rng': states, 'data': {'sampler': 'keyed by (seed, iter, micro)', 'next_iter': iter_num}})

    log_file = open(os.path.join(cfg['out_dir'], 'log.jsonl'), 'a') if master else None
    wandb = None
    if master and cfg['wandb_log']:
        try:
            import wandb
        except ImportError:
            raise TrainingError("wandb_log=True but wandb is not installed; pip install wandb") from None
        wandb.init(project=cfg['wandb_project'], name=cfg['wandb_run_name'], config=cfg, resume='allow')

    def log(event):
        if master:
            log_file.write(json.dumps(event) + '\n')
            log_file.flush()
            if wandb is not None:
                wandb.log({k: v for k, v in event.items() if k not in ('event', 'iter')}, step=event['iter'])

    with stop_on_signals() as stop:
        if master:
            print(f"model: {raw_model.num_params() / 1e6:.2f}M parameters | {cfg['optimizer']} | attn={cfg['attn']} "
                  f"norm={cfg['norm']} pos_emb={cfg['pos_emb']} | {world} rank(s) x {accum} micro-batches x "
                  f"{cfg['batch_size']} x {cfg['block_size']} = {tokens_per_iter:,} tokens/iter | {device} {cfg['dtype']}")
        if cfg['eval_only']:
            val_loss, val_ppl, n = evaluate(model, paths['val'], meta, cfg, rank, world, device, autocast)
            if master:
                print(f"eval at iter {iter_num}: val loss {val_loss:.4f} | val ppl {val_ppl:.2f} ({n:,} tokens)")
            return {'val_loss': val_loss, 'val_ppl': val_ppl, 'iter': iter_num}

        flops_per_iter, peak = raw_model.flops_per_token() * tokens_per_iter, peak_flops(device_type)
        nonfinite = torch.zeros((), dtype=torch.bool, device=device)
        loss_sum = torch.zeros((), device=device)
        start_iter, t_start = iter_num, time.time()
        t_log, last_log_iter, result = t_start, iter_num, {}
        x, y = get_batch(paths['train'], meta, cfg, iter_num, rank * accum, device)
        while True:
            if iter_num % cfg['eval_interval'] == 0 or iter_num == cfg['max_iters']:
                if any_rank(nonfinite):
                    raise TrainingError(f"non-finite loss before iteration {iter_num}; stopped, the last good checkpoint "
                                        f"is kept (lower learning_rate or use grad_clip)")
                val_loss, val_ppl, n = evaluate(model, paths['val'], meta, cfg, rank, world, device, autocast)
                improved, best_val_loss = val_loss < best_val_loss, min(best_val_loss, val_loss)
                result = {'val_loss': val_loss, 'val_ppl': val_ppl, 'iter': iter_num}
                log({'event': 'eval', 'iter': iter_num, 'val_loss': val_loss, 'val_ppl': val_ppl, 'val_tokens': n,
                     'tokens': iter_num * tokens_per_iter})
                if master:
                    print(f"eval iter {iter_num}: val loss {val_loss:.4f} | val ppl {val_ppl:.2f} ({n:,} tokens)")
                if iter_num > start_iter and (improved or cfg['always_save_checkpoint'] or iter_num == cfg['max_iters']):
                    checkpoint()
            if iter_num >= cfg['max_iters']:
                break
            # one optimisation step: accum micro-batches per rank, gradients all-reduced on the last only
            lr = get_lr(iter_num, cfg)
            for group in optimizer.param_groups:
                group['lr'] = lr
            for micro in range(accum):
                if world > 1:
                    model.require_backward_grad_sync = micro == accum - 1
                with autocast:
                    _, loss = model(x, y)
                    loss = loss / accum
                nxt = (iter_num, micro + 1) if micro + 1 < accum else (iter_num + 1, 0)
                x, y = get_batch(paths['train'], meta, cfg, nxt[0], rank * accum + nxt[1], device)  # prefetch
                scaler.scale(loss).backward()
                loss_sum += loss.detach()
                nonfinite |= ~torch.isfinite(loss.detach())
            if cfg['grad_clip'] > 0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(raw_model.parameters(), cfg['grad_clip'])
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            iter_num += 1

            if iter_num % cfg['log_interval'] == 0 or iter_num == cfg['max_iters']:
                loss_avg = all_reduce(loss_sum.clone()).item() / world / (iter_num - last_log_iter)
                if not math.isfinite(loss_avg):   # a NaN on any rank makes the all-reduced sum NaN
                    raise TrainingError(f"non-finite loss at iteration {iter_num}; stopped, the last good checkpoint "
                                        f"is kept (lower learning_rate or use grad_clip)")
                loss_sum.zero_()
                if device_type == 'cuda':
                    torch.cuda.synchronize()
                now = time.time()
                tok_s = (iter_num - last_log_iter) * tokens_per_iter / (now - t_log)
                mfu = flops_per_iter * (iter_num - last_log_iter) / (now - t_log) / world / peak if peak else None
                eta = (cfg['max_iters'] - iter_num) * (now - t_start) / (iter_num - start_iter)
                t_log, last_log_iter = now, iter_num
                log({'event': 'train', 'iter': iter_num, 'loss': loss_avg, 'lr': lr, 'tokens': iter_num * tokens_per_iter,
                     'tokens_per_s': tok_s, 'mfu': mfu, 'elapsed_s': now - t_start})
                if master:
                    mfu_s = f" | mfu {100 * mfu:.1f}%" if mfu is not None else ''
                    print(f"iter {iter_num}/{cfg['max_iters']} | loss {loss_avg:.4f} | lr {lr:.2e} | {tok_s:,.0f} tok/s"
                          f"{mfu_s} | eta {duration(eta)}", flush=True)
            stopping = stop['signal'] is not None
            if world > 1:   # every rank must agree to stop at the same iteration (one tiny all-reduce per step)
                stopping = any_rank(torch.tensor(stopping, device=device))
            if stopping:
                if any_rank(nonfinite):
                    raise TrainingError(f"non-finite loss before iteration {iter_num}; the last good checkpoint is kept")
                checkpoint()
                if master:
                    print(f"signal received: checkpoint written at iteration {iter_num} to {ckpt_path}; "
                          f"continue with --init_from=resume")
                result = {'interrupted': True, 'iter': iter_num}
                break
    if log_file:
        log_file.close()
    if wandb is not None:
        wandb.finish()
    if world > 1:   # no rank tears down its process group while another still writes the checkpoint
        dist.barrier()
    result['ckpt'] = ckpt_path
    return result


def main(argv):
    try:
        cfg = load_config(DEFAULTS, argv, CHOICES)
        result = train(cfg)
    except (ConfigError, TrainingError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if 'val_ppl' in result and int(os.environ.get('RANK', 0)) == 0:
        print(f"done: val ppl {result['val_ppl']:.2f} at iteration {result['iter']} | checkpoint {result['ckpt']}")
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
