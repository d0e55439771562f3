"""Training data as train.py reads it: the prepared folder checked against meta.json (open_data, verify_tokens),
training windows drawn from an RNG keyed by (seed, iter, micro-batch) (get_batch, window_starts), and the data's
identity a checkpoint records (data_identity)."""
import hashlib
import json
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from harness.dataset import eot_offsets, load_meta, prepare_again, resolve_dataset
from harness.devices import all_reduce, any_rank
from harness.fileio import Progress, atomic_write, read_json
from harness.train_config import TrainingError


def open_data(cfg):
    """Validate the dataset folder (dataset.resolve_dataset: data/<name>, or a path) and return
    (meta, {'train': path, 'val': path})."""
    data_dir = resolve_dataset(cfg['dataset'])
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
    try:   # a new temporary name (fileio.atomic_write): runs starting together on one data folder do not collide
        with atomic_write(stamp_path) as f:
            json.dump(stamps, f, indent=1)
    except OSError:   # a read-only or full disk: checked again next time; no part of the file left behind
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


def eval_windows(path, meta, cfg):
    """(offsets, note): the starts of the windows every evaluation reads (train.py's evaluate), the first
    eval_tokens // block_size windows of block_size (+1 target) of val.bin (windows='document': those that start at
    an eot), at least one and no more than val.bin holds; note is the line that says how eval_tokens was cut or
    rounded to them (None when they hold eval_tokens exactly)."""
    T, asked = cfg['block_size'], cfg['eval_tokens']
    n = max(1, min(asked // T, (len(memmap(path, meta)) - 1) // T))
    offsets = window_starts(path, meta, T)[:n] if cfg['windows'] == 'document' else np.arange(n) * T
    if len(offsets) * T == asked:
        return offsets, None
    why = ('more than val.bin holds' if len(offsets) < asked // T else 'less than one window of block_size'
           if asked < T else 'not a multiple of block_size')
    return offsets, (f"eval_tokens={asked:,} is {why}: each evaluation reads {len(offsets):,} window(s) of "
                     f"block_size={T} ({len(offsets) * T:,} tokens; the eval events' val_tokens count the targets)")


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
    window = np.stack([data[i:i + T + 1] for i in ix])
    # checked in numpy on the file's dtype: torch's max of the int64 copy woke its thread pool at every step
    # (14 ms per batch of 128 x 257 on a busy 2-core machine, 0.03 ms here)
    check_tokens(window, cfg['vocab_size'], f"{path} (iteration {iter_num})")
    xy = torch.from_numpy(window.astype(np.int64))
    x, y = xy[:, :-1], xy[:, 1:]
    if device.startswith('cuda'):
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.contiguous(), y.contiguous()


def data_identity(meta):
    """What makes prepared data the same data: tokenizer, vocabulary, dtype, eot, and per split its size and sha256."""
    return {'tokenizer': meta.get('tokenizer'), 'vocab_size': meta['vocab_size'], 'eot_token': meta['eot_token'],
            'dtype': meta['dtype'], **{f'{s}_{k}': meta['splits'][s].get(k) for s in ('train', 'val')
                                       for k in ('tokens', 'sha256')}}
