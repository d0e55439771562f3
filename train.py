"""Train a GPT-2 / Llama-2 style model: softmax, softmax-1 or another attention fix (clipped, gated, sigmoid,
attention bias, sink token), with AdamW, OrthoAdam, RMSProp, SGD or Muon.

    python train.py config/tiny_cpu.py                        # CPU, under a minute
    python train.py config/gpt2_130m.py --attn=softmax1 --optimizer=orthoadam
    torchrun --standalone --nproc_per_node=8 train.py config/gpt2_130m.py
    torchrun --standalone --nproc_per_node=2 train.py config/tiny_cpu.py   # 2 CPU processes (gloo)
    python train.py config/gpt2_130m.py --init_from=resume    # continue exactly where it stopped
    python train.py --help                                    # every config key, its default and meaning
    python train.py config/finetune_smollm2.py                # init_from='hf:...': fine-tune a public model

Every key of DEFAULTS below can be set in a config file or as --key=value (see docs/training.md, "Config keys").
Outputs in out_dir: ckpt.pt (latest checkpoint, what a resume continues), best.pt (lowest validation
loss so far), ckpt_<iter>.pt (with save_every: a checkpoint kept every N iterations), config.json (resolved
config), log.jsonl (one JSON event per line), .lock (held while a run uses the folder). SIGINT/SIGTERM write
a checkpoint and exit; a non-finite loss or a diverging validation loss stops without writing one.
docs/guarantees.md lists what a run promises.
"""
import contextlib
import glob
import hashlib
import json
import math
import os
import re
import signal
import socket
import sys
import tempfile
import time
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

try:
    import fcntl     # the out_dir lock (lock_out_dir); POSIX only
except ImportError:  # Windows: runs go unlocked, with a warning
    fcntl = None

import analyze
from configurator import ConfigError, describe, load_config, save_config
from model import CHOICES as MODEL_CHOICES, GPT, GPTConfig, load_hf
from orthoadam import OrthoAdam
from prepare_c4 import (PrepareError, Progress, duration, eot_offsets, load_meta, load_tokenizer, prepare_again,
                        read_json, tokenizer_mismatch)

