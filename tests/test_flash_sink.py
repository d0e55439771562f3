"""kernels/flash_sink.py's Triton kernels on the CPU, in Triton's interpreter, against the float64 formula.

The interpreter runs the kernels' own code (tile loops, masks, the online softmax, the backward's partial sums)
with numpy in fp32, so these tests check the arithmetic that CUDA runs; tests/test_gpu.py repeats them on a GPU
in bf16 / fp16 / fp32 and under torch.compile. Skipped where Triton is not installed.
"""
import math
import os

import pytest
import torch

pytest.importorskip('triton')   # conftest.py chose the interpreter where there is no GPU
from kernels import flash_sink  # noqa: E402
from model import GPTConfig  # noqa: E402
from test_attention import reference_attention  # noqa: E402

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
pytestmark = [pytest.mark.slow,   # the Triton kernels in Triton's interpreter
              pytest.mark.gpu,   # on a GPU, gpu_suite.py runs them on CUDA
              pytest.mark.skipif(DEVICE == 'cpu' and os.environ.get('TRITON_INTERPRET') != '1',
                                 reason='Triton needs CUDA or TRITON_INTERPRET=1 (set before flash_sink is imported)')]


def case(variant, T, prefix, d=16, B=2, H=2, seed=0, scale=1.0):
    """x (the c_attn output q, k, v are views of), the attn_bias key and value, and the config."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(B, T, 3 * H * d, generator=g) * scale).to(DEVICE).requires_grad_()
    sink = tuple((torch.randn(1, H, 1, d, generator=g) * 2).to(DEVICE).requires_grad_() for _ in range(2)) \
        if variant == 'attn_bias' else None
    cfg = GPTConfig(attn='softmax' if sink else 'softmax1', attn_bias=bool(sink), n_layer=1, n_head=H,
                    n_embd=H * d, block_size=T, causal_free_prefix=prefix, vocab_size=50)
    return x, sink, cfg


def split(x, H, d):
    B, T = x.shape[:2]
    return [t.view(B, T, H, d).transpose(1, 2) for t in x.split(H * d, dim=2)]


def check(variant, T, prefix, d=16, scale=1.0, tol=2e-5):
    """Kernel output and gradients (x and, for attn_bias, k' and v') against the float64 formula."""
    H = 2
    x, sink, cfg = case(variant, T, prefix, d, H=H, scale=scale)
    y = flash_sink.flash_sink_attention(*split(x, H, d), prefix, *(sink or (None, None)))
    dy = torch.randn(y.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    got = torch.autograd.grad(y, [x] + list(sink or ()), dy.to(y))
    x64 = x.detach().cpu().double().requires_grad_()
    sink64 = [s.detach().cpu().double().requires_grad_() for s in sink] if sink else None
    ref = reference_attention(*split(x64, H, d), cfg, sink=sink64)
    want = torch.autograd.grad(ref, [x64] + (sink64 or []), dy)
    assert (y.cpu().double() - ref).abs().max() <= tol * max(1.0, ref.abs().max().item())
    for name, a, b in zip(['x', "k'", "v'"], got, want):
        assert (a.cpu().double() - b).abs().max() <= tol * max(1.0, b.abs().max().item()), name
    return y


@pytest.mark.parametrize('variant', ['softmax1', 'attn_bias'])
@pytest.mark.parametrize('T,prefix', [(12, 0), (12, 4), (64, 0), (200, 0), (200, 130), (257, 1)])
def test_kernel_matches_formula(variant, T, prefix):
    """Causal (T = 12: one tile; 200, 257: several, the last one partial), with a free prefix shorter than a tile,
    longer than one (130), and of one token."""
    check(variant, T, prefix)


@pytest.mark.parametrize('d', [32, 64])
def test_kernel_other_head_sizes(d):
    check('attn_bias', 100, 3, d=d)


def test_kernel_large_scores_do_not_overflow():
    """Scores of several hundred (a sharp softmax): the running max keeps exp finite, rows still sum below 1."""
    check('softmax1', 80, 0, scale=12.0, tol=1e-4)


@pytest.mark.parametrize('fwd', flash_sink.FWD_CANDIDATES)
def test_every_forward_tile_shape_is_exact(fwd, monkeypatch):
    """Every tile shape the tuner may pick gives the same function (a pair of backward tiles with it)."""
    monkeypatch.setattr(flash_sink, 'FORCE', (fwd, flash_sink.BWD_CANDIDATES[0]))
    check('attn_bias', 150, 5)


@pytest.mark.parametrize('bwd', flash_sink.BWD_CANDIDATES)
def test_every_backward_tile_shape_is_exact(bwd, monkeypatch):
    monkeypatch.setattr(flash_sink, 'FORCE', (flash_sink.FWD_CANDIDATES[0], bwd))
    check('attn_bias', 150, 5)


def test_log_sum_exp_includes_the_sink():
    """The kernel's stored L2 is log2(exp(c) + sum_j exp(s_j)) per query: what its backward relies on."""
    H, d, T = 2, 16, 70
    x, sink, cfg = case('attn_bias', T, 0, d, H=H)
    q, k, v = split(x.detach(), H, d)
    ks, vs = (s.detach() for s in sink)
    _, l2 = flash_sink._forward(q, k, v, ks, vs, 0, flash_sink._direct)
    s = (q.double() @ k.double().transpose(-2, -1)) / math.sqrt(d)
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=s.device).tril(), float('-inf'))
    c = (q.double() * ks.double()).sum(-1, keepdim=True) / math.sqrt(d)
    want = torch.logsumexp(torch.cat([c, s], dim=-1), dim=-1) / math.log(2)
    assert (l2.double() - want).abs().max() <= 1e-5


def test_output_layout_and_unsupported_inputs():
    """y is laid out as (B, T, H, d); supported() names what the kernel cannot take, in one line."""
    x, _, _ = case('softmax1', 20, 0)
    q, k, v = split(x.detach(), 2, 16)
    y = flash_sink.flash_sink_attention(q, k, v)
    assert y.stride() == (20 * 2 * 16, 16, 2 * 16, 1)
    assert flash_sink.supported(q, k, v) is None
    odd = torch.randn(1, 2, 8, 24)
    assert 'head size 24' in flash_sink.supported(odd, odd, odd)
    assert 'dtype' in flash_sink.supported(*(torch.zeros(1, 2, 8, 16, dtype=torch.int32),) * 3)
