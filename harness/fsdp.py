"""fsdp=True: train.py's model sharded across torchrun's ranks with PyTorch's FSDP2 (torch.distributed.fsdp.fully_shard),
sharded checkpoints with torch.distributed.checkpoint (DCP), and the consolidated ckpt.pt every other script reads.

    torchrun --standalone --nproc_per_node=8 train.py config/gpt2_1.4b_fsdp.py       # the paper's 1.4B rows
    torchrun --standalone --nproc_per_node=2 train.py config/tiny_cpu.py --fsdp=True  # 2 CPU processes (gloo)

Each transformer block, then the whole model (embeddings, final norm, LM head), is one fully_shard unit: a rank holds
1/world of every parameter, gradient and optimizer moment, and gathers a block's weights only while it runs. On CUDA
with dtype='bfloat16' the gathered weights are bf16 and gradients are reduced in fp32 (MixedPrecisionPolicy); the
sharded master weights and the moments stay fp32.

Where a parameter is cut (shard_axis): OrthoAdam rotates some axes of a parameter (orthoadam.rotated_axes); a shard cut
along an axis that is not rotated holds whole rotated fibres, so rotating the shard is exactly Algorithm 1's rotation
of those rows, with no communication. Parameters whose every axis is rotated (the norms' scales; an n_embd x n_embd
matrix under orthoadam_axes='residual'; most matrices under 'all') are cut along axis 0 and take OrthoAdam's gathered
step (full gradient rotated on every rank, moments sharded). AdamW, RMSProp and SGD run on the shards as they are.

Checkpoints: ckpt.pt keeps its format (the full model's state_dict, config, counters, RNG states) with
'optimizer': None and 'sharded': {'dir': <folder beside it>, 'world': N}; that folder holds the DCP shards of the
model and optimizer, written as <folder>.<8 hex>.tmp and renamed once every rank finished, so a rank killed during a
save leaves ckpt.pt naming the last complete folder. A resume under fsdp=True reads the shards with any number of ranks
(DCP reshards). best.pt and ckpt_<iter>.pt hold the weights only.
"""
import os
import resource
import shutil
import warnings

import torch
import torch.distributed as dist

from harness.devices import agree
from harness.fileio import disk_full, disk_full_text, ours, temporary_folder, torch_load
from harness.train_config import TrainingError
from model import GPT, GPTConfig
from orthoadam import rotated_axes

SHARDED_PREFIX = 'ckpt.dcp-'   # out_dir/ckpt.dcp-<iter>: one sharded checkpoint


def check_fsdp(cfg, world):
    """Launch checks (before the rendezvous, so every rank fails alike)."""
    if not cfg['fsdp']:
        return
    if 'RANK' not in os.environ:
        raise TrainingError("fsdp=True shards the model across torchrun's processes: launch with torchrun "
                            "--standalone --nproc_per_node=N train.py ... --fsdp=True (or drop --fsdp for one process)")
    if cfg['optimizer'] == 'muon':
        raise TrainingError("optimizer='muon' does not run under fsdp=True (Muon orthogonalises whole matrices, which "
                            "FSDP splits across ranks): use DDP (fsdp=False) or another optimizer")
    if cfg['dtype'] == 'float16':
        raise TrainingError("dtype='float16' needs a gradient scaler that FSDP does not shard here: use "
                            "dtype='bfloat16' (or 'float32') with fsdp=True")


def shard_axis(shape, cfg, name, world):
    """The axis a parameter of this shape is cut along: for OrthoAdam the first axis its Q does not rotate (and
    long enough to give every rank a part), else axis 0."""
    if cfg['optimizer'] == 'orthoadam':
        vocab = name in ('transformer.wte.weight', 'lm_head.weight') and cfg['orthoadam_vocab_axis'] == 'skip'
        group = {'rotation': cfg['orthoadam_rotation'], 'axes': cfg['orthoadam_axes'], 'residual_dim': cfg['n_embd'],
                 'skip_axes': (0,) if vocab else ()}
        rotated = rotated_axes(shape, group)
        free = [a for a, n in enumerate(shape) if a not in rotated and n >= world]
        if free:
            return free[0]
    return 0


