"""A run folder (train.py's out_dir) and the models in it: the file names (ckpt.pt, best.pt, log.jsonl,
config.json), the lock, atomic checkpoint saves that leave the last good checkpoint intact on a full disk, reading
checkpoints and log.jsonl back, what a resume may change of a checkpoint's config (check_resume), and loading a model
for measurement (load_model: a checkpoint, a Hugging Face model or a GGUF file) with the dataset it was trained on, or
for training (public_model: init_from='hf:...')."""
import fnmatch
import json
import os
import socket
import sys
from dataclasses import asdict, dataclass, fields

import torch

try:
    import fcntl     # the out_dir lock (lock_out_dir); POSIX only
except ImportError:  # Windows: runs go unlocked, with a warning
    fcntl = None

from harness.dataset import DATA_FILES, load_meta, resolve_dataset
from harness.fileio import MARK, PrepareError, atomic_write, check_output, remove_temporaries, torch_load, written_by
from harness.tokenizer import load_tokenizer, tokenizer_mismatch
from harness.train_config import DEFAULTS, PUBLIC_MODEL_KEYS, RESUME_IGNORED, RESUME_MUST_MATCH, TrainingError
from harness.train_data import data_identity
from model import GPT, GPTConfig, load_hf


def check_out_dir(out_dir):
    """Before anything is read or written: out_dir is a folder, or can be made, that this process may write to
    (fileio.check_output). claim_out_dir catches what this cannot see (e.g. root on a read-only folder)."""
    try:
        check_output(out_dir, '--out_dir', folder=True)
    except ValueError as e:
        raise TrainingError(str(e)) from None
    other = written_by(out_dir)
    if other not in (None, 'train.py'):    # e.g. an export_hf.py folder: config.json there is the model's, not ours
        raise TrainingError(f"--out_dir {out_dir} is an output of {other} (its {MARK} says so): a run there would "
                            f"replace its files; choose another --out_dir")


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


# what train.py writes into out_dir under a temporary NAME.<8 hex>.tmp (runs.save_checkpoint, configurator.save_config,
# fsdp.save_sharded's marked folder): the only *.tmp names its cleanup removes (fileio.remove_temporaries)
TEMPORARIES = ('ckpt.pt', 'best.pt', 'ckpt_*.pt', 'config.json', 'ckpt.dcp-*')


def remove_leftovers(out_dir):
    """Temporary files of a save that was killed before its rename (only called with the lock held): train.py's
    own (TEMPORARIES; a folder only with train.py's mark), never another *.tmp."""
    for path in remove_temporaries(out_dir, TEMPORARIES, 'train.py'):
        print(f"removed {path}, left by an interrupted save")


def file_state(path):
    """(inode, size, mtime) of a file, None if absent: whether out_dir changed between two moments."""
    try:
        st = os.stat(path)
    except OSError:   # absent, or a path that cannot name a file (too long: eval_only checks no out_dir)
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


def save_config(config, path):
    """Write the resolved configuration as JSON (atomically: atomic_write; a full disk leaves no half file)."""
    with atomic_write(path) as f:
        json.dump(config, f, indent=2, sort_keys=True, default=str)


def save_checkpoint(path, ckpt):
    """Atomic: write to a new temporary file in the same folder (fileio.atomic_write: an existing name, a link too,
    is never followed), fsync, then rename over the old one. A write that fails (a full disk: OSError ENOSPC, or
    torch.save's RuntimeError) removes the temporary file and leaves the old checkpoint as it was; the caller decides
    what to say (fileio.disk_full)."""
    with atomic_write(path, 'wb', sync=True) as f:
        torch.save(ckpt, f)
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


def continue_advice(last_saved):
    """What continues a run that stopped on an error: its last checkpoint when it wrote one, else the same command
    (init_from scratch or auto: no checkpoint means nothing to resume, and --init_from=resume would be refused)."""
    return ("continue with --init_from=resume" if last_saved is not None else
            "run the same command again once that is fixed (there is no checkpoint to resume: it starts again)")


def load_checkpoint(path):
    if not os.path.isfile(path):
        best = os.path.join(os.path.dirname(path), 'best.pt')
        if os.path.isfile(best):
            raise TrainingError(only_best(path, best))
        raise TrainingError(f"no checkpoint at {path} to resume or evaluate; train with --init_from=scratch first")
    try:
        ckpt = torch_load(path, map_location='cpu', weights_only=False)
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
                            f"(RESUME_MUST_MATCH in harness/train_config.py): use its values or another --out_dir")
    return [(k, saved[k], cfg[k]) for k in differ]


HF_BLOCK_SIZE = 256      # default analysis length for Hugging Face models (the paper trains at 256)


