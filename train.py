"""Train a GPT-2 / Llama-2 style model: softmax, softmax-1 or another attention fix (clipped, gated, sigmoid, softpick,
ReLU, attention bias, sink token), with AdamW, OrthoAdam, RMSProp, SGD or Muon.

    python train.py config/tiny_cpu.py                        # CPU, under a minute
    python train.py config/gpt2_130m.py --attn=softmax1 --optimizer=orthoadam
    torchrun --standalone --nproc_per_node=8 train.py config/gpt2_130m.py
    torchrun --standalone --nproc_per_node=2 train.py config/tiny_cpu.py   # 2 CPU processes (gloo)
    python train.py config/gpt2_130m.py --init_from=resume    # continue exactly where it stopped
    python train.py --help                                    # every config key, its default and meaning
    python train.py config/finetune_smollm2.py                # init_from='hf:...': fine-tune a public model

Every key of DEFAULTS (harness/train_config.py, the config schema) can be set in a config file or as --key=value (see docs/training.md, "Config keys").
Outputs in out_dir: ckpt.pt (latest checkpoint, what a resume continues), best.pt (lowest validation
loss so far), ckpt_<iter>.pt (with save_every: a checkpoint kept every N iterations), config.json (resolved
config), log.jsonl (one JSON event per line), .lock (held while a run uses the folder). SIGINT/SIGTERM write
a checkpoint and exit 128 + its number (130, 143; max_minutes: 0); a non-finite or diverging loss writes none.
docs/guarantees.md lists what a run promises. Read top to bottom: train() is the run in nanoGPT's order (config,
data, model, optimizer, loop), training_loop() the loop, each of its steps a function below it.
"""
from harness.entry import early_exit_on_signal   # first: a signal while torch loads is one line, not a traceback
early_exit_on_signal(__name__)

import contextlib
import glob
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from configurator import ConfigError, describe, load_config
from harness import fsdp, measure, provenance
from harness.devices import (agree, all_reduce, any_rank, available_memory, device_problem, lost_peer, lost_peer_text,
                             memory_problem, peak_flops, rank_share, report_error, setup_distributed, teardown)
from harness.entry import run_script
from harness.fileio import disk_full, disk_full_text, duration
from harness.optimizers import configure_optimizer, get_lr, set_hyperparameters, set_lr
from harness.runs import (LoadedModel, check_model_args, check_out_dir, check_resume, continue_advice, file_state,
                          load_checkpoint,
                          lock_out_dir, only_best, open_log, public_model, remove_leftovers, rng_state, save_checkpoint,
                          save_config)
from harness.tables import json_safe, ppl_text, probe_text
from harness.train_config import CHOICES, DEFAULTS, HELP, INIT_FROM, MODEL_KEYS, RANGES, TrainingError
from harness.train_data import check_tokens, data_identity, eval_windows, get_batch, memmap, open_data, verify_tokens
from model import GPT, GPTConfig


# --------------------------------------------------------------------- the run: config, data, model, optimizer, loop
@dataclass
class Run:
    """One run as the training loop sees it: what it reads (config, data, ranks), the model and optimizer, and the
    counters a checkpoint saves. Plain fields; the steps below are plain functions of it."""
    cfg: dict
    meta: dict
    paths: dict
    rank: int
    world: int
    device: str
    device_type: str
    share: list
    bos: int | None              # what analyze.py prepends to a document (the checkpoint records it)
    ckpt_path: str
    best_path: str
    model_args: dict = None
    model: torch.nn.Module = None         # what the steps call: compiled and/or wrapped in DDP
    raw_model: GPT = None                 # the plain module: its weights are what a checkpoint saves
    optimizer: object = None
    scaler: object = None
    autocast: object = None
    iter_num: int = 0
    best_val_loss: float = float('inf')
    last_saved: int | None = None
    log: object = None                    # log(event): one line of log.jsonl (rank 0), and wandb
    tokens_per_iter: int = 0              # global batch x block size
    start_iter: int = 0                   # the loop's state (training_loop sets it): where this job started, the
    t_start: float = 0.0                  # last progress line, the losses since then and whether any was not
    t_log: float = 0.0                    # finite (tensors: no device sync per step)
    last_log_iter: int = 0
    loss_sum: torch.Tensor = None
    nonfinite: torch.Tensor = None

    @property
    def master(self):
        return self.rank == 0


