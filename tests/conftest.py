import contextlib
import errno
import json
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
if not __import__('torch').cuda.is_available():
    # the Triton kernels (kernels/flash_sink.py, kernels/orthoadam.py) run in Triton's interpreter on the CPU; it must be
    # chosen before they are defined, i.e. before either module is imported
    os.environ.setdefault('TRITON_INTERPRET', '1')


def write_dataset(path, vocab_size=64, n_train=60_000, n_val=8_000, dtype='uint16', seed=0):
    """A prepared-data folder in the documented format (train.bin, val.bin, meta.json), filled with a
    low-entropy bigram process so that a tiny model's loss falls within a few dozen steps."""
    os.makedirs(path, exist_ok=True)
    rng = np.random.default_rng(seed)
    nxt = rng.integers(0, vocab_size, size=(vocab_size, 3))   # each token has 3 likely successors
    splits = {}
    for split, n in (('train', n_train), ('val', n_val)):
        toks = np.empty(n, dtype=np.int64)
        toks[0] = 0
        choice = rng.integers(0, 3, size=n)
        noise = rng.random(n) < 0.05
        rand = rng.integers(0, vocab_size, size=n)
        for i in range(1, n):
            toks[i] = rand[i] if noise[i] else nxt[toks[i - 1], choice[i]]
        toks[-1] = vocab_size - 1   # the end-of-text token also occurs at random: documents of random length
        toks.astype(dtype).tofile(os.path.join(path, f'{split}.bin'))
        splits[split] = {'documents': int((toks == vocab_size - 1).sum()), 'tokens': n, 'sha256': ''}
    meta = {'format': 1, 'tokenizer': 'test-bigram', 'vocab_size': vocab_size, 'eot_token': vocab_size - 1,
            'dtype': dtype, 'source': 'synthetic test data', 'stand_in_for_c4': True,
            'description': 'bigram process written by tests/conftest.py', 'splits': splits, 'args': {}}
    with open(os.path.join(path, 'meta.json'), 'w') as f:
        json.dump(meta, f)
    return path


def full_disk_writes(module, monkeypatch):
    """module.atomic_write's file writes 10 bytes, then finds the disk full (ENOSPC)."""
    real = module.atomic_write

    class Full:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            self.f.write(data[:10])
            self.f.flush()
            raise OSError(errno.ENOSPC, 'No space left on device', self.f.name)

    @contextlib.contextmanager
    def full(path, mode='w', **kwargs):
        with real(path, mode, **kwargs) as f:
            yield Full(f)
    monkeypatch.setattr(module, 'atomic_write', full)


def refused_writes(module, monkeypatch, error):
    """module.atomic_write cannot create its file: `error` (a read-only folder, a full disk) as it opens it."""
    @contextlib.contextmanager
    def refused(path, mode='w', **kwargs):
        raise error
        yield   # a generator: what contextmanager needs
    monkeypatch.setattr(module, 'atomic_write', refused)


@pytest.fixture(scope='module')
def one_thread():
    """One intra-op thread for a module's tests: tiny tensors gain nothing from a second one, which only waits (and on
    a busy 2-core machine stalls the test many times over). Modules use it with
    pytestmark = pytest.mark.usefixtures('one_thread')."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope='session')
def bigram_data(tmp_path_factory):
    return write_dataset(str(tmp_path_factory.mktemp('data') / 'bigram'))


@pytest.fixture(scope='session')
def gpt2_ranks_path(tmp_path_factory):
    """GPT-2's BPE ranks file, got the way a user gets it: the local copy harness/tokenizer.py finds ($GPT2_TIKTOKEN, the
    corpus cache, tiktoken's cache), else the pinned openai-whisper sdist that pinned.gpt2_ranks fetches from PyPI
    and sha256-checks, into a folder of this test run (once per run). Skips, saying why, when PyPI is unreachable."""
    from pinned_corpus import build as pinned
    from harness.tokenizer import gpt2_ranks_file
    local = gpt2_ranks_file()
    if local is not None:
        return os.path.abspath(local)   # a test that changes its working directory still finds it
    try:
        return str(pinned.gpt2_ranks(tmp_path_factory.mktemp('gpt2_ranks')))
    except pinned.CorpusError as e:
        if 'cannot download' in str(e):   # no network: what a user without it would see
            pytest.skip(f"needs GPT-2's BPE ranks, and PyPI is unreachable: {e}")
        raise


@pytest.fixture
def gpt2_ranks(gpt2_ranks_path, monkeypatch):
    """gpt2_ranks_path, named by $GPT2_TIKTOKEN for this test (and the processes it starts)."""
    monkeypatch.setenv('GPT2_TIKTOKEN', gpt2_ranks_path)
    return gpt2_ranks_path


def pytest_configure(config):
    # torch.compile's CPU backend imports torch.utils.mkldnn, whose ScriptModules use torch.jit.script_method: one
    # DeprecationWarning per method (14) from inside torch, nothing this repository calls. Only that message, from
    # torch.jit._script, is silenced; every other warning still shows.
    config.addinivalue_line('filterwarnings', 'ignore:`torch.jit.script_method` is deprecated:DeprecationWarning:'
                            'torch.jit._script')
    config.addinivalue_line('markers', 'gpu: run on CUDA by gpu_suite.py (python -m pytest -m gpu tests); tests/test_gpu.py '
                            'skips without CUDA, the Triton kernels\' tests run in the interpreter there')
    config.addinivalue_line('markers', 'slow: left out of the quick tier (python -m pytest -q -m "not slow" tests): '
                            'trainings, torchrun, the corpus, fault injection, public models, torch.compile, the Triton '
                            'interpreter, scripts run as subprocesses; the full suite runs them (docs/tests.md)')


def read_only_run(cmd, folder, cwd=ROOT, timeout=300):
    """subprocess.run(cmd) while `folder` is a read-only filesystem: an empty tmpfs mounted read-only over it, in a
    mount namespace of the command's own (unshare -rm: no root needed where user namespaces are allowed, nothing
    mounted for anyone else). Skips the test on a machine that cannot."""
    import shutil
    import subprocess
    if not shutil.which('unshare') or subprocess.run(['unshare', '-rm', 'true'], capture_output=True).returncode:
        pytest.skip('needs unshare -rm (a mount namespace) for a read-only mount')
    os.makedirs(folder, exist_ok=True)
    script = 'mount -t tmpfs -o ro,size=64k tmpfs "$0" && exec "$@"'
    return subprocess.run(['unshare', '-rm', 'sh', '-c', script, str(folder), *cmd], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)