@dataclass
class LoadedModel:
    name: str                  # the spec it was loaded from, e.g. 'out/x/ckpt.pt', 'gpt2' or 'x/model.Q4_1.gguf'
    model: torch.nn.Module     # eval mode, on device
    kind: str                  # 'ours' | 'hf'
    bos: int | None            # token prepended to every document, or None
    block_size: int            # max sequence length used for analysis
    vocab_size: int
    config: dict               # model config for the JSON output
    tokenizer: dict | None = None   # the model's tokenizer record (prepare_c4 Tokenizer.record()), if known
    data: str | None = None    # ours: the dataset folder it was trained on (the default --data)


def run_dataset(dataset, ckpt_path, recorded=None):
    """The folder of the data a checkpoint was trained on, whatever the working directory is now: the folder the
    checkpoint records, relative to its own folder (absolute in older checkpoints), else the config's dataset
    (dataset.resolve_dataset: data/<name> or a path) looked up from here, then from each folder above the checkpoint's (train.py ran in one of them, usually
    the repository). The first that holds meta.json; else the lookup from here, so that the error names it."""
    if not dataset and not recorded:
        return None
    if recorded and not os.path.isabs(recorded):   # recorded relative to the checkpoint's folder (no absolute path)
        recorded = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(ckpt_path)), recorded))
    if recorded and os.path.isfile(os.path.join(recorded, 'meta.json')):
        return recorded
    if not dataset:
        return recorded
    here = resolve_dataset(dataset)
    if os.path.isabs(here) or os.path.isfile(os.path.join(here, 'meta.json')):
        return here
    folder = os.path.dirname(os.path.abspath(ckpt_path))
    while True:
        candidate = os.path.join(folder, here)
        if os.path.isfile(os.path.join(candidate, 'meta.json')):
            return candidate
        if os.path.dirname(folder) == folder:
            return here
        folder = os.path.dirname(folder)


def load_model(spec: str, device: str = 'cpu', block_size: int | None = None) -> LoadedModel:
    """A train.py checkpoint (a .pt file or a folder holding ckpt.pt), a Hugging Face name / folder or a GGUF file."""
    path = os.path.join(spec, 'ckpt.pt') if os.path.isfile(os.path.join(spec, 'ckpt.pt')) else spec
    if path.endswith('.pt') or (os.path.isfile(path) and not path.endswith('.gguf')):
        model, ckpt = GPT.from_checkpoint(path, device)
        train_cfg = ckpt.get('config') or {}
        config = dict(ckpt['model_args'], n_params=model.num_params(), optimizer=train_cfg.get('optimizer'),
                      iter_num=ckpt.get('iter_num'), dataset=train_cfg.get('dataset'))
        data = run_dataset(train_cfg.get('dataset'), path, (ckpt.get('data') or {}).get('dir'))
        tokenizer = ckpt.get('tokenizer')
        if tokenizer is None and data is not None:    # checkpoints that do not record it: the data they trained on
            try:
                tokenizer = load_meta(data).get('tokenizer_info')
            except ValueError:
                pass
        return LoadedModel(spec, model, 'ours', ckpt.get('bos'), _block_size(spec, block_size, model.config.block_size),
                           model.config.vocab_size, config, tokenizer, data)
    model = load_hf(spec)
    return wrap_hf(model.to(device), spec, block_size, hf_tokenizer(spec))


def hf_tokenizer(spec):
    """The tokenizer record of a Hugging Face name / folder / GGUF file, or None when it has no tokenizer here."""
    try:
        return load_tokenizer(f'hf:{spec}').record()
    except PrepareError:
        return None


def wrap_hf(model, name: str, block_size: int | None = None, tokenizer: dict | None = None) -> LoadedModel:
    """LoadedModel for an instantiated transformers causal LM (switched to eager attention)."""
    if model.config._attn_implementation != 'eager':
        model.set_attn_implementation('eager')
    c = model.config
    max_len = c.max_position_embeddings
    bos = None if c.model_type == 'gpt2' else c.bos_token_id
    config = dict(model_type=c.model_type, n_layer=c.num_hidden_layers, n_head=c.num_attention_heads,
                  n_embd=c.hidden_size, vocab_size=c.vocab_size, max_position_embeddings=max_len,
                  n_params=sum(p.numel() for p in model.parameters()))
    return LoadedModel(name, model.eval(), 'hf', bos, _block_size(name, block_size, max_len, HF_BLOCK_SIZE),
                       c.vocab_size, config, tokenizer)