def train(cfg):
    """One run in nanoGPT's order: config, data, model, optimizer, then the loop, whose evaluations write the
    checkpoints; every check before the first write, alike on every rank. Returns the last evaluation and 'ckpt'."""
    # config: the checks that need no process group, the ranks, then what out_dir holds and what a resume changes
    check_launch(cfg, int(os.environ.get('WORLD_SIZE', 1)))   # before the rendezvous: every rank fails alike
    rank, local_rank, world, device, device_type = setup_distributed(cfg)
    share = rank_share(cfg['gradient_accumulation_steps'], cfg['batch_size'], world, rank)
    ckpt_path, best_path = os.path.join(cfg['out_dir'], 'ckpt.pt'), os.path.join(cfg['out_dir'], 'best.pt')
    opened = collectively(open_run, cfg, ckpt_path, best_path)
    meta = opened['meta']
    # data: every token id of the splits this run reads; then rank 0 takes out_dir (the lock, config.json)
    collectively(check_data, cfg, meta, opened['paths'], rank, world, device)
    if rank == 0 and (note := eval_windows(opened['paths']['val'], meta, cfg)[1]):   # eval_tokens cut or rounded
        print(note)
    lock = (collectively(claim_out_dir, cfg, ckpt_path, opened['seen'], opened['finished']) if rank == 0
            else collectively(lambda: None))
    with contextlib.ExitStack() as cleanup:
        if lock is not None:
            cleanup.callback(os.close, lock)   # closing the file releases the lock
        r = Run(cfg, meta, opened['paths'], rank, world, device, device_type, share, ckpt_path=ckpt_path,
                best_path=best_path, bos=meta['eot_token'] if cfg['windows'] == 'document' else None,
                tokens_per_iter=cfg['gradient_accumulation_steps'] * cfg['batch_size'] * cfg['block_size'])
        ckpt = opened.pop('ckpt')   # no reference left elsewhere: its memory goes with `del ckpt` below
        # model: fresh, or the checkpoint's or a public model's weights; optimizer: its state when resuming
        build_model(r, ckpt, opened.pop('pretrained'))
        build_optimizer(r, ckpt)
        del ckpt
        compile_and_wrap(r, local_rank)
        open_logging(r, cleanup)
        report_changes(r, [] if opened['finished'] else opened['changes'])   # a finished run applies none
        with stop_on_signals() as stop:
            rows = len(range(cfg['batch_size'])[share[0][1]])
            if r.master:
                print(f"model: {r.raw_model.num_params() / 1e6:.2f}M parameters | {cfg['optimizer']} | "
                      f"attn={cfg['attn']} norm={cfg['norm']} pos_emb={cfg['pos_emb']} | {world} rank(s) x {len(share)} "
                      f"micro-batches x {rows} x {cfg['block_size']} = {r.tokens_per_iter:,} tokens/iter | {device} "
                      f"{cfg['dtype']}")
            finished = r.last_saved is not None and r.iter_num >= cfg['max_iters'] and not cfg['eval_only']
            if finished and r.master:   # e.g. the main job run a second time (init_from='auto')
                print(f"{r.ckpt_path} is a finished run (iteration {r.iter_num} of max_iters={cfg['max_iters']}): "
                      f"nothing to train, its evaluation again (not added to log.jsonl); raise --max_iters to train on")
            if cfg['eval_only'] or finished:
                return evaluate_only(r)
            r.log({'event': 'provenance', 'iter': r.iter_num, **provenance.record(device, meta)})   # each job logs one
            result = training_loop(r, stop)
        if world > 1:   # no rank tears down its process group while another still writes the checkpoint
            dist.barrier()
        print(fsdp.peak_memory_text(rank, device_type, device), flush=True)   # every rank
        result['ckpt'] = r.ckpt_path
        return result


