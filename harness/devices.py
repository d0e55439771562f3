"""Devices and ranks: which --device works here (device_problem, choose_device), torchrun's process group
(setup_distributed), how the ranks share an iteration (rank_share) and agree (agree, all_reduce, any_rank), and
the peak FLOP/s used for MFU."""
import datetime
import gc
import importlib
import os
import re
import sys

import torch
import torch.distributed as dist

from harness import entry
from harness.train_config import TrainingError


# dense bf16 tensor-core peak FLOP/s per device, for MFU (first matching substring wins)
PEAK_FLOPS = [('H200', 989e12), ('H100 PCIe', 756e12), ('H100', 989e12), ('A100', 312e12),
              ('L40S', 362e12), ('A10G', 125e12), ('RTX 4090', 165e12), ('V100', 125e12)]


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
        # before the group exists: torch.distributed.nn's functions take group=group.WORLD as a default argument, so
        # imported later (torch.compile does, through dynamo) they would hold the default group to the end (teardown)
        importlib.import_module('torch.distributed.nn')   # (an import statement here would make `torch` local)
        dist.init_process_group(backend='nccl' if cfg['device'].startswith('cuda') else 'gloo')
    else:
        rank, local_rank, world = 0, 0, 1
    device_type = 'cuda' if cfg['device'].startswith('cuda') else 'cpu'
    if cfg['dtype'] == 'auto':   # a CPU keeps float32: bf16's numbers depend on its instructions (docs/performance.md)
        cfg['dtype'] = 'bfloat16' if device_type == 'cuda' and torch.cuda.is_bf16_supported() else 'float32'
    if device_type == 'cpu' and cfg['dtype'] == 'bfloat16' and rank == 0 and not cpu_bf16():
        print("warning: this CPU has no bf16 instructions (AMX or AVX512-BF16): dtype='bfloat16' runs emulated, "
              "slower than float32 (docs/performance.md); --dtype=float32 is faster here", file=sys.stderr)
    if device_type == 'cpu' and cfg['dtype'] == 'float16' and rank == 0:
        print("warning: dtype='float16' on a CPU: autocast runs float16 matmuls that most CPUs emulate (slower than "
              "float32), in float16's narrow range (overflow past 65,504; the gradient scaler guards the backward "
              "only); --dtype=float32 is the CPU's (or bfloat16 where the CPU has bf16 instructions)", file=sys.stderr)
    return rank, local_rank, world, cfg['device'], device_type


# oneDNN's instruction-set caps (ONEDNN_MAX_CPU_ISA) below AVX512_CORE_BF16: with one, oneDNN uses no bf16 instruction
NO_BF16_ISA = {'SSE41', 'AVX', 'AVX2', 'AVX2_VNNI', 'AVX2_VNNI_2', 'AVX512_CORE', 'AVX512_CORE_VNNI'}


def available_memory():
    """Bytes this machine can still allocate (Linux's MemAvailable), or None where /proc/meminfo does not say."""
    try:
        with open('/proc/meminfo') as f:
            for line in f:
                if line.startswith('MemAvailable:'):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def gib(n):
    """Bytes in the unit that reads best: MiB, GiB or TiB."""
    return (f"{n / 2 ** 20:,.0f} MiB" if n < 2 ** 30 else f"{n / 2 ** 30:,.1f} GiB" if n < 2 ** 40 * 10
            else f"{n / 2 ** 40:,.0f} TiB")


def memory_problem(cfg, model_args, rows, available):
    """A one-line refusal when a CPU run of the model `model_args` (GPTConfig's) cannot fit in `available` bytes, else
    None: at least 16 bytes a parameter (fp32 weights and gradients, Adam's two moments) and, per micro-batch of
    `rows` sequences, 16 fp32 values a token and layer of activations and the int64 batch: lower bounds, so a run this
    refuses would fail for certain (after minutes of allocating, or with the allocator's traceback), and one it lets
    through may still be too large."""
    if available is None:
        return None
    from model import GPT, GPTConfig
    with torch.device('meta'):   # the parameters counted, none allocated
        n_params = GPT(GPTConfig(**model_args)).num_params()
    tokens = rows * cfg['block_size']
    state, acts = 16 * n_params, tokens * (16 * 4 * cfg['n_layer'] * cfg['n_embd'] + 3 * 8)
    if state + acts <= available:
        return None
    fix = ('--n_embd, --n_layer (the model)' if state >= acts else
           '--batch_size (or raise --gradient_accumulation_steps at the same batch) or --block_size')
    return (f"this run needs more than {gib(state + acts)} of memory ({n_params:,} parameters x 16 bytes for fp32 "
            f"weights, gradients and Adam's moments: {gib(state)}; activations of {tokens:,} tokens a micro-batch: "
            f"at least {gib(acts)}) and this machine has {gib(available)} available: lower {fix}")