DEFAULTS = dict(
    # I/O
    out_dir='out', init_from='scratch', eval_interval=1000, eval_tokens=1_048_576, eval_only=False,
    log_interval=10, always_save_checkpoint=True, save_every=0, divergence_factor=10.0,
    probe_docs=8,    # at every evaluation, analyze.py's metrics on the first probe_docs validation documents (0 = off)
    wandb_log=False, wandb_project='softmax1-orthoadam', wandb_run_name='run',
    # data: data/<dataset>/{train,val}.bin + meta.json (an absolute path works too)
    dataset='c4', batch_size=32, gradient_accumulation_steps=16,   # global accumulation over all ranks
    windows='random',   # 'random': windows start anywhere; 'document': at a document's eot (BOS), see get_batch
    # model (GPTConfig); vocab_size=0 takes it from meta.json
    n_layer=12, n_head=12, n_embd=768, block_size=256, vocab_size=0, dropout=0.0, bias=True,
    attn='softmax', norm='layernorm', pos_emb='absolute', mlp='gelu', causal_free_prefix=0,
    clip_gamma=-0.025, clip_zeta=1.0, sigmoid_bias=None, attn_bias=False, sink_token=False,   # other published fixes
    n_kv_head=0, mlp_hidden=0, rope_base=10000.0, norm_eps=1e-5, tie_embeddings=True,
    # optimiser
    optimizer='adamw', learning_rate=1e-3, weight_decay=0.0, beta1=0.9, beta2=0.999, eps=1e-8,
    momentum=0.9, grad_clip=1.0, muon_lr=0.02, muon_momentum=0.95,
    orthoadam_rotation='hadamard', orthoadam_axes='residual', orthoadam_vocab_axis='skip', orthoadam_seed=0,
    # schedule: linear warmup, cosine decay to min_lr at lr_decay_iters (0 = max_iters of the run's start)
    max_iters=40000, warmup_iters=2000, lr_decay_iters=0, min_lr=1e-4, decay_lr=True,
    # system
    device='auto', dtype='auto', compile=True, seed=1337,
)
CHOICES = dict(
    MODEL_CHOICES,
    windows=('random', 'document'),
    optimizer=('adamw', 'orthoadam', 'rmsprop', 'sgd', 'muon'),
    orthoadam_rotation=('hadamard', 'haar'),
    orthoadam_axes=('all', 'residual'),
    orthoadam_vocab_axis=('skip', 'rotate'),
    dtype=('auto', 'float32', 'bfloat16', 'float16'),
)
# the valid interval of every numeric key (configurator.py checks them)
RANGES = dict(
    eval_interval='[1, inf)', eval_tokens='[1, inf)', log_interval='[1, inf)', save_every='[0, inf)',
    divergence_factor='[0, inf)', probe_docs='[0, inf)',
    batch_size='[1, inf)', gradient_accumulation_steps='[1, inf)',
    n_layer='[1, inf)', n_head='[1, inf)', n_embd='[1, inf)', block_size='[1, inf)', vocab_size='[0, inf)',
    dropout='[0, 1)', causal_free_prefix='[0, inf)',
    learning_rate='(0, inf)', weight_decay='[0, inf)', beta1='[0, 1)', beta2='[0, 1)', eps='(0, inf)',
    momentum='[0, 1)', grad_clip='[0, inf)', orthoadam_seed='[0, inf)',
    max_iters='[1, inf)', warmup_iters='[0, inf)', lr_decay_iters='[0, inf)', min_lr='[0, inf)',
    n_kv_head='[0, inf)', mlp_hidden='[0, inf)', rope_base='(0, inf)', norm_eps='(0, 1)',
    seed='[0, 4294967295]', clip_gamma='(-inf, 0]', clip_zeta='[1, inf)', muon_lr='(0, inf)', muon_momentum='[0, 1)',
)
# one line per key for --help (docs/training.md's table says the same at more length)
HELP = dict(
    out_dir='folder of ckpt.pt, best.pt, config.json, log.jsonl',
    init_from="'scratch' (refuses a folder with a checkpoint), 'resume' (continue ckpt.pt), 'auto' (resume if it exists), "
              "'hf:NAME_OR_DIR' or 'hf:FILE.gguf' (a public model's weights)",
    eval_interval='evaluate every N iterations and at the end',
    eval_tokens='validation tokens per evaluation (a fixed prefix of val.bin)',
    eval_only='evaluate ckpt.pt of out_dir and exit',
    log_interval='progress line and log.jsonl event every N iterations',
    always_save_checkpoint='write ckpt.pt at every evaluation (False: only when val loss improves, and at the end)',
    save_every='also keep ckpt_<iter>.pt every N iterations, never overwritten by later ones (0 = off)',
    divergence_factor='stop (exit 2, no checkpoint written) when val perplexity > factor x the best so far; 0 = off',
    probe_docs="at every evaluation, analyze.py's metrics on the first N validation documents, logged as 'probe'; 0 = off",
    wandb_log='also log the events to wandb', wandb_project='wandb project', wandb_run_name='wandb run name',
    dataset='prepared data folder data/<dataset>, or a path (prepare_c4.py)',
    batch_size='sequences per micro-batch (split over ranks when there are more ranks than micro-batches)',
    gradient_accumulation_steps='micro-batches per iteration over all ranks',
    windows="where training windows start: 'random' (anywhere) or 'document' (at a document's eot, a BOS)",
    n_layer='transformer blocks', n_head='attention heads', n_embd='residual stream width',
    block_size='training sequence length', vocab_size='0 = from meta.json (padded to a multiple of 64)',
    dropout='dropout on embeddings, attention and residual branches',
    bias='biases in Linear layers and LayerNorm', attn='attention normalisation', norm='normalisation layer',
    pos_emb='position encoding', mlp='feed-forward block',
    causal_free_prefix='the first k tokens attend to each other without causal mask',
    n_kv_head='key/value heads (grouped-query attention when fewer than n_head); 0 = n_head',
    mlp_hidden='MLP hidden size; 0 = the default of mlp', rope_base='rotary base theta',
    norm_eps='epsilon of LayerNorm / RMSNorm', tie_embeddings='the LM head is the token embedding matrix',
    clip_gamma="attn='clipped': clip((zeta - gamma) softmax + gamma, 0, 1), gamma <= 0",
    clip_zeta="attn='clipped': the stretch's upper end, zeta >= 1",
    sigmoid_bias="attn='sigmoid': b in sigmoid(s + b); None = -log(block_size)",
    attn_bias='a learnt key and value per head and layer that every query also sees',
    sink_token='a learnt embedding prepended at position 0 of every window (the loss ignores it)',
    optimizer='optimiser', learning_rate='peak learning rate', weight_decay='weight decay on matrices',
    beta1='Adam first-moment decay', beta2="Adam second-moment decay (RMSProp's alpha)", eps='Adam/RMSProp epsilon',
    momentum='SGD and RMSProp momentum (0 = none)', grad_clip='global gradient-norm clipping (0 = off)',
    muon_lr="optimizer='muon': peak lr of Muon's matrices (the rest: learning_rate)",
    muon_momentum="optimizer='muon': Muon's (Nesterov) momentum",
    orthoadam_rotation='OrthoAdam per-axis rotation', orthoadam_axes='OrthoAdam: rotate the residual axes or all',
    orthoadam_vocab_axis="OrthoAdam with axes='all': the embedding's vocabulary axis",
    orthoadam_seed='seed of the OrthoAdam rotations',
    max_iters='iterations to train', warmup_iters='linear warmup iterations',
    lr_decay_iters='cosine reaches min_lr here (0 = max_iters when the run starts; a resume keeps it)',
    min_lr='final learning rate', decay_lr='False: constant learning_rate',
    device="'auto' (cuda if available), 'cpu', 'cuda', 'cuda:N'",
    dtype="'auto' = bfloat16 on CUDA when supported, else float32", compile='torch.compile the model',
    seed='initialisation, dropout and data-sampling seed',
)
# What init_from='resume' may change. Every key is in exactly one of these sets (a test checks).
# May change: the new value is what runs (optimizer param groups, schedule, logging, hardware); each change is
# printed ("changed on resume: key old -> new") and logged ({"event": "resume_change"}).
RESUME_MAY_CHANGE = {
    'out_dir', 'eval_interval', 'eval_tokens', 'log_interval', 'always_save_checkpoint', 'save_every',
    'divergence_factor', 'probe_docs', 'wandb_log', 'wandb_project', 'wandb_run_name',
    'learning_rate', 'min_lr', 'warmup_iters', 'lr_decay_iters', 'decay_lr', 'max_iters',
    'weight_decay', 'beta1', 'beta2', 'eps', 'momentum', 'grad_clip', 'muon_lr', 'muon_momentum',
    'device', 'dtype', 'compile',
    'dataset',   # only its path: the data itself (meta.json's identity) must be the same, see check_resume
}
# Must match: they define what the saved weights, optimizer state and data position mean. The model, the
# optimizer and its rotations; the data sampler (seed, windows, and the global batch: batch_size x
# gradient_accumulation_steps sequences drawn per iteration from an RNG keyed by (seed, iter, micro-batch)).
# A difference is a one-line error listing every such key; nothing in out_dir is touched.
RESUME_MUST_MATCH = {
    'optimizer', 'orthoadam_rotation', 'orthoadam_axes', 'orthoadam_vocab_axis', 'orthoadam_seed',
    'batch_size', 'gradient_accumulation_steps', 'windows', 'seed',
    *(f.name for f in fields(GPTConfig)),
}
# How this invocation starts, not what the run is.
RESUME_IGNORED = {'init_from', 'eval_only'}
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
def device_problem(device):
    """Why `device` cannot run here, as one line, or None: 'auto', 'cpu', 'cuda' and 'cuda:N' of an existing GPU
    are fine (analyze.py and eval_quant.py check their --device with it too)."""
    if device not in ('auto', 'cpu') and not re.fullmatch(r'cuda(:\d+)?', device):
        return f"device={device!r} is not 'auto', 'cpu', 'cuda' or 'cuda:N'"
    if device.startswith('cuda'):
        if not torch.cuda.is_available():
            build = 'a CPU-only build' if torch.version.cuda is None else f'built for CUDA {torch.version.cuda}'
            return (f"device={device!r} but no CUDA GPU is available (torch {torch.__version__} is {build}); "
                    f"use --device=cpu or --device=auto")
        index = int(device.partition(':')[2] or 0)
        if 'RANK' not in os.environ and index >= torch.cuda.device_count():
            return f"device={device!r} but this machine has {torch.cuda.device_count()} GPU(s)"
    return None