def shard_model(model, cfg, device_type, world):
    """fully_shard each block, then the whole model, on a 1-D mesh of all ranks. Returns the model (now FSDP)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import Shard
    mesh = init_device_mesh(device_type, (world,))
    names = {id(p): n for n, p in model.named_parameters()}   # tied weights: the first name, as harness/optimizers.py sees it
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if device_type == 'cuda' and cfg['dtype'] == 'bfloat16' else MixedPrecisionPolicy())

    # FSDP2 warns that the model's output is a view (an in-place op on it would skip a backward hook); train.py
    # only divides the loss out of place
    warnings.filterwarnings('ignore', message='FSDP2-wrapped module')

    def placement(p):
        return Shard(shard_axis(tuple(p.shape), cfg, names.get(id(p), ''), world))
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh, mp_policy=mp, shard_placement_fn=placement)
    fully_shard(model, mesh=mesh, mp_policy=mp, shard_placement_fn=placement)
    return model


def full_weights(model):
    """The full model state_dict on CPU, on rank 0 (an empty dict on the others). Collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def plain_copy(model, model_args, device):
    """Rank 0: an unsharded GPT with the model's current weights, for train.py's probe (analyze.py's code calls the
    model on rank 0 alone, which a sharded model cannot do); None on the other ranks. Collective. Holds one full
    copy of the weights on rank 0's device while the probe runs."""
    weights = full_weights(model)
    if dist.get_rank() != 0:
        return None
    plain = GPT(GPTConfig(**model_args))
    plain.load_state_dict(weights)
    return plain.to(device)


def all_finite(model):
    """Whether every weight is finite on every rank (each rank checks its shards). Collective."""
    from orthoadam import local
    shards = [local(p) for p in model.parameters()]
    bad = int(not all(torch.isfinite(s).all() for s in shards))
    bad = torch.tensor(bad, device=shards[0].device)   # on the GPU under NCCL, which reduces no CPU tensor
    dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    return not bad.item()


def _failure(e):
    """(the exception, one line of it) of a DCP failure: DCP raises a CheckpointException (a BaseException) carrying
    every rank's (exception, stack) pair; a full disk on any rank is the one named."""
    found = [f[0] if isinstance(f, tuple) else f for f in (getattr(e, 'failures', None) or {}).values()] or [e]
    inner = next((f for f in found if disk_full(f)), found[0])
    return inner, f"{type(inner).__name__}: {' '.join(str(inner).split())[:200]}"


def _dcp_errors():
    from torch.distributed.checkpoint.api import CheckpointException
    return Exception, CheckpointException


def save_sharded(model, optimizer, out_dir, iter_num, kept, reuse=False):
    """The DCP shards of model and optimizer into out_dir/ckpt.dcp-<iter_num>: written into a new folder
    <folder>.<8 hex>.tmp (fileio.temporary_folder, made by rank 0 and named to the others: created exclusively and
    marked as train.py's at once, so that only train.py's own leftovers are ever removed) by every rank, renamed by
    rank 0 after all finished. Returns {'dir': the folder's name (relative to out_dir), 'world'}.
    reuse=True (the state of the iteration ckpt.pt was written at, no step since): the folder ckpt.pt names, when it
    is complete. A failed write (a full disk, on any rank) removes the temporary folder and is a one-line
    TrainingError on every rank, `kept` saying which checkpoint is kept and how to continue. Collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    if reuse:
        found = [named_shards(os.path.join(out_dir, 'ckpt.pt')) if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(found, src=0)
        if found[0] and os.path.isfile(os.path.join(out_dir, found[0]['dir'], '.metadata')):
            return found[0]
    name = f'{SHARDED_PREFIX}{iter_num}'
    final, tmp, error = os.path.join(out_dir, name), [None], None
    if dist.get_rank() == 0:
        try:
            tmp[0] = temporary_folder(final, 'train.py')
        except OSError as e:
            error = _save_error(e, final, kept)
    agree(error)
    dist.broadcast_object_list(tmp, src=0)
    tmp = tmp[0]
    model_state, optim_state = get_state_dict(model, optimizer)
    try:
        dcp.save({'model': model_state, 'optimizer': optim_state}, checkpoint_id=tmp)   # the model too: for DCP tools
    except _dcp_errors() as e:
        error = _save_error(_failure(e)[0], tmp, kept)
    if error is None and dist.get_rank() == 0:
        try:
            if ours(final, 'train.py'):
                shutil.rmtree(final)
            os.replace(tmp, final)
        except OSError as e:
            error = _save_error(e, final, kept)
    try:
        agree(error)   # every rank raises the same line when one failed
    except TrainingError:
        if dist.get_rank() == 0 and ours(tmp, 'train.py'):
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {'dir': name, 'world': dist.get_world_size()}


def _save_error(e, path, kept):
    if disk_full(e):
        return TrainingError(f"{disk_full_text(path)}; {kept}")
    return TrainingError(f"cannot write the sharded checkpoint {path} ({type(e).__name__}: "
                         f"{' '.join(str(e).split())[:200]}); {kept}")


def named_shards(path):
    """The sharded checkpoint {'dir', 'world'} a checkpoint file names, or None (none, absent, unreadable). Reads
    the file memory-mapped: the weights are not read."""
    try:
        ckpt = torch_load(path, map_location='cpu', mmap=True, weights_only=False)
    except Exception:
        return None
    return ckpt.get('sharded') if isinstance(ckpt, dict) else None


def remove_old_shards(out_dir, keep):
    """Rank 0, once ckpt.pt names one of `keep` (the folders ckpt.pt and best.pt name): every other sharded folder of
    train.py's (older saves, killed saves' .tmp; a folder without train.py's mark is left)."""
    for entry in os.listdir(out_dir):
        path = os.path.join(out_dir, entry)
        if entry.startswith(SHARDED_PREFIX) and entry not in keep and ours(path, 'train.py'):
            shutil.rmtree(path, ignore_errors=True)