# ----------------------------------------------------------------------------- config
def check_launch(cfg, world):
    """Checks that need no process group, so that every rank fails alike before torchrun's rendezvous."""
    problem = device_problem(cfg['device'])
    if problem:
        raise TrainingError(problem)
    if 0 < cfg['divergence_factor'] < 1:
        raise TrainingError(f"divergence_factor={cfg['divergence_factor']} must be 0 (off) or >= 1 "
                            f"(a perplexity ratio to the best so far)")
    if cfg['probe_interval'] and not cfg['probe_docs']:
        raise TrainingError(f"probe_interval={cfg['probe_interval']} asks for a probe every {cfg['probe_interval']} iterations, "
                            f"but probe_docs=0 turns the probe off: set probe_docs=N (N > 0) or probe_interval=0")
    rank_share(cfg['gradient_accumulation_steps'], cfg['batch_size'], world, 0)
    fsdp.check_fsdp(cfg, world)
    try:   # the model's own rules (GPTConfig), before any data is read; vocab_size=0 is resolved later
        GPTConfig(**{k: cfg[k] for k in MODEL_KEYS} | {'vocab_size': cfg['vocab_size'] or 1})
    except ValueError as e:
        raise TrainingError(str(e)) from None


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
    seen, ckpt, changes, finished = file_state(ckpt_path), None, [], False
    if resume or cfg['eval_only']:
        ckpt = load_checkpoint(ckpt_path)
        if cfg['eval_only']:
            check_model_args(ckpt_path, ckpt, {k: cfg[k] for k in MODEL_KEYS})
        else:
            changes = check_resume(cfg, ckpt, meta)
            fsdp.check_sharded(ckpt, ckpt_path, cfg['fsdp'])
            finished = ckpt['iter_num'] >= cfg['max_iters']   # nothing to train: nothing is recorded either
    else:   # the schedule's horizon is fixed when the run starts, and recorded
        cfg['lr_decay_iters'] = cfg['lr_decay_iters'] or cfg['max_iters']
    return {'meta': meta, 'paths': paths, 'ckpt': ckpt, 'changes': changes, 'seen': seen, 'pretrained': pretrained,
            'finished': finished}


def claim_out_dir(cfg, ckpt_path, seen, finished=False):
    """Rank 0, before the first write: the lock on out_dir, a check that no other run changed ckpt.pt
    meanwhile, leftovers of killed saves, config.json (not for a finished run, which trains nothing). Returns the
    lock's file descriptor (None: eval_only)."""
    if cfg['eval_only']:
        return None
    try:
        fd = lock_out_dir(cfg['out_dir'])
        try:
            if file_state(ckpt_path) != seen:
                raise TrainingError(f"{ckpt_path} changed while this run was starting (another run wrote it); start again")
            remove_leftovers(cfg['out_dir'])
            if not finished:
                save_config(cfg, os.path.join(cfg['out_dir'], 'config.json'))
        except BaseException:
            os.close(fd)
            raise
    except OSError as e:   # e.g. a read-only folder or filesystem
        raise TrainingError(f"cannot write to out_dir={cfg['out_dir']!r} ({e.filename}: {e.strerror}); "
                            f"choose a writable --out_dir") from None
    return fd


def collectively(fn, *args):
    """fn(*args) on this rank; when it raises a TrainingError on any rank, every rank raises the first one."""
    try:
        result, error = fn(*args), None
    except TrainingError as e:
        result, error = None, e
    agree(error)
    return result


# ----------------------------------------------------------------------------- data
def check_data(cfg, meta, paths, rank, world, device):
    """Every token id of the splits this run reads, before the first step (collective)."""
    for split in ('val',) if cfg['eval_only'] else ('train', 'val'):
        verify_tokens(paths[split], meta, split, cfg['vocab_size'], rank, world, device)


# ----------------------------------------------------------------------------- model
def build_model(r, ckpt, pretrained):
    """The model, fresh or with the checkpoint's or a public model's weights, on the device (fsdp: sharded)."""
    cfg = r.cfg
    torch.manual_seed(cfg['seed'])                   # identical initial weights on every rank
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    if r.device_type == 'cpu':   # else the tied embedding's gradient is summed in an order that varies from run to
        torch.use_deterministic_algorithms(True)   # run (2 threads): the main job's val ppl moved in its 2nd decimal
    r.model_args = {k: cfg[k] for k in MODEL_KEYS}
    if r.device_type == 'cpu' and (problem := memory_problem(cfg, r.model_args, len(range(cfg['batch_size'])[
            r.share[0][1]]), available_memory())):   # before any allocation: a size no machine has is one line
        raise TrainingError(problem)
    model = GPT(GPTConfig(**r.model_args))
    if ckpt is not None:
        model.load_state_dict(ckpt['model'])
    elif pretrained is not None:     # the same parameters whatever attn, dropout and block_size say
        model.load_state_dict(pretrained.state_dict())
    del pretrained
    model.to(r.device)
    if cfg['fsdp']:   # before the optimizer: it holds the shards (DTensors)
        model = fsdp.shard_model(model, cfg, r.device_type, r.world)
    r.raw_model = model


def compile_and_wrap(r, local_rank):
    """What the steps call: the model compiled and/or wrapped in DDP, and the autocast of the config's dtype."""
    cfg, model = r.cfg, r.raw_model
    ptdtype = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}[cfg['dtype']]
    if cfg['compile']:
        model = torch.compile(model)
    if r.world > 1 and not cfg['fsdp']:
        model = DDP(model, device_ids=[local_rank] if r.device_type == 'cuda' else None)
    r.model = model
    r.autocast = (torch.autocast(device_type=r.device_type, dtype=ptdtype) if ptdtype != torch.float32
                  else contextlib.nullcontext())