def check_launch(cfg, world):
    """Checks that need no process group, so that every rank fails alike before torchrun's rendezvous."""
    problem = device_problem(cfg['device'])
    if problem:
        raise TrainingError(problem)
    if 0 < cfg['divergence_factor'] < 1:
        raise TrainingError(f"divergence_factor={cfg['divergence_factor']} must be 0 (off) or >= 1 "
                            f"(a perplexity ratio to the best so far)")
    rank_share(cfg['gradient_accumulation_steps'], cfg['batch_size'], world, 0)
    try:   # the model's own rules (GPTConfig), before any data is read; vocab_size=0 is resolved later
        GPTConfig(**{k: cfg[k] for k in MODEL_KEYS} | {'vocab_size': cfg['vocab_size'] or 1})
    except ValueError as e:
        raise TrainingError(str(e)) from None


def rank_share(accum, batch_size, world, rank):
    """This rank's part of one iteration: a list of (global micro-batch index, rows of it). The accumulation
    is global: with accum a multiple of world, each rank takes accum/world whole micro-batches; with world a
    multiple of accum, each micro-batch is cut into world/accum equal row blocks, one per rank. Either way
    the iteration's batch and data are those of one process, and the mean of the ranks' losses is its loss."""
    if accum % world == 0:
        n = accum // world
        return [(rank * n + j, slice(None)) for j in range(n)]
    split = world // accum
    if world % accum == 0 and batch_size % split == 0:
        rows = batch_size // split
        return [(rank // split, slice(rank % split * rows, (rank % split + 1) * rows))]
    raise TrainingError(f"{world} ranks cannot share gradient_accumulation_steps={accum} micro-batches of "
                        f"batch_size={batch_size}: make the accumulation a multiple of {world}, or {world} a multiple "
                        f"of the accumulation with batch_size divisible by the quotient")


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


def agree(error):
    """Collective: if any rank has an error (a TrainingError or None), every rank raises the first one, so
    that all ranks stop together with one message (printed by rank 0)."""
    if not dist.is_initialized():
        if error is not None:
            raise error
        return
    errors = [None] * dist.get_world_size()
    dist.all_gather_object(errors, None if error is None else str(error))
    first = next(((r, e) for r, e in enumerate(errors) if e is not None), None)
    if first is not None:
        raise TrainingError(first[1] if first[0] == 0 else f"rank {first[0]}: {first[1]}")


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


SCAN_CHUNK = 1 << 26   # tokens per read when checking a split's token ids


def split_max_token(path, meta, split, rank=0, world=1, device='cpu'):
    """(largest token id, sha256) of a whole split file. Collective: the ranks read interleaved chunks of 2^26
    tokens for the maximum and all-reduce it; rank 0 also reads the chunks in between, in order, for the file's
    sha256 (the other ranks return None for it and wait at the all-reduce) and shows progress for big files.
    The result is cached in <data>/.verified.json under the file's size and mtime_ns, with the sha256 the file
    had then, so a file is read once; a read-only data folder is read at every start."""
    st, name = os.stat(path), os.path.basename(path)
    stamp_path = os.path.join(os.path.dirname(path), '.verified.json')
    stamps = read_json(Path(stamp_path))
    entry = stamps.get(name)
    cached = (isinstance(entry, dict) and entry.get('size') == st.st_size and entry.get('mtime_ns') == st.st_mtime_ns
              and isinstance(entry.get('sha256'), str) and isinstance(entry.get('max_token_id'), int))
    if world > 1:   # one decision for all ranks (another run may write the stamp meanwhile)
        cached = not any_rank(torch.tensor(not cached, device=device))
    if cached:
        return entry['max_token_id'], entry['sha256']
    data, chunk, top, sha = memmap(path, meta), SCAN_CHUNK, 0, hashlib.sha256() if rank == 0 else None
    progress = Progress(f"checking {path} (token ids, sha256)", target_tokens=len(data), unit='chunks')
    for i, lo in enumerate(range(0, len(data), chunk)):
        mine = i % world == rank
        if not mine and sha is None:
            continue
        part = np.asarray(data[lo:lo + chunk])
        if sha is not None:
            sha.update(part)
            progress.update(i + 1, min(lo + chunk, len(data)))
        if mine:
            top = max(top, int(part.max()))
    top = int(all_reduce(torch.tensor(top, device=device), dist.ReduceOp.MAX).item())
    if rank == 0 and time.time() - progress.t0 > 2:
        progress.done(f"max id {top}")
    if rank != 0:
        return top, None
    stamps[name] = {'size': st.st_size, 'mtime_ns': st.st_mtime_ns, 'sha256': sha.hexdigest(), 'max_token_id': top}
    try:   # a unique temporary name: runs starting together on one data folder do not collide
        with tempfile.NamedTemporaryFile('w', dir=os.path.dirname(path), prefix='.verified.', delete=False) as f:
            json.dump(stamps, f, indent=1)
        os.replace(f.name, stamp_path)
    except OSError:
        pass
    return top, stamps[name]['sha256']


def first_token_at_least(path, meta, bound):
    """The position of the first token id >= bound in a split file (read again, only on the way to an error)."""
    data = memmap(path, meta)
    for lo in range(0, len(data), SCAN_CHUNK):
        hits = np.flatnonzero(np.asarray(data[lo:lo + SCAN_CHUNK]) >= bound)
        if len(hits):
            return lo + int(hits[0])
    return None


def verify_tokens(path, meta, split, vocab_size, rank=0, world=1, device='cpu'):
    """Before the first step: every token id of the split is < vocab_size, and the file is the one meta.json
    describes (its sha256 and largest id, where prepare_c4.py recorded them), so that the data identity a
    checkpoint records (meta.json's) is the file's. An error names the file and, where one exists, the position
    of the first offending token. Collective (see split_max_token; only rank 0 knows the sha256, and
    `collectively` gives its error to every rank)."""
    top, sha = split_max_token(path, meta, split, rank, world, device)
    recorded = meta['splits'][split]
    redo = prepare_again(os.path.dirname(path), meta.get('args'))
    if top >= vocab_size:
        raise TrainingError(f"{path} holds token id {top} >= vocab_size {vocab_size} (first such id at token "
                            f"{first_token_at_least(path, meta, vocab_size):,}); the file does not match meta.json "
                            f"(tokenizer {meta.get('tokenizer')!r}, vocab_size {meta['vocab_size']}): {redo}")
    largest = recorded.get('max_token_id')
    if largest is not None and top > largest:
        raise TrainingError(f"{path}: largest token id {top}, but meta.json records {largest} (first larger id at "
                            f"token {first_token_at_least(path, meta, largest + 1):,}); the file changed after it "
                            f"was prepared: {redo}")
    if sha is not None and recorded.get('sha256') and sha != recorded['sha256']:
        raise TrainingError(f"{path} no longer matches meta.json (sha256 {sha[:12]}..., meta.json records "
                            f"{recorded['sha256'][:12]}...); the file changed after it was prepared: {redo}")
    if largest is not None and top != largest:
        raise TrainingError(f"{path}: largest token id {top}, but meta.json records {largest}; the file changed "
                            f"after it was prepared: {redo}")


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


def get_batch(path, meta, cfg, iter_num, micro, device, rows=slice(None)):
    """Training batch `micro` (global micro-batch index across ranks) of iteration `iter_num`, or its `rows`
    (see rank_share). Offsets come from an RNG keyed by (seed, iter, micro), so the data position is a pure
    function of the iteration: resuming or changing the number of ranks at equal global batch sees the same tokens."""
    data = memmap(path, meta)   # re-opened per batch: np.memmap holds pages otherwise
    T, B = cfg['block_size'], cfg['batch_size']
    rng = np.random.default_rng([cfg['seed'], iter_num, micro])
    if cfg['windows'] == 'document':
        starts = window_starts(path, meta, T)
        ix = starts[rng.integers(0, len(starts), size=B)][rows]
    else:
        ix = rng.integers(0, len(data) - T - 1, size=B)[rows]
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


@torch.no_grad()
def probe(raw_model, cfg, meta, path, bos, device):
    """The paper's metrics on the first probe_docs documents of val.bin, measured by analyze.py's own code exactly
    as `analyze.py --ckpt out_dir --max_docs probe_docs` measures the checkpoint: the same documents, the same BOS
    (the checkpoint's), block size and batch size, the analysis path of the un-compiled model in eval mode, float32
    matmuls. Returns analyze.py's summary numbers and per_layer lists under its JSON keys (NaN as None), and
    'documents'. Not collective: rank 0 alone calls it."""
    c = raw_model.config
    lm = analyze.LoadedModel('probe', raw_model, 'ours', bos, c.block_size, c.vocab_size, {}, meta.get('tokenizer_info'))
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False      # the training loop allows TF32; analyze.py does not
    raw_model.eval()
    try:
        result, _ = analyze.analyze(lm, os.path.dirname(path), cfg['probe_docs'], analyze.default_batch_size(device),
                                    device, quiet=True)
    finally:
        raw_model.train()
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return analyze.json_safe({**{k: result[k] for k in result['per_layer']}, 'per_layer': result['per_layer'],
                              'documents': result['data']['documents']})


# ----------------------------------------------------------------------------- optimiser / schedule
class MuonWithAdamW:
    """optimizer='muon': torch.optim.Muon on the weight matrices of the blocks, AdamW on the rest (embeddings and
    LM head, norms, biases, attn_bias and sink vectors), stepped together as one optimizer."""

    def __init__(self, muon, adamw):
        self.muon, self.adamw = muon, adamw

    @property
    def param_groups(self):   # read each time: load_state_dict replaces the parts' group dicts
        return self.muon.param_groups + self.adamw.param_groups

    @property
    def state(self):
        return {**self.muon.state, **self.adamw.state}

    def step(self):
        self.muon.step()
        self.adamw.step()

    def zero_grad(self, set_to_none=True):
        self.muon.zero_grad(set_to_none)
        self.adamw.zero_grad(set_to_none)

    def state_dict(self):
        return {'muon': self.muon.state_dict(), 'adamw': self.adamw.state_dict()}

    def load_state_dict(self, state):
        self.muon.load_state_dict(state['muon'])
        self.adamw.load_state_dict(state['adamw'])


def muon_split(model):
    """(Muon's parameters, AdamW's parameters) by name: the 2-D weights inside the blocks go to Muon (the
    hidden matrices its authors orthogonalise), everything else to AdamW."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    muon = [(n, p) for n, p in named if n.startswith('transformer.h.') and p.dim() == 2]
    return muon, [(n, p) for n, p in named if not (n.startswith('transformer.h.') and p.dim() == 2)]


def configure_optimizer(model, cfg, device_type):
    """Weight decay on matrices only (not on norms, biases, other 1-D params), nanoGPT style."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if cfg['optimizer'] == 'muon':   # Muon takes the blocks' matrices; the groups below are its AdamW part's
        muon, named = muon_split(model)
    decay = [(n, p) for n, p in named if p.dim() >= 2]
    no_decay = [(n, p) for n, p in named if p.dim() < 2]
    groups = [{'params': [p for _, p in decay], 'param_names': [n for n, _ in decay], 'weight_decay': cfg['weight_decay']},
              {'params': [p for _, p in no_decay], 'param_names': [n for n, _ in no_decay], 'weight_decay': 0.0}]
    lr, betas, eps, name = cfg['learning_rate'], (cfg['beta1'], cfg['beta2']), cfg['eps'], cfg['optimizer']
    if name == 'adamw':
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=device_type in ('cuda', 'cpu'))
    if name == 'muon':   # Keller Jordan's conventions: lr 0.02, momentum 0.95, Nesterov, update x sqrt(max(1, rows / cols))
        opt = torch.optim.Muon([{'params': [p for _, p in muon], 'param_names': [n for n, _ in muon], 'muon': True}],
                               lr=cfg['muon_lr'], weight_decay=cfg['weight_decay'], momentum=cfg['muon_momentum'],
                               nesterov=True, adjust_lr_fn='original')
        return MuonWithAdamW(opt, torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps,
                                                    fused=device_type in ('cuda', 'cpu')))
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