def cpu_bf16():
    """Whether this CPU computes bf16 natively: AMX tiles (matrix units) or AVX512-BF16, and oneDNN may use them."""
    if os.environ.get('ONEDNN_MAX_CPU_ISA', '').upper() in NO_BF16_ISA:
        return False
    return torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()


def teardown():
    """Destroy the process groups and end their threads before the interpreter exits. destroy_process_group only
    unregisters a gloo group: its C++ object, with two worker threads (pt_gloo_runloop) and a TCP loop thread
    (gloo_tcp_loop), lives on while anything holds it, and the finished run's device mesh does (DTensor's sharding
    caches keep the mesh, the mesh keeps its groups). Those threads then ran into interpreter finalisation, where a
    worker that releases the last reference to a finished collective's tensor must take the GIL; a finalising
    interpreter ends such a thread, inside C++ code that may not be unwound, and the process aborted with "terminate
    called without an active exception" (exit -6) after a successful run, when load delayed the worker. Here the
    groups lose their last holders and their destructors join the threads while Python is alive
    (tests/test_fsdp.py::test_no_thread_of_the_process_groups_outlives_main)."""
    if not dist.is_initialized():
        return
    gc.collect()   # the finished run's model and optimizer (reference cycles)
    dist.destroy_process_group()
    if 'torch.distributed.device_mesh' in sys.modules:   # meshes that DTensor's caches keep hold their groups
        from torch.distributed.device_mesh import DeviceMesh
        for mesh in [o for o in gc.get_objects() if issubclass(type(o), DeviceMesh)]:   # type(): no __class__ lookup
            mesh._pg_registry.clear()
    gc.collect()   # the groups themselves: their destructors join the worker threads


ERROR_WAIT_S = 30   # how long a rank other than 0 waits for rank 0's error line before printing its own
ERROR_KEY = 'train.py: rank 0 printed the error'


def report_error(text):
    """Print `error: <text>` once for the whole run. Under torchrun the ranks usually fail together (agree, or a
    collective such as a sharded load that fails on every rank), and torchrun stops every other rank as soon as the
    first one exits: rank 1 exiting first could cut rank 0's line off. So rank 0 prints and then marks it in the
    launch's store, and every other rank waits for that mark before it exits; a rank that sees no mark within
    ERROR_WAIT_S (its failure was its own, or rank 0 is gone) prints its line itself, named by its rank."""
    entry.ending()   # the line is the run's last word: a signal during the teardown that follows is not raised
    if not dist.is_initialized() or dist.get_world_size() == 1:
        if int(os.environ.get('RANK', 0)) == 0:
            print(f"error: {text}", file=sys.stderr, flush=True)
        return
    store = dist.distributed_c10d._get_default_store()
    if dist.get_rank() == 0:
        print(f"error: {text}", file=sys.stderr, flush=True)
        store.set(ERROR_KEY, '1')
        return
    try:
        store.wait([ERROR_KEY], datetime.timedelta(seconds=ERROR_WAIT_S))
    except (RuntimeError, dist.DistError):   # no mark in time, or the store is gone with the agent
        print(f"error: rank {dist.get_rank()}: {text}", file=sys.stderr, flush=True)


def lost_peer(e):
    """Whether an exception is a collective's failure because another rank is gone (gloo: 'Connection closed by
    peer', 'Connection reset by peer'; torch's distributed errors)."""
    return dist.is_initialized() and (isinstance(e, dist.DistError) or 'third_party/gloo' in str(e)
                                      or 'NCCL' in str(e))


def lost_peer_text(e, cfg):
    detail = ' '.join(str(e).split()).split('] ', 1)[-1]   # gloo's own words, without its source path
    detail = detail.split('. ', 1)[0][:160]
    return (f"rank {dist.get_rank()} lost contact with another rank ({detail}): a rank stopped or was killed (torchrun's "
            f"summary below names it); the last checkpoint in {cfg.get('out_dir')} is kept: continue with torchrun ... "
            f"--init_from=resume")


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


def choose_device(spec):
    """--device: 'auto' is cuda when there is a GPU, else cpu; a device this machine lacks is a one-line ValueError
    (train.py's check)."""
    problem = device_problem(spec)
    if problem:
        raise ValueError(problem)
    return ('cuda' if torch.cuda.is_available() else 'cpu') if spec == 'auto' else spec