def load_gpt(spec: str, device: str = 'cpu') -> LoadedModel:
    """load_model, but a Hugging Face model is copied into this repository's GPT (GPT.from_hf: GPT-2 and Llama
    families, at their full length), so that code written for GPT runs on every model (the KV cache of sample.py
    and stream_eval.py). kind is 'ours' either way; the tokenizer record, BOS and name are load_model's."""
    lm = load_model(spec, 'cpu')
    if lm.kind == 'hf':
        lm.model = GPT.from_hf(lm.model)
        lm.kind, lm.block_size = 'ours', lm.model.config.block_size
        lm.config = dict(asdict(lm.model.config), model_type=lm.config['model_type'], n_params=lm.model.num_params())
    lm.model = lm.model.to(device)
    return lm


def _block_size(name, requested, limit, default=None):
    if requested is not None and not 1 <= requested <= limit:
        raise ValueError(f"--block_size {requested} is outside [1, {limit}], the range {name} supports")
    return requested or min(default or limit, limit)


def check_ckpt(c):
    """--ckpt is a train.py checkpoint or its out_dir (Hugging Face names go to --init_from): a one-line ValueError
    before any model is loaded."""
    if not os.path.exists(c):
        raise ValueError(f"--ckpt {c}: not found, no such file or folder (--ckpt takes a train.py checkpoint "
                         f"or its out_dir)")
    if os.path.isdir(c) and not os.path.isfile(os.path.join(c, 'ckpt.pt')):
        raise ValueError(f"--ckpt {c}: the folder holds no ckpt.pt (pass best.pt's path for the best checkpoint)")


def log_events(path):
    """The events of a train.py log.jsonl with an 'event' and an 'iter', in file order; a torn line is skipped."""
    with open(path, errors='replace') as f:   # damaged bytes: a line that does not parse, skipped
        for line in f:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if isinstance(e, dict) and 'event' in e and isinstance(e.get('iter'), int):
                yield e


def read_log(path):
    """(train, eval) lists of events from a train.py log.jsonl; a repeated (event, iter) keeps the last line."""
    events = {(e['event'], e['iter']): e for e in log_events(path) if e['event'] in ('train', 'eval')}
    by = lambda kind: [events[k] for k in sorted(k for k in events if k[0] == kind)]
    return by('train'), by('eval')


def read_probes(path):
    """The probes of a train.py log.jsonl in iteration order: the 'probe' of every evaluation and every
    probe_interval event {"event": "probe"}; a repeated iteration (a job that probed it again) keeps the last line."""
    found = {e['iter']: e for e in log_events(path) if e['event'] in ('eval', 'probe') and isinstance(e.get('probe'), dict)}
    return [found[k] for k in sorted(found)]


# the files of a run folder: a command that reads a checkpoint writes beside them, never over one (read_paths)
RUN_FILES = ('ckpt.pt', 'best.pt', 'ckpt_*.pt', 'config.json', 'log.jsonl', '.lock', 'ckpt.dcp-*')


def read_paths(ckpts=(), data=(), others=()):
    """What a measuring command reads, for fileio.check_output's inputs (its outputs may not replace one): each
    checkpoint (a file, or a run folder's ckpt.pt) with the files of its run (RUN_FILES beside it) and of the data
    folder it records; each --data folder's files (DATA_FILES); each other path read that exists here (a local model's
    file or folder, a folder with all it holds; a hub name is nothing here)."""
    paths, data = [], list(data)
    for spec in ckpts:
        path = os.path.join(spec, 'ckpt.pt') if os.path.isdir(spec) else spec
        folder = os.path.dirname(path) or '.'
        paths.append(path)
        if os.path.isdir(folder):
            paths += [os.path.join(folder, e) for e in os.listdir(folder)
                      if any(fnmatch.fnmatchcase(e, p) for p in RUN_FILES)]
        try:   # memory-mapped: the weights are not read
            ckpt = torch_load(path, map_location='cpu', mmap=True, weights_only=False)
            data.append(run_dataset((ckpt.get('config') or {}).get('dataset'), path,
                                    (ckpt.get('data') or {}).get('dir')))
        except Exception:   # not a checkpoint: loading it later says so
            pass
    for folder in data:
        if folder:
            paths += [os.path.join(resolve_dataset(folder), name) for name in DATA_FILES]
    return paths + [p for p in others if p and os.path.exists(p)]


def make_folder(path, option):
    """Create the output folder of `option` (and its parents), or say in one line why it cannot be made
    (fileio.check_output)."""
    check_output(path or '.', option, folder=True, make=True)


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
        raise TrainingError(f"{resolve_dataset(cfg['dataset'])} does not fit {spec}: {mismatch}; prepare the data with "
                            f"python prepare_c4.py --tokenizer hf:{spec} ... and point --dataset at it")
    for k in PUBLIC_MODEL_KEYS:
        cfg[k] = getattr(pretrained.config, k)
    return pretrained