# ----------------------------------------------------------------------------- optimizer
def build_optimizer(r, ckpt):
    """The optimizer and gradient scaler; resuming, their state, the counters and each rank's RNG state."""
    cfg, model = r.cfg, r.raw_model
    r.optimizer = configure_optimizer(model, cfg, r.device_type)
    r.scaler = torch.amp.GradScaler(r.device_type, enabled=cfg['dtype'] == 'float16')
    if ckpt is not None:
        if not cfg['eval_only'] and cfg['fsdp']:
            fsdp.load_sharded(model, r.optimizer, r.ckpt_path, ckpt['sharded'])
            set_hyperparameters(r.optimizer, cfg)
        elif not cfg['eval_only']:
            r.optimizer.load_state_dict(ckpt['optimizer'])
            set_hyperparameters(r.optimizer, cfg)        # the values this run records, not the saved groups'
            if r.scaler.is_enabled() and ckpt.get('scaler'):   # dtype may change on resume: float16 starts a fresh scaler
                r.scaler.load_state_dict(ckpt['scaler'])
        r.iter_num, r.best_val_loss, r.last_saved = ckpt['iter_num'], ckpt['best_val_loss'], ckpt['iter_num']
        states = ckpt['rng']
        state = states[r.rank] if len(states) == r.world else states[0]
        torch.set_rng_state(state['torch'])
        if r.device_type == 'cuda' and state['cuda'] is not None:
            torch.cuda.set_rng_state(state['cuda'])
    else:
        torch.manual_seed(cfg['seed'] + r.rank)         # per-rank dropout streams
        if r.device_type == 'cuda':
            torch.cuda.manual_seed(cfg['seed'] + r.rank)


# ----------------------------------------------------------------------------- the loop
def training_loop(r, stop):
    """nanoGPT's loop: evaluate and checkpoint, step, log, until max_iters or a stop (a signal, max_minutes: with a
    checkpoint). Returns the last evaluation's result (or the stop's)."""
    cfg = r.cfg
    r.nonfinite = torch.zeros((), dtype=torch.bool, device=r.device)
    r.loss_sum = torch.zeros((), device=r.device)
    r.start_iter, r.t_start = r.iter_num, time.time()
    r.t_log, r.last_log_iter, result = r.t_start, r.iter_num, {}
    x, y = get_batch(r.paths['train'], r.meta, cfg, r.iter_num, r.share[0][0], r.device, r.share[0][1])
    while True:
        if r.iter_num % cfg['eval_interval'] == 0 or r.iter_num == cfg['max_iters']:
            result = eval_and_save(r)
        elif cfg['probe_interval'] and r.iter_num % cfg['probe_interval'] == 0:
            probe_between(r)
        if cfg['save_every'] and r.iter_num % cfg['save_every'] == 0 and r.iter_num > 0:
            keep_checkpoint(r)
        if r.iter_num >= cfg['max_iters']:
            return result
        lr, x, y = optimisation_step(r, x, y)
        if r.iter_num % cfg['log_interval'] == 0 or r.iter_num == cfg['max_iters']:
            log_progress(r, lr)
        reason = stop_reason(r, stop)
        if reason:
            return stop_with_checkpoint(r, reason)


def optimisation_step(r, x, y):
    """One iteration: this rank's share of the micro-batches, gradients all-reduced on the last only; the next
    batch is fetched while this one runs. Returns (lr, x, y) with the next iteration's first batch."""
    cfg, share = r.cfg, r.share
    lr = get_lr(r.iter_num, cfg)
    set_lr(r.optimizer, lr, cfg)
    for j in range(len(share)):
        if r.world > 1:
            r.model.require_backward_grad_sync = j == len(share) - 1
        with r.autocast:
            _, loss = r.model(x, y)
            loss = loss / len(share)
        nxt_iter, (micro, rows) = (r.iter_num, share[j + 1]) if j + 1 < len(share) else (r.iter_num + 1, share[0])
        x, y = get_batch(r.paths['train'], r.meta, cfg, nxt_iter, micro, r.device, rows)  # prefetch
        r.scaler.scale(loss).backward()
        r.loss_sum += loss.detach()
        r.nonfinite |= ~torch.isfinite(loss.detach())
    if cfg['grad_clip'] > 0:
        r.scaler.unscale_(r.optimizer)
        torch.nn.utils.clip_grad_norm_(r.raw_model.parameters(), cfg['grad_clip'])
    r.scaler.step(r.optimizer)
    r.scaler.update()
    r.optimizer.zero_grad(set_to_none=True)
    r.iter_num += 1
    return lr, x, y