def set_lr(optimizer, lr, cfg):
    """The schedule's lr for every group; Muon's groups follow it in proportion (muon_lr at the peak)."""
    for group in optimizer.param_groups:
        group['lr'] = lr * cfg['muon_lr'] / cfg['learning_rate'] if group.get('muon') else lr


def set_hyperparameters(optimizer, cfg):
    """Put cfg's hyperparameters into every param group, as configure_optimizer would set them. Needed after
    load_state_dict, which restores the saved groups' values: a resume runs with the values it records."""
    name = cfg['optimizer']
    for group in optimizer.param_groups:
        group['weight_decay'] = cfg['weight_decay'] if all(p.dim() >= 2 for p in group['params']) else 0.0
        if group.get('muon'):
            group['momentum'] = cfg['muon_momentum']
        elif name in ('adamw', 'orthoadam', 'muon'):   # muon: its AdamW part
            group['betas'], group['eps'] = (cfg['beta1'], cfg['beta2']), cfg['eps']
        elif name == 'rmsprop':
            group['alpha'], group['eps'], group['momentum'] = cfg['beta2'], cfg['eps'], cfg['momentum']
            if cfg['momentum'] > 0:   # momentum switched on: its buffer starts at zero, as in a fresh RMSprop
                for p in group['params']:
                    state = optimizer.state.get(p)
                    if state and 'momentum_buffer' not in state:
                        state['momentum_buffer'] = torch.zeros_like(p)
        else:
            group['momentum'] = cfg['momentum']


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