def shards_problem(folder):
    """Why the DCP folder cannot be read, or None: .metadata missing or unreadable, a shard file missing or shorter
    than the items .metadata places in it (a truncated file, a save cut by a full disk). Reads .metadata only."""
    from torch.distributed.checkpoint import FileSystemReader
    if not os.path.isfile(os.path.join(folder, '.metadata')):
        return "it is missing or incomplete (no .metadata)"
    try:
        metadata = FileSystemReader(folder).read_metadata()
        need = {}
        for info in metadata.storage_data.values():
            need[info.relative_path] = max(need.get(info.relative_path, 0), info.offset + info.length)
    except _dcp_errors() as e:
        return f"its .metadata cannot be read ({_failure(e)[1]})"
    for name, size in sorted(need.items()):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            return f"its shard {name} is missing"
        if os.path.getsize(path) < size:
            return f"its shard {name} is truncated ({os.path.getsize(path):,} of {size:,} bytes)"
    return None


def check_sharded(ckpt, ckpt_path, fsdp):
    """A resume's checkpoint and the run must both be FSDP or both not, and the sharded folder must be whole: one
    line saying how to resume otherwise, before anything in out_dir is written. A file of weights only (an fsdp run's
    ckpt_<iter>.pt, or best.pt of a version that did not keep best.pt's shards) cannot be resumed."""
    sharded = ckpt.get('sharded')
    if ckpt.get('optimizer') is None and not sharded:
        raise TrainingError(f"{ckpt_path} holds the weights only, no optimizer state (a checkpoint of an fsdp run "
                            f"other than ckpt.pt and best.pt, e.g. save_every's ckpt_<iter>.pt): it cannot be resumed; "
                            f"evaluate it (analyze.py --ckpt {ckpt_path}), or restore the run's own ckpt.pt to continue")
    if fsdp and not sharded:
        raise TrainingError(f"{ckpt_path} was written without fsdp (its optimizer state is in the file, not in shards): "
                            f"resume it with --fsdp=False (python train.py or torchrun with DDP)")
    if not fsdp and sharded:
        raise TrainingError(f"{ckpt_path} was written by an fsdp run of {sharded['world']} ranks (optimizer state in "
                            f"{sharded['dir']}): resume it with torchrun --standalone --nproc_per_node=N train.py ... "
                            f"--fsdp=True (any N >= 2)")
    if sharded:
        folder = os.path.join(os.path.dirname(ckpt_path), sharded['dir'])
        problem = shards_problem(folder)
        if problem:
            raise TrainingError(f"{ckpt_path} names the sharded checkpoint {folder}, which cannot be read: {problem}; "
                                f"nothing was changed; restore it, or continue from best.pt (cp best.pt ckpt.pt, then "
                                f"--init_from=resume), or start again with --init_from=scratch in another --out_dir")


def load_sharded(model, optimizer, ckpt_path, sharded):
    """The optimizer state from the DCP folder ckpt.pt names, resharded to this run's ranks (the weights come from
    ckpt.pt itself, loaded before sharding: the same values). A folder that cannot be read (a shard damaged inside,
    which check_sharded's sizes do not show) is a one-line TrainingError on every rank. Collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict
    state = {'optimizer': get_optimizer_state_dict(model, optimizer)}
    folder = os.path.join(os.path.dirname(ckpt_path), sharded['dir'])
    try:
        dcp.load(state, checkpoint_id=folder)
    except _dcp_errors() as e:   # a CheckpointException is a BaseException: `except Exception` misses it
        other = (f"; or resume with --nproc_per_node={sharded['world']}, the ranks that wrote it"
                 if sharded['world'] != dist.get_world_size() else '')
        raise TrainingError(f"cannot read the sharded checkpoint {folder} that {ckpt_path} names "
                            f"({_failure(e)[1]}); it is damaged: restore it, or continue from best.pt (cp best.pt "
                            f"ckpt.pt, then --init_from=resume){other}") from None
    set_optimizer_state_dict(model, optimizer, state['optimizer'])


def peak_memory_text(rank, device_type, device):
    """One line: this rank's peak memory (CUDA: max_memory_allocated; CPU: the process's peak resident set)."""
    if device_type == 'cuda':
        return f"peak memory rank {rank}: {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB (cuda allocated)"
    return f"peak memory rank {rank}: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.3f} GiB (cpu rss)"