def log_progress(r, lr):
    """The progress line and the train event: mean loss since the last one over the ranks, lr, tokens/s, MFU, eta."""
    cfg, iter_num = r.cfg, r.iter_num
    loss_avg = all_reduce(r.loss_sum.clone()).item() / r.world / (iter_num - r.last_log_iter)
    if not math.isfinite(loss_avg):   # a NaN on any rank makes the all-reduced sum NaN
        raise TrainingError(f"non-finite loss at iteration {iter_num}; stopped, the last good checkpoint "
                            f"is kept (lower learning_rate or use grad_clip)")
    r.loss_sum.zero_()
    if r.device_type == 'cuda':
        torch.cuda.synchronize()
    now, peak = time.time(), peak_flops(r.device_type)
    tok_s = (iter_num - r.last_log_iter) * r.tokens_per_iter / (now - r.t_log)
    flops_per_iter = r.raw_model.flops_per_token() * r.tokens_per_iter
    mfu = flops_per_iter * (iter_num - r.last_log_iter) / (now - r.t_log) / r.world / peak if peak else None
    eta = (cfg['max_iters'] - iter_num) * (now - r.t_start) / (iter_num - r.start_iter)
    r.t_log, r.last_log_iter = now, iter_num
    r.log({'event': 'train', 'iter': iter_num, 'loss': loss_avg, 'lr': lr, 'tokens': iter_num * r.tokens_per_iter,
           'tokens_per_s': tok_s, 'mfu': mfu, 'elapsed_s': now - r.t_start})
    if r.master:
        mfu_s = f" | mfu {100 * mfu:.1f}%" if mfu is not None else ''
        print(f"iter {iter_num}/{cfg['max_iters']} | loss {loss_avg:.4f} | lr {lr:.2e} | {tok_s:,.0f} tok/s"
              f"{mfu_s} | eta {duration(eta)}", flush=True)


def stop_reason(r, stop):
    """The signal received (SIGINT, SIGTERM: its number, on any rank) or 'max_minutes' (a job's time budget) when the
    run stops here, agreed by every rank; else None."""
    cfg = r.cfg
    out_of_time = 0 < cfg['max_minutes'] * 60 <= time.time() - r.t_start and r.iter_num < cfg['max_iters']
    signum = stop['signal'] or 0
    if r.world > 1:
        signum, out_of_time = all_reduce(torch.tensor([signum, out_of_time], device=r.device), dist.ReduceOp.MAX).tolist()
    return signum or ('max_minutes' if out_of_time else None)


def stop_with_checkpoint(r, reason):
    """A stop like the end of a job: ckpt.pt, a 'stopped' event; the next job resumes exactly. A signal's stop returns
    its number (main exits 128 + it), a time budget's exits 0."""
    cfg = r.cfg
    if any_rank(r.nonfinite):
        raise TrainingError(f"non-finite loss before iteration {r.iter_num}; the last good checkpoint is kept")
    checkpoint(r, r.ckpt_path)
    name = None if reason == 'max_minutes' else signal.Signals(reason).name
    why = f"{name} received" if name else f"time budget max_minutes={cfg['max_minutes']:g} reached"
    r.log({'event': 'stopped', 'iter': r.iter_num, 'reason': 'signal' if name else reason} | ({'signal': name} if name else {}))
    if r.master:
        print(f"{why}: checkpoint written at iteration {r.iter_num} to {r.ckpt_path}; continue with --init_from=resume")
    return {'interrupted': True, 'iter': r.iter_num, 'signal': None if name is None else reason}


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


def check_finite(r, nonfinite, when='before'):
    if any_rank(nonfinite):
        raise TrainingError(f"non-finite loss {when} iteration {r.iter_num}; stopped, the last good checkpoint "
                            f"is kept (lower learning_rate or use grad_clip)")


def open_logging(r, cleanup):
    """r.log: an event as one line of log.jsonl (rank 0, not eval_only) and, with wandb_log, to wandb."""
    cfg = r.cfg
    log_file = (cleanup.enter_context(open_log(os.path.join(cfg['out_dir'], 'log.jsonl')))
                if r.master and not cfg['eval_only'] else None)
    wandb = None
    if r.master and cfg['wandb_log']:
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
    r.log = log