# ----------------------------------------------------------------------------- resume
def data_identity(meta):
    """What makes prepared data the same data: tokenizer, vocabulary, dtype, eot, and per split its size and sha256."""
    return {'tokenizer': meta.get('tokenizer'), 'vocab_size': meta['vocab_size'], 'eot_token': meta['eot_token'],
            'dtype': meta['dtype'], **{f'{s}_{k}': meta['splits'][s].get(k) for s in ('train', 'val')
                                       for k in ('tokens', 'sha256')}}


def check_resume(cfg, ckpt, meta):
    """Compare a resume's config with the checkpoint's. Raises a one-line TrainingError listing every key
    of RESUME_MUST_MATCH that differs (and a change of the data itself); otherwise returns the changes,
    [(key, old, new)], of RESUME_MAY_CHANGE keys. The schedule's horizon: lr_decay_iters=0 keeps the
    checkpoint's (resolved) value, so a larger max_iters prolongs the run at min_lr instead of silently
    stretching the cosine; an explicit lr_decay_iters is a change like any other."""
    saved = {**DEFAULTS, **(ckpt.get('config') or {}), **ckpt['model_args']}   # keys newer than the checkpoint: defaults
    saved['lr_decay_iters'] = saved['lr_decay_iters'] or saved['max_iters']
    if cfg['lr_decay_iters'] == 0:
        cfg['lr_decay_iters'] = saved['lr_decay_iters']
    differ = [k for k in DEFAULTS if k not in RESUME_IGNORED and saved[k] != cfg[k]]
    errors = [f"{k}: checkpoint {saved[k]!r} vs requested {cfg[k]!r}" for k in differ if k in RESUME_MUST_MATCH]
    old_data = (ckpt.get('data') or {}).get('identity')
    if old_data is not None and old_data != data_identity(meta):
        new_data = data_identity(meta)
        errors.append(f"data {cfg['dataset']}: " + ', '.join(f"{k} {old_data.get(k)!r} -> {new_data.get(k)!r}"
                                                            for k in new_data if old_data.get(k) != new_data.get(k)))
    elif old_data is None and 'dataset' in differ:   # a checkpoint without the data's identity: the path must match
        errors.append(f"dataset: checkpoint {saved['dataset']!r} vs requested {cfg['dataset']!r}")
    if errors:
        raise TrainingError(f"cannot resume {os.path.join(cfg['out_dir'], 'ckpt.pt')} with another config "
                            f"({'; '.join(errors)}); these must match what the checkpoint was trained with "
                            f"(RESUME_MUST_MATCH in train.py): use its values or another --out_dir")
    return [(k, saved[k], cfg[k]) for k in differ]


# ----------------------------------------------------------------------------- out_dir and checkpoints
def check_out_dir(out_dir):
    """Before anything is read or written: out_dir, or the nearest folder above it that exists (where it will be
    made), is a folder this process may write to. claim_out_dir catches what this cannot see (e.g. root on a
    read-only folder)."""
    existing = os.path.abspath(out_dir)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise TrainingError(f"out_dir={out_dir!r}: {existing} is a file, not a folder; choose another --out_dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise TrainingError(f"cannot write to out_dir={out_dir!r} ({existing}: no write permission for this user); "
                            f"choose a writable --out_dir")


def lock_out_dir(out_dir):
    """Hold an exclusive flock on out_dir/.lock for the life of the run; the file names the holder. The
    kernel releases it when the process ends, however it ends, so a killed run never blocks the next. Without
    fcntl (Windows) the file is written but nothing is locked: one warning line, and two runs on one out_dir
    are not refused."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, '.lock')
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    if fcntl is None:
        print(f"warning: no fcntl on this platform: {out_dir} is not locked; do not start a second run on it "
              f"while this one runs", file=sys.stderr)
    else:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 256, 0).decode(errors='replace').strip() or 'an unknown process'
            os.close(fd)
            raise TrainingError(f"{out_dir} is in use by another run ({holder}, see {path}); wait for it to end or "
                                f"stop it, or choose another --out_dir") from None
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
    return fd


def remove_leftovers(out_dir):
    """Temporary files of a save that was killed before its rename (only called with the lock held)."""
    for path in sorted(glob.glob(os.path.join(out_dir, '*.tmp'))):
        os.remove(path)
        print(f"removed {path}, left by an interrupted save")


def file_state(path):
    """(inode, size, mtime) of a file, None if absent: whether out_dir changed between two moments."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def rng_state(device_type):
    return {'torch': torch.get_rng_state(), 'cuda': torch.cuda.get_rng_state() if device_type == 'cuda' else None}


def fsync_dir(path):
    """fsync the folder of path, so that a rename into it survives a crash. Windows cannot open a folder (nor needs
    this for a rename to last): there it is skipped."""
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    except PermissionError:   # Windows: a folder is not a file to open
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(path, ckpt):
    """Atomic: write to a temporary file in the same folder, fsync, then rename over the old one."""
    tmp = f"{path}.tmp"
    with open(tmp, 'wb') as f:
        torch.save(ckpt, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path)


def open_log(path):
    """log.jsonl, opened for appending. A run killed mid-write can leave a torn last line; a newline ends it
    first, so the next event is a line of its own (readers skip the torn one)."""
    f = open(path, 'a')
    if f.tell() > 0:
        with open(path, 'rb') as tail:
            tail.seek(-1, os.SEEK_END)
            if tail.read(1) != b'\n':
                f.write('\n')
    return f


def only_best(ckpt_path, best_path):
    """What to do with an out_dir that holds best.pt but no ckpt.pt (ckpt.pt was deleted or moved)."""
    return (f"{os.path.dirname(ckpt_path) or '.'} holds best.pt but no ckpt.pt; to continue from (or evaluate) the best "
            f"checkpoint: cp {best_path} {ckpt_path}, then --init_from=resume; or choose another --out_dir")


