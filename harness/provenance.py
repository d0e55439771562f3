"""Where an output came from: the code (git commit), the corpus definition (pinned_corpus/manifest.json's sha256), the
data (each split's sha256 from meta.json), the library versions and the device. No path is recorded.

Written into data/<name>/meta.json ("provenance"), a run's log.jsonl (one {"event": "provenance", "iter", ...}
line for every job that trains: a fresh start and each resume), and the JSON of analyze.py and eval_quant.py
("provenance"). The record:
    {"commit": "<40 hex>" (+ "-dirty" when tracked files differ from it) or null outside a git checkout,
     "corpus_manifest_sha256", "python", "torch", "numpy", "device" (e.g. "cpu (2 cores, AMD EPYC)", "NVIDIA H100 80GB HBM3"),
     "data": {"train": sha256, "val": sha256} (when the data is known)}
"""
import functools
import os
import platform
import subprocess
from importlib.metadata import PackageNotFoundError, version

from harness.fileio import MANIFEST, file_sha256

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.lru_cache(maxsize=None)
def git_commit():
    """HEAD of the checkout this file is in, '-dirty' when a tracked file differs from it; None without git, and
    None when the git repository around ROOT is not this project's own (its top level is not ROOT: e.g. a `git
    archive` tarball unpacked inside a home folder kept in git, whose HEAD says nothing about this code)."""
    try:
        head = subprocess.run(['git', 'rev-parse', '--show-toplevel', 'HEAD'], cwd=ROOT, capture_output=True,
                              text=True, timeout=30)
        lines = head.stdout.splitlines()
        if head.returncode != 0 or len(lines) != 2 or not os.path.samefile(lines[0], ROOT):
            return None
        dirty = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'], cwd=ROOT,
                               capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return lines[1] + ('-dirty' if dirty.returncode == 0 and dirty.stdout.strip() else '')


def cpu_model(cpuinfo='/proc/cpuinfo'):
    """The CPU's model name as the kernel reports it (the first 'model name' of /proc/cpuinfo; a virtual machine may
    shorten it, e.g. 'AMD EPYC'), else platform.processor(); None when neither says. Two CPUs can round the same
    fp32 training differently, so a CPU run's numbers are tied to it."""
    try:
        with open(cpuinfo, errors='replace') as f:
            for line in f:
                key, _, value = line.partition(':')
                if key.strip() == 'model name' and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def device_name(device=None, detail=None):
    """'cpu (N cores, <model>)' or the CUDA device's name; None when no device is involved (data preparation).

    `detail` (e.g. '2 threads') joins a CPU's parentheses: 'cpu (N cores, <model>, 2 threads)'."""
    if device is None:
        return None
    import torch   # only here: data preparation records provenance without loading torch
    device = torch.device(device)
    if device.type == 'cuda' and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    if device.type != 'cpu':
        return device.type
    parts = [f'{os.cpu_count()} cores', cpu_model(), detail]
    return f"cpu ({', '.join(part for part in parts if part)})"


def _version(package):
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def record(device=None, meta=None):
    """The provenance record (module docstring) of an output made on `device` from the data of `meta`."""
    rec = {'commit': git_commit(),
           'corpus_manifest_sha256': file_sha256(MANIFEST) if MANIFEST.is_file() else None,
           'python': platform.python_version(), 'torch': _version('torch'), 'numpy': _version('numpy'),
           'device': device_name(device)}
    if meta and meta.get('splits'):
        rec['data'] = {split: info.get('sha256') for split, info in meta['splits'].items()}
    return rec