def report_changes(r, changes):
    """Log and print what a resume changed (RESUME_MAY_CHANGE keys)."""
    cfg = r.cfg
    for key, old, new in changes:
        r.log({'event': 'resume_change', 'iter': r.iter_num, 'key': key, 'old': old, 'new': new})
        if r.master:
            print(f"changed on resume: {key} {old!r} -> {new!r}")
    if r.master and {k for k, _, _ in changes} & {'max_iters', 'lr_decay_iters'} == {'max_iters'} and cfg['decay_lr']:
        old_max = next(old for k, old, _ in changes if k == 'max_iters')
        print(f"max_iters {old_max} -> {cfg['max_iters']}: the cosine schedule keeps lr_decay_iters="
              f"{cfg['lr_decay_iters']} (min_lr after it); pass --lr_decay_iters to change it")


# ----------------------------------------------------------------------------- evaluation
def eval_and_save(r):
    """The evaluation at an eval_interval (and the last iteration): val loss, the probe, the divergence check, then
    ckpt.pt (and best.pt when it improved). Returns the result of the run so far."""
    cfg = r.cfg
    check_finite(r, r.nonfinite)
    val_loss, val_ppl, n = evaluate(r.model, r.paths['val'], r.meta, cfg, r.rank, r.world, r.device, r.autocast)
    event = {'event': 'eval', 'iter': r.iter_num, 'val_loss': val_loss, 'val_ppl': val_ppl, 'val_tokens': n,
             'tokens': r.iter_num * r.tokens_per_iter}
    measured = probe_now(r) if math.isfinite(val_loss) else None   # a non-finite model: the divergence check says so
    if measured is not None:
        event['probe'] = measured
    r.log(event)
    if r.master:
        print(f"eval iter {r.iter_num}: val loss {val_loss:.4f} | val ppl {ppl_text(val_ppl)} ({n:,} tokens)")
    if measured is not None:
        print(probe_text(r.iter_num, measured))
    factor = cfg['divergence_factor']
    if not math.isfinite(val_loss) or (factor and val_loss > r.best_val_loss + math.log(factor)):
        r.log({'event': 'diverged', 'iter': r.iter_num, 'val_loss': val_loss, 'best_val_loss': r.best_val_loss,
               'divergence_factor': factor})
        kept = (f"{r.ckpt_path} (iteration {r.last_saved}) and {r.best_path} (the best) are kept"
                if r.last_saved is not None else "no checkpoint had been written")
        raise TrainingError(f"diverged at iteration {r.iter_num}: val loss {val_loss:.4g} > best "
                            f"{r.best_val_loss:.4f} + ln(divergence_factor={factor:g}); stopped without "
                            f"writing a checkpoint, {kept}; resume with a lower --learning_rate, or "
                            f"--divergence_factor=0 to train on")
    improved, r.best_val_loss = val_loss < r.best_val_loss, min(r.best_val_loss, val_loss)
    # a resume evaluates its checkpoint's iteration again, and saves when that improved: the evaluation of a job of a
    # max_minutes chain that stopped there before evaluating it (else such a chain would never write best.pt)
    resumed_here = r.iter_num == r.start_iter and r.last_saved == r.iter_num
    if (r.iter_num > r.start_iter and (improved or cfg['always_save_checkpoint'] or r.iter_num == cfg['max_iters'])
            or resumed_here and improved):
        checkpoint(r, r.ckpt_path, *([r.best_path] if improved else []))
        r.last_saved = r.iter_num
    return {'val_loss': val_loss, 'val_ppl': val_ppl, 'iter': r.iter_num}


@torch.no_grad()
def evaluate(model, path, meta, cfg, rank, world, device, autocast):
    """Mean loss and perplexity on the first eval_tokens of val.bin, cut into non-overlapping windows of
    block_size (+1 target) that are dealt round-robin to the ranks: the same tokens for every run.
    windows='document': the first windows that start at an eot, as in training."""
    data = memmap(path, meta)
    T, B = cfg['block_size'], cfg['batch_size']
    offsets = eval_windows(path, meta, cfg)[0]
    mine = list(offsets[rank::world])
    total = torch.zeros(2, dtype=torch.float64, device=device)   # (sum of losses, number of targets)
    skipped = max(cfg['causal_free_prefix'] - 1, 0)                # targets the loss ignores per window
    model.eval()
    # under fsdp every forward pass is collective: a rank with fewer windows runs the last batches on a window
    # it does not count (n = 0)
    for start in range(0, len(offsets[0::world]) if cfg['fsdp'] else len(mine), B):
        windows = mine[start:start + B] or offsets[:1]
        xy = np.stack([data[w:w + T + 1] for w in windows])
        check_tokens(xy, cfg['vocab_size'], path)
        xy = torch.from_numpy(xy.astype(np.int64)).to(device)
        with autocast:
            _, loss = model(xy[:, :-1], xy[:, 1:])
        n = len(mine[start:start + B]) * (T - skipped)
        total += torch.tensor([loss.item() * n, n], dtype=torch.float64, device=device)
    model.train()
    all_reduce(total)
    val_loss = (total[0] / total[1]).item()
    return val_loss, math.exp(min(val_loss, 700.0)), int(total[1].item())