def load_checkpoint(path):
    if not os.path.isfile(path):
        best = os.path.join(os.path.dirname(path), 'best.pt')
        if os.path.isfile(best):
            raise TrainingError(only_best(path, best))
        raise TrainingError(f"no checkpoint at {path} to resume or evaluate; train with --init_from=scratch first")
    try:
        ckpt = torch.load(path, map_location='cpu', weights_only=False)
        if not isinstance(ckpt, dict) or not {'model', 'model_args', 'iter_num'} <= set(ckpt):
            raise ValueError('not a train.py checkpoint')
    except Exception as e:
        best = os.path.join(os.path.dirname(path), 'best.pt')
        other = f"; {best} is the best-validation checkpoint, if it is readable" if os.path.exists(best) else ''
        raise TrainingError(f"cannot read checkpoint {path} ({type(e).__name__}: {' '.join(str(e).split())[:200]}); it is "
                            f"corrupt or not a checkpoint{other}") from None
    return ckpt


def check_model_args(path, ckpt, model_args):
    saved = {f.name: f.default for f in fields(GPTConfig)} | ckpt['model_args']   # older checkpoints lack newer fields
    diff = {k: (saved.get(k), v) for k, v in model_args.items() if saved.get(k) != v}
    if diff:
        desc = ', '.join(f"{k}: checkpoint {a!r} vs requested {b!r}" for k, (a, b) in diff.items())
        raise TrainingError(f"checkpoint {path} was trained with another model config ({desc}); "
                            f"use the checkpoint's settings or another out_dir")


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


def collectively(fn, *args):
    """fn(*args) on this rank; when it raises a TrainingError on any rank, every rank raises the first one."""
    try:
        result, error = fn(*args), None
    except TrainingError as e:
        result, error = None, e
    agree(error)
    return result


def open_run(cfg, ckpt_path, best_path):
    """Everything a run checks before it writes anything; read-only and the same on every rank, so a refused
    run leaves out_dir as it was: the data, the model config, what out_dir holds, and for a resume the
    checkpoint and the changes the resume makes. Returns (meta, paths, ckpt or None, changes, ckpt.pt's
    file_state when it was read), as a dict."""
    if cfg['init_from'] not in INIT_FROM[:3] and not (cfg['init_from'].startswith('hf:') and len(cfg['init_from']) > 3):
        raise TrainingError(f"config key 'init_from' must be one of {', '.join(map(repr, INIT_FROM))}, "
                            f"got {cfg['init_from']!r}")
    if not cfg['eval_only']:
        check_out_dir(cfg['out_dir'])
    if cfg['init_from'] == 'auto':   # resume when out_dir holds a checkpoint, else start from scratch
        cfg['init_from'] = 'resume' if os.path.exists(ckpt_path) else 'scratch'
    if cfg['init_from'] == 'scratch' and not cfg['eval_only']:
        if os.path.exists(ckpt_path):
            raise TrainingError(f"{ckpt_path} exists; continue the run with --init_from=resume, or choose another --out_dir")
        if os.path.exists(best_path):
            raise TrainingError(only_best(ckpt_path, best_path))
        kept = sorted(glob.glob(os.path.join(glob.escape(cfg['out_dir']), 'ckpt_*.pt')))
        if kept:
            raise TrainingError(f"{cfg['out_dir']} holds {len(kept)} ckpt_<iter>.pt file(s) of an earlier run (save_every), "
                                f"e.g. {kept[-1]}; to continue from one: cp it to {ckpt_path}, then --init_from=resume; "
                                f"or choose another --out_dir")
    meta, paths = open_data(cfg)
    pretrained = public_model(cfg, meta) if cfg['init_from'].startswith('hf:') else None
    resume = cfg['init_from'] == 'resume' or (pretrained is not None and os.path.exists(ckpt_path))
    if resume:   # the same hf: command continues its run
        pretrained = None
    if cfg['vocab_size'] == 0:
        cfg['vocab_size'] = meta['vocab_size']
    elif cfg['vocab_size'] < meta['vocab_size']:
        raise TrainingError(f"vocab_size={cfg['vocab_size']} is smaller than the data's vocabulary ({meta['vocab_size']})")
    try:
        GPTConfig(**{k: cfg[k] for k in MODEL_KEYS})
    except ValueError as e:
        raise TrainingError(str(e)) from None
    seen, ckpt, changes = file_state(ckpt_path), None, []
    if resume or cfg['eval_only']:
        ckpt = load_checkpoint(ckpt_path)
        if cfg['eval_only']:
            check_model_args(ckpt_path, ckpt, {k: cfg[k] for k in MODEL_KEYS})
        else:
            changes = check_resume(cfg, ckpt, meta)
    else:   # the schedule's horizon is fixed when the run starts, and recorded
        cfg['lr_decay_iters'] = cfg['lr_decay_iters'] or cfg['max_iters']
    return {'meta': meta, 'paths': paths, 'ckpt': ckpt, 'changes': changes, 'seen': seen, 'pretrained': pretrained}


def check_data(cfg, meta, paths, rank, world, device):
    """Every token id of the splits this run reads, before the first step (collective)."""
    for split in ('val',) if cfg['eval_only'] else ('train', 'val'):
        verify_tokens(paths[split], meta, split, cfg['vocab_size'], rank, world, device)


def claim_out_dir(cfg, ckpt_path, seen):
    """Rank 0, before the first write: the lock on out_dir, a check that no other run changed ckpt.pt
    meanwhile, leftovers of killed saves, config.json. Returns the lock's file descriptor (None: eval_only)."""
    if cfg['eval_only']:
        return None
    try:
        fd = lock_out_dir(cfg['out_dir'])
        try:
            if file_state(ckpt_path) != seen:
                raise TrainingError(f"{ckpt_path} changed while this run was starting (another run wrote it); start again")
            remove_leftovers(cfg['out_dir'])
            save_config(cfg, os.path.join(cfg['out_dir'], 'config.json'))
        except BaseException:
            os.close(fd)
            raise
    except OSError as e:   # e.g. a read-only folder or filesystem
        raise TrainingError(f"cannot write to out_dir={cfg['out_dir']!r} ({e.filename}: {e.strerror}); "
                            f"choose a writable --out_dir") from None
    return fd


def probe_text(iter_num, p):
    """The progress line of a probe (None: nothing was counted, e.g. no document longer than one token)."""
    f = analyze._fmt
    return (f"probe iter {iter_num} ({p['documents']} docs): kurtosis first {f(p['kurtosis_first'], '.2f')} rest "
            f"{f(p['kurtosis_rest'], '.2f')} | max |x| first {f(p['max_abs_first'], '.3g')} rest "
            f"{f(p['max_abs_rest'], '.3g')} | first attn {f(p['first_attn_argmax'], '.3f')} (mass "
            f"{f(p['first_attn_mass'], '.3f')})")


def ppl_text(ppl):
    """Perplexity for a progress line: evaluate() caps it at exp(700) (~1e304) to stay finite."""
    return f"{ppl:.2f}" if ppl < 1e6 else f"{ppl:.3g}" if ppl < 1e304 else '>1e304'


def train(cfg):
    check_launch(cfg, int(os.environ.get('WORLD_SIZE', 1)))   # before the rendezvous: every rank fails alike
    rank, local_rank, world, device, device_type = setup_distributed(cfg)
    master = rank == 0
    share = rank_share(cfg['gradient_accumulation_steps'], cfg['batch_size'], world, rank)
    ckpt_path, best_path = os.path.join(cfg['out_dir'], 'ckpt.pt'), os.path.join(cfg['out_dir'], 'best.pt')
    opened = collectively(open_run, cfg, ckpt_path, best_path)
    collectively(check_data, cfg, opened['meta'], opened['paths'], rank, world, device)
    lock = collectively(claim_out_dir, cfg, ckpt_path, opened['seen']) if master else collectively(lambda: None)
    with contextlib.ExitStack() as cleanup:
        if lock is not None:
            cleanup.callback(os.close, lock)   # closing the file releases the lock
        return run(cfg, rank, local_rank, world, device, device_type, share, opened, cleanup)