def probe_now(r):
    """The probe (probe_docs > 0) of the weights as they are, on rank 0; under fsdp every rank takes part in
    gathering a plain copy. Returns its result on rank 0, else None."""
    cfg = r.cfg
    if not cfg['probe_docs'] or not (r.master or cfg['fsdp']):   # the other ranks go on and wait at the next collective
        return None
    plain = fsdp.plain_copy(r.raw_model, r.model_args, r.device) if cfg['fsdp'] else r.raw_model   # collective
    return probe(plain, cfg, r.meta, r.paths['val'], r.bos, r.device) if r.master else None


def probe_between(r):
    """probe_interval: the probe alone between evaluations, logged as {"event": "probe", "iter", "tokens",
    "probe"}; no evaluation, no checkpoint, nothing that changes the run."""
    measured = probe_now(r)
    if measured is not None:
        r.log({'event': 'probe', 'iter': r.iter_num, 'tokens': r.iter_num * r.tokens_per_iter, 'probe': measured})
        print(probe_text(r.iter_num, measured), flush=True)


@torch.no_grad()
def probe(raw_model, cfg, meta, path, bos, device):
    """The paper's metrics on the first probe_docs documents of val.bin, measured by analyze.py's own code exactly
    as `analyze.py --ckpt out_dir --max_docs probe_docs` measures the checkpoint: the same documents, the same BOS
    (the checkpoint's), block size and batch size, the analysis path of the un-compiled model in eval mode, float32
    matmuls. Returns analyze.py's summary numbers and per_layer lists under its JSON keys (NaN as None), and
    'documents'. Not collective: rank 0 alone calls it."""
    c = raw_model.config
    lm = LoadedModel(name='probe', model=raw_model, kind='ours', bos=bos, block_size=c.block_size,
                     vocab_size=c.vocab_size, config={}, tokenizer=meta.get('tokenizer_info'))
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False      # the training loop allows TF32; analyze.py does not
    raw_model.eval()
    try:
        result, _ = measure.analyze(lm, os.path.dirname(path), cfg['probe_docs'], measure.default_batch_size(device),
                                    device, quiet=True)
    except ValueError as e:   # the data's meta.json (e.g. a malformed "triggers"): one line, as any data problem
        raise TrainingError(f"the probe: {e}") from None
    finally:
        raw_model.train()
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return json_safe({**{k: result[k] for k in result['per_layer']}, 'per_layer': result['per_layer'],
                              'documents': result['data']['documents']})


def evaluate_only(r):
    """eval_only, or a finished run started again: the evaluation of its checkpoint, printed; nothing written."""
    val_loss, val_ppl, n = evaluate(r.model, r.paths['val'], r.meta, r.cfg, r.rank, r.world, r.device, r.autocast)
    if r.master:
        print(f"eval at iter {r.iter_num}: val loss {val_loss:.4f} | val ppl {ppl_text(val_ppl)} ({n:,} tokens)")
    return {'val_loss': val_loss, 'val_ppl': val_ppl, 'iter': r.iter_num, 'ckpt': r.ckpt_path}


# ----------------------------------------------------------------------------- checkpoints
def keep_checkpoint(r):
    """save_every's ckpt_<iter>.pt, after this iteration's evaluation passed; at a resume's first iteration only
    when the file is missing (a kill between ckpt.pt and it, or save_every set on resume)."""
    path = os.path.join(r.cfg['out_dir'], f'ckpt_{r.iter_num}.pt')
    if r.iter_num > r.start_iter or any_rank(torch.tensor(r.master and not os.path.exists(path), device=r.device)):
        check_finite(r, r.nonfinite)
        checkpoint(r, path)


def checkpoint(r, *paths):
    """Write this state to each path in turn, each a file of its own (ckpt.pt before best.pt: a kill in between
    leaves both valid). Collective. A full disk is a one-line TrainingError; the file being replaced is intact
    (runs.save_checkpoint writes a temporary file and renames it)."""
    states = [None] * r.world
    if r.world > 1:
        dist.all_gather_object(states, rng_state(r.device_type))
    else:
        states = [rng_state(r.device_type)]
    if not (fsdp.all_finite(r.raw_model) if r.cfg['fsdp'] else all(torch.isfinite(p).all() for p in r.raw_model.parameters())):
        raise TrainingError("non-finite weights; not overwriting the last good checkpoint")
    sharded, error = None, None
    kept = (f"{r.ckpt_path} (iteration {r.last_saved}) is kept" if r.last_saved is not None
            else "no checkpoint had been written")
    if r.cfg['fsdp']:   # the shards first (ckpt.pt names them only once complete), then the full weights on rank 0
        if paths[0] == r.ckpt_path:
            sharded = fsdp.save_sharded(r.raw_model, r.optimizer, r.cfg['out_dir'], r.iter_num,
                                        f"{kept}, {continue_advice(r.last_saved)}", reuse=r.last_saved == r.iter_num)
        weights = fsdp.full_weights(r.raw_model)
    if r.master:
        contents = {
            'model': weights if r.cfg['fsdp'] else r.raw_model.state_dict(),
            'optimizer': None if r.cfg['fsdp'] else r.optimizer.state_dict(), 'scaler': r.scaler.state_dict(),
            'model_args': r.model_args, 'iter_num': r.iter_num, 'best_val_loss': r.best_val_loss, 'config': r.cfg,
            'bos': r.bos,
            'tokenizer': r.meta.get('tokenizer_info'), 'rng': states,
            'data': {'sampler': 'keyed by (seed, iter, micro)', 'next_iter': r.iter_num,
                     'identity': data_identity(r.meta), 'dir': os.path.relpath(os.path.dirname(os.path.abspath(r.paths['val'])),
                                                     os.path.dirname(os.path.abspath(r.ckpt_path)))}}
        for path in paths:   # no links between them: a write into one file (a cp onto it, a truncation) leaves the others
            # fsdp: best.pt names the shards too (cp best.pt ckpt.pt resumes it); ckpt_<iter>.pt holds the weights only
            contents['sharded'] = sharded if path in (r.ckpt_path, r.best_path) else None
            try:
                save_checkpoint(path, contents)
            except (OSError, RuntimeError) as e:
                if not disk_full(e):
                    raise
                error = TrainingError(f"{disk_full_text(path)}; {kept}, {continue_advice(r.last_saved)}")
                break
        if sharded and error is None:   # the folders ckpt.pt and best.pt name stay
            best = sharded if r.best_path in paths else fsdp.named_shards(r.best_path)
            fsdp.remove_old_shards(r.cfg['out_dir'], keep={sharded['dir'], (best or {}).get('dir')})
    if r.world > 1:   # rank 0's failure stops every rank with its one line
        agree(error)
    elif error:
        raise error


# ----------------------------------------------------------------------------- command line
def usage():
    return (f"usage: python train.py [CONFIG_FILE ...] [--key=value ...]\n"
            f"       torchrun --standalone --nproc_per_node=N train.py [CONFIG_FILE ...] [--key=value ...]\n\n"
            f"{__doc__.strip().split(chr(10) * 2)[0]}\nConfig files are Python files setting keys; --key=value takes Python "
            f"literals (bare words are strings). Keys, defaults and meanings:\n\n"
            f"{describe(DEFAULTS, HELP, CHOICES, RANGES)}\n\ndocs/training.md ('Config keys') and docs/guarantees.md.")


def main(argv):
    master = int(os.environ.get('RANK', 0)) == 0   # errors are printed once (devices.report_error); every rank exits 2
    if any(a in ('-h', '--help') for a in argv):
        if master:
            print(usage())
        return 0
    cfg = {}
    try:
        cfg = load_config(DEFAULTS, argv, CHOICES, RANGES)
        result = train(cfg)
    except (ConfigError, TrainingError) as e:
        report_error(e)
        return 2
    except RuntimeError as e:
        if not lost_peer(e):
            raise
        report_error(lost_peer_text(e, cfg))
        return 2
    finally:
        teardown()
    if 'val_ppl' in result and master:
        print(f"done: val ppl {ppl_text(result['val_ppl'])} at iteration {result['iter']} | checkpoint {result['ckpt']}")
    return 128 + result['signal'] if result.get('signal') else 0   # stopped by a signal: as a shell reports it


if __name__ == '__main__':
    run_script(main, sys.argv[1:])