def run(cfg, rank, local_rank, world, device, device_type, share, opened, cleanup):
    """The training loop of train(), once the run is checked and (rank 0) holds out_dir."""
    master = rank == 0
    meta, paths, changes = opened['meta'], opened['paths'], opened['changes']
    ckpt = opened.pop('ckpt')   # no reference left elsewhere: its memory goes with `del ckpt` below
    ckpt_path, best_path = os.path.join(cfg['out_dir'], 'ckpt.pt'), os.path.join(cfg['out_dir'], 'best.pt')
    tokens_per_iter = cfg['gradient_accumulation_steps'] * cfg['batch_size'] * cfg['block_size']
    bos = meta['eot_token'] if cfg['windows'] == 'document' else None   # what analyze.py prepends to a document

    torch.manual_seed(cfg['seed'])                   # identical initial weights on every rank
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    model_args = {k: cfg[k] for k in MODEL_KEYS}
    model = GPT(GPTConfig(**model_args))
    pretrained = opened.pop('pretrained')
    if ckpt is not None:
        model.load_state_dict(ckpt['model'])
    elif pretrained is not None:     # the same parameters whatever attn, dropout and block_size say
        model.load_state_dict(pretrained.state_dict())
    del pretrained
    model.to(device)
    optimizer = configure_optimizer(model, cfg, device_type)
    ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[cfg['dtype']]
    scaler = torch.amp.GradScaler(device_type, enabled=cfg['dtype'] == 'float16')
    iter_num, best_val_loss, last_saved = 0, float('inf'), None
    if ckpt is not None:
        if not cfg['eval_only']:
            optimizer.load_state_dict(ckpt['optimizer'])
            set_hyperparameters(optimizer, cfg)        # the values this run records, not the saved groups'
            if scaler.is_enabled() and ckpt.get('scaler'):   # dtype may change on resume: float16 starts a fresh scaler
                scaler.load_state_dict(ckpt['scaler'])
        iter_num, best_val_loss, last_saved = ckpt['iter_num'], ckpt['best_val_loss'], ckpt['iter_num']
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

    def checkpoint(*paths):
        """Write this state to each path in turn, each a file of its own (ckpt.pt before best.pt: a kill in between
        leaves both valid)."""
        states = [None] * world
        if world > 1:
            dist.all_gather_object(states, rng_state(device_type))
        else:
            states = [rng_state(device_type)]
        if not all(torch.isfinite(p).all() for p in raw_model.parameters()):   # same weights on every rank
            raise TrainingError("non-finite weights; not overwriting the last good checkpoint")
        if master:
            contents = {
                'model': raw_model.state_dict(), 'optimizer': optimizer.state_dict(), 'scaler': scaler.state_dict(),
                'model_args': model_args, 'iter_num': iter_num, 'best_val_loss': best_val_loss, 'config': cfg,
                'bos': bos,
                'tokenizer': meta.get('tokenizer_info'), 'rng': states,
                'data': {'sampler': 'keyed by (seed, iter, micro)', 'next_iter': iter_num, 'identity': data_identity(meta)}}
            for path in paths:   # no links between them: a write into one file (a cp onto it, a truncation) leaves the others
                save_checkpoint(path, contents)

    log_file = cleanup.enter_context(open_log(os.path.join(cfg['out_dir'], 'log.jsonl'))) if master and not cfg['eval_only'] else None
    wandb = None
    if master and cfg['wandb_log']:
        try:
            import wandb
        except ImportError:
            raise TrainingError("wandb_log=True but wandb is not installed; pip install wandb") from None
        wandb.init(project=cfg['wandb_project'], name=cfg['wandb_run_name'], config=cfg, resume='allow')
        cleanup.callback(wandb.finish)

    def log(event):
        if log_file:
            log_file.write(json.dumps(event) + '\n')
            log_file.flush()
            if wandb is not None and event['event'] in ('train', 'eval'):   # the probe's summary numbers, not its lists
                wandb.log({k: v for k, v in event.items() if k not in ('event', 'iter', 'probe')}
                          | {f'probe/{k}': v for k, v in event.get('probe', {}).items() if k != 'per_layer'},
                          step=event['iter'])

    for key, old, new in changes:
        log({'event': 'resume_change', 'iter': iter_num, 'key': key, 'old': old, 'new': new})
        if master:
            print(f"changed on resume: {key} {old!r} -> {new!r}")
    if master and {k for k, _, _ in changes} & {'max_iters', 'lr_decay_iters'} == {'max_iters'} and cfg['decay_lr']:
        old_max = next(old for k, old, _ in changes if k == 'max_iters')
        print(f"max_iters {old_max} -> {cfg['max_iters']}: the cosine schedule keeps lr_decay_iters="
              f"{cfg['lr_decay_iters']} (min_lr after it); pass --lr_decay_iters to change it")

    with stop_on_signals() as stop:
        rows = len(range(cfg['batch_size'])[share[0][1]])
        if master:
            print(f"model: {raw_model.num_params() / 1e6:.2f}M parameters | {cfg['optimizer']} | attn={cfg['attn']} "
                  f"norm={cfg['norm']} pos_emb={cfg['pos_emb']} | {world} rank(s) x {len(share)} micro-batches x "
                  f"{rows} x {cfg['block_size']} = {tokens_per_iter:,} tokens/iter | {device} {cfg['dtype']}")
        if cfg['eval_only']:
            val_loss, val_ppl, n = evaluate(model, paths['val'], meta, cfg, rank, world, device, autocast)
            if master:
                print(f"eval at iter {iter_num}: val loss {val_loss:.4f} | val ppl {ppl_text(val_ppl)} ({n:,} tokens)")
            return {'val_loss': val_loss, 'val_ppl': val_ppl, 'iter': iter_num, 'ckpt': ckpt_path}

        flops_per_iter, peak = raw_model.flops_per_token() * tokens_per_iter, peak_flops(device_type)
        nonfinite = torch.zeros((), dtype=torch.bool, device=device)
        loss_sum = torch.zeros((), device=device)
        start_iter, t_start = iter_num, time.time()
        t_log, last_log_iter, result = t_start, iter_num, {}
        x, y = get_batch(paths['train'], meta, cfg, iter_num, share[0][0], device, share[0][1])
        while True:
            if iter_num % cfg['eval_interval'] == 0 or iter_num == cfg['max_iters']:
                if any_rank(nonfinite):
                    raise TrainingError(f"non-finite loss before iteration {iter_num}; stopped, the last good checkpoint "
                                        f"is kept (lower learning_rate or use grad_clip)")
                val_loss, val_ppl, n = evaluate(model, paths['val'], meta, cfg, rank, world, device, autocast)
                result = {'val_loss': val_loss, 'val_ppl': val_ppl, 'iter': iter_num}
                event = {'event': 'eval', 'iter': iter_num, 'val_loss': val_loss, 'val_ppl': val_ppl, 'val_tokens': n,
                         'tokens': iter_num * tokens_per_iter}
                if master and cfg['probe_docs']:   # the other ranks go on and wait at the next collective
                    event['probe'] = probe(raw_model, cfg, meta, paths['val'], bos, device)
                log(event)
                if master:
                    print(f"eval iter {iter_num}: val loss {val_loss:.4f} | val ppl {ppl_text(val_ppl)} ({n:,} tokens)")
                if 'probe' in event:
                    print(probe_text(iter_num, event['probe']))
                factor = cfg['divergence_factor']
                if not math.isfinite(val_loss) or (factor and val_loss > best_val_loss + math.log(factor)):
                    log({'event': 'diverged', 'iter': iter_num, 'val_loss': val_loss, 'best_val_loss': best_val_loss,
                         'divergence_factor': factor})
                    kept = (f"{ckpt_path} (iteration {last_saved}) and {best_path} (the best) are kept"
                            if last_saved is not None else "no checkpoint had been written")
                    raise TrainingError(f"diverged at iteration {iter_num}: val loss {val_loss:.4g} > best "
                                        f"{best_val_loss:.4f} + ln(divergence_factor={factor:g}); stopped without "
                                        f"writing a checkpoint, {kept}; resume with a lower --learning_rate, or "
                                        f"--divergence_factor=0 to train on")
                improved, best_val_loss = val_loss < best_val_loss, min(best_val_loss, val_loss)
                if iter_num > start_iter and (improved or cfg['always_save_checkpoint'] or iter_num == cfg['max_iters']):
                    checkpoint(ckpt_path, *([best_path] if improved else []))
                    last_saved = iter_num
            # save_every: the series ckpt_<iter>.pt, after this iteration's evaluation passed (and at the iteration a
            # resume starts from, when its file is missing: a kill between ckpt.pt and it, or save_every set on resume)
            kept_path = os.path.join(cfg['out_dir'], f'ckpt_{iter_num}.pt')
            if cfg['save_every'] and iter_num % cfg['save_every'] == 0 and iter_num > 0 and (
                    iter_num > start_iter or any_rank(torch.tensor(master and not os.path.exists(kept_path), device=device))):
                if any_rank(nonfinite):
                    raise TrainingError(f"non-finite loss before iteration {iter_num}; stopped, the last good checkpoint "
                                        f"is kept (lower learning_rate or use grad_clip)")
                checkpoint(kept_path)
            if iter_num >= cfg['max_iters']:
                break
            # one optimisation step: this rank's share of the micro-batches, gradients all-reduced on the last only
            lr = get_lr(iter_num, cfg)
            set_lr(optimizer, lr, cfg)
            for j in range(len(share)):
                if world > 1:
                    model.require_backward_grad_sync = j == len(share) - 1
                with autocast:
                    _, loss = model(x, y)
                    loss = loss / len(share)
                nxt_iter, (micro, rows) = (iter_num, share[j + 1]) if j + 1 < len(share) else (iter_num + 1, share[0])
                x, y = get_batch(paths['train'], meta, cfg, nxt_iter, micro, device, rows)  # prefetch
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
                checkpoint(ckpt_path)
                if master:
                    print(f"signal received: checkpoint written at iteration {iter_num} to {ckpt_path}; "
                          f"continue with --init_from=resume")
                result = {'interrupted': True, 'iter': iter_num}
                break
    if world > 1:   # no rank tears down its process group while another still writes the checkpoint
        dist.barrier()
    result['ckpt'] = ckpt_path
    return result


def usage():
    return (f"usage: python train.py [CONFIG_FILE ...] [--key=value ...]\n"
            f"       torchrun --standalone --nproc_per_node=N train.py [CONFIG_FILE ...] [--key=value ...]\n\n"
            f"{__doc__.strip().split(chr(10) * 2)[0]}\nConfig files are Python files setting keys; --key=value takes Python "
            f"literals (bare words are strings). Keys, defaults and meanings:\n\n"
            f"{describe(DEFAULTS, HELP, CHOICES, RANGES)}\n\ndocs/training.md ('Config keys') and docs/guarantees.md.")


def main(argv):
    master = int(os.environ.get('RANK', 0)) == 0   # errors are printed once, by rank 0; every rank exits 2
    if any(a in ('-h', '--help') for a in argv):
        if master:
            print(usage())
        return 0
    try:
        cfg = load_config(DEFAULTS, argv, CHOICES, RANGES)
        result = train(cfg)
    except (ConfigError, TrainingError) as e:
        if master:
            print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if 'val_ppl' in result and master:
        print(f"done: val ppl {ppl_text(result['val_ppl'])} at iteration {result['iter']} | checkpoint {result['ckpt']}")
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
