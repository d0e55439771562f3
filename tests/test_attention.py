"""attention.py against formulas written here in float64: every variant, every route, masks, analysis probabilities.

The variants are model.CHOICES['attn'] (and the attention bias): a variant added there is checked by every test
below against its entry in REFERENCES, its formula from its paper written here (not read from attention.py); until
that entry exists, each test fails saying so."""
import contextlib
import math

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import attention as attention_module
from attention import attention, attention_probs, extra_key_attention
from model import CHOICES, GPTConfig

VARIANTS = [*CHOICES['attn'], 'attn_bias']


def cfg_for(variant, **kw):
    base = dict(n_layer=1, n_head=2, n_embd=16, block_size=12, vocab_size=50)
    base.update(kw)
    if variant == 'attn_bias':
        return GPTConfig(attn='softmax', attn_bias=True, **base)
    return GPTConfig(attn=variant, **base)


def softmax_with(s, visible, extra=0.0):
    """exp(s_i) / (extra + sum_j exp(s_j)) over the visible keys: softmax (extra 0), or one more key of weight extra."""
    e = torch.exp(s) * visible
    return e / (e.sum(-1, keepdim=True) + extra)


def clipped_softmax(s, visible, c):
    return ((c.clip_zeta - c.clip_gamma) * softmax_with(s, visible) + c.clip_gamma).clamp(0, 1)


def sigmoid_attention(s, visible, c):
    b = -math.log(c.block_size) if c.sigmoid_bias is None else c.sigmoid_bias
    return torch.sigmoid(s + b) * visible


def softpick(s, visible, c):
    """Zuhri et al. (2025): ReLU(e^s_i - 1) / (sum_j |e^s_j - 1| + eps) over the visible keys, eps = 1e-8 as in their
    code; in float64 as written (e^s fits float64 for the logits the tests use)."""
    e = torch.expm1(s) * visible
    return torch.relu(e) / (e.abs().sum(-1, keepdim=True) + 1e-8)


def relu_attention(s, visible, c):
    """Guo et al. (2024): ReLU(s_ij) / i over the visible keys j, i the query's 1-based position (their code divides
    row i of the ReLU'd scores by i); no normalisation."""
    i = torch.arange(1, s.size(-2) + 1, dtype=torch.float64)[:, None]
    return torch.relu(s) * visible / i


# attn -> its weights over the real keys, from the float64 scores s (B, H, T, T), the visible mask and the config
REFERENCES = {
    'softmax': lambda s, visible, c: softmax_with(s, visible),
    'softmax1': lambda s, visible, c: softmax_with(s, visible, 1.0),           # the paper: exp(s_i) / (1 + sum exp(s_j))
    'gated': lambda s, visible, c: softmax_with(s, visible),                   # softmax; the gate is model.py's
    'clipped': clipped_softmax,                                                # clip((zeta - gamma) softmax + gamma, 0, 1)
    'sigmoid': sigmoid_attention,                                              # sigmoid(s + b), not normalised
    'softpick': softpick,
    'relu': relu_attention,                                                    # ReLU(s) / i, not normalised
}


def reference_probs(q, k, config, sink=None):
    """The variants' attention weights over the real keys (B, H, T, T) in float64: REFERENCES[config.attn], or with a
    bias key k' (sink), exp(s_i) / (exp(q.k' / sqrt(d)) + sum_j exp(s_j))."""
    if config.attn not in REFERENCES:
        pytest.fail(f"attn={config.attn!r} (model.CHOICES) has no float64 reference: write its formula, from its paper, "
                    f"into REFERENCES in tests/test_attention.py")
    T, d = q.size(2), q.size(3)
    s = (q.double() @ k.double().transpose(-2, -1)) / math.sqrt(d)
    visible = torch.ones(T, T, dtype=torch.bool).tril()
    p = config.causal_free_prefix
    visible[:p, :p] = True
    if sink is not None:
        return softmax_with(s, visible, torch.exp((q.double() * sink[0].double()).sum(-1, keepdim=True) / math.sqrt(d)))
    return REFERENCES[config.attn](s, visible, config)


def test_every_attention_variant_has_a_reference():
    missing = [a for a in CHOICES['attn'] if a not in REFERENCES]
    assert not missing, (f"model.CHOICES['attn'] has {missing} without a float64 reference: write each formula, from "
                         f"its paper, into REFERENCES in tests/test_attention.py")
    assert set(REFERENCES) <= set(CHOICES['attn']), 'REFERENCES names a variant model.CHOICES lacks'


def reference_attention(q, k, v, config, dropout_p=0.0, sink=None):
    """The attention output in float64 (cast back to q's dtype); with a bias key, its value gets the rest."""
    probs = reference_probs(q, k, config, sink)
    y = probs @ v.double()
    if sink is not None:
        y = y + (1 - probs.sum(-1, keepdim=True)) * sink[1].double()
    return y.to(q.dtype)


def qkv(B=3, H=2, T=12, d=8, seed=0, dtype=torch.float32):
    """q, k, v as the model makes them (views into one (B, T, 3 H d) projection), and the leaf."""
    torch.manual_seed(seed)
    x = torch.randn(B, T, 3 * H * d, dtype=dtype, requires_grad=True)
    return x, [t.view(B, T, H, d).transpose(1, 2) for t in x.split(H * d, dim=2)]


def bias_kv(H=2, d=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, H, 1, d, generator=g).requires_grad_() for _ in range(2))


def grads(out, leaves, g):
    return torch.autograd.grad((out.double() * g).sum(), leaves)


@pytest.mark.parametrize('prefix', [0, 4])
@pytest.mark.parametrize('variant', VARIANTS)
def test_every_variant_matches_its_formula_outputs_and_grads(variant, prefix):
    """Training path (fused where possible) vs the float64 formula, fp32: outputs and the gradients of q, k,
    v and, for attn_bias, of the bias key and value, within 1e-5."""
    cfg = cfg_for(variant, causal_free_prefix=prefix)
    x, (q, k, v) = qkv()
    sink = bias_kv() if variant == 'attn_bias' else None
    leaves = [x] + (list(sink) if sink else [])
    g = torch.randn(q.shape, dtype=torch.float64)
    out = attention(q, k, v, cfg, 0.0, sink)
    ref = reference_attention(q, k, v, cfg, sink=sink)
    assert (out - ref).abs().max() <= 1e-5
    for a, b in zip(grads(out, leaves, g), grads(ref, leaves, g)):
        assert (a - b).abs().max() <= 1e-5


@pytest.mark.parametrize('T', [12, 100])
@pytest.mark.parametrize('prefix', [0, 1, 4])
@pytest.mark.parametrize('route', ['lse', 'lse_math', 'extra_key'])
@pytest.mark.parametrize('variant', ['softmax1', 'attn_bias'])
def test_sink_routes_match_formula(variant, route, prefix, T, monkeypatch):
    """The log-sum-exp route (with the kernel SDPA picks, and with its eager fallback forced) and the
    extra-key route against the formula; T=100 spans several kernel blocks, not a multiple of any."""
    cfg = cfg_for(variant, causal_free_prefix=prefix, block_size=T)
    x, (q, k, v) = qkv(T=T)
    sink = bias_kv() if variant == 'attn_bias' else None
    leaves = [x] + (list(sink) if sink else [])
    g = torch.randn(q.shape, dtype=torch.float64)
    eager = []   # calls of the eager fallback: forced for 'lse_math', never needed on CPU otherwise
    for name in ('_math_forward', '_math_backward'):
        monkeypatch.setattr(attention_module, name, lambda *a, f=getattr(attention_module, name): eager.append(f) or f(*a))
    with sdpa_kernel([SDPBackend.MATH]) if route == 'lse_math' else contextlib.nullcontext():
        out = extra_key_attention(q, k, v, prefix, 0.0, sink) if route == 'extra_key' else attention(q, k, v, cfg, 0.0, sink)
        got = grads(out, leaves, g)
    assert len(eager) == (2 if route == 'lse_math' else 0)
    ref = reference_attention(q, k, v, cfg, sink=sink)
    assert (out - ref).abs().max() <= 1e-5
    for a, b in zip(got, grads(ref, leaves, g)):
        assert (a - b).abs().max() <= 1e-5


def test_attn_bias_with_zero_key_and_value_is_softmax1():
    """Softmax-1 is attention with one more key of logit 0 (k' = 0) and value 0: outputs and gradients agree."""
    x, (q, k, v) = qkv()
    zero = tuple(torch.zeros(1, 2, 1, 8, requires_grad=True) for _ in range(2))
    g = torch.randn(q.shape)
    a = attention(q, k, v, cfg_for('attn_bias'), 0.0, zero)
    b = attention(q, k, v, cfg_for('softmax1'))
    ga, = torch.autograd.grad((a * g).sum(), x)
    gb, = torch.autograd.grad((b * g).sum(), x)
    assert (a - b).abs().max() <= 1e-6 and (ga - gb).abs().max() <= 1e-6
    pa, pb = attention_probs(q, k, cfg_for('attn_bias'), zero), attention_probs(q, k, cfg_for('softmax1'))
    assert (pa - pb).abs().max() <= 1e-7


@pytest.mark.parametrize('variant', VARIANTS)
def test_causal_masking_is_kept(variant):
    """No query sees a later key: the gradient of output position i with respect to k, v at j > i is zero
    (beyond a free prefix of 3, whose tokens see each other)."""
    cfg = cfg_for(variant, causal_free_prefix=3)
    x, (q, k, v) = qkv(B=1)
    sink = bias_kv() if variant == 'attn_bias' else None
    out = attention(q, k, v, cfg, 0.0, sink)
    for i in (0, 2, 5, 9):
        gx, = torch.autograd.grad(out[:, :, i].sum(), x, retain_graph=True)
        gk, gv = gx.view(1, 12, 3, 16)[0, :, 1:].abs().sum(-1).unbind(-1)   # per position, k and v parts
        later = torch.arange(12) > max(i, 2)
        assert gk[later].max() == 0 and gv[later].max() == 0
        assert gv[~later].sum() > 0


@pytest.mark.parametrize('prefix', [0, 4])
@pytest.mark.parametrize('variant', VARIANTS)
def test_analysis_probabilities_are_the_formula(variant, prefix):
    cfg = cfg_for(variant, causal_free_prefix=prefix)
    _, (q, k, v) = qkv()
    sink = bias_kv() if variant == 'attn_bias' else None
    p = attention_probs(q, k, cfg, sink)
    assert p.dtype == torch.float32
    assert (p.double() - reference_probs(q, k, cfg, sink)).abs().max() <= 1e-6


def test_clipped_softmax_reaches_exact_zeros_and_ones():
    """What clipping is for: a key can get exactly 0 (and a dominant one exactly 1) with finite logits."""
    cfg = cfg_for('clipped', clip_gamma=-0.1, clip_zeta=1.1)
    q = torch.tensor([[[[4.0, 0.0], [4.0, 0.0]]]])
    k = torch.tensor([[[[0.0, 0.0], [4.0, 0.0]]]])
    p = attention_probs(q, k, cfg)
    assert p[0, 0, 1].tolist() == [0.0, 1.0]


@pytest.mark.parametrize('scale', [1e-3, 1.0, 60.0])
def test_softpick_is_exact_near_zero_and_for_logits_whose_exp_overflows(scale):
    """Logits of about 1e-3 (where e^s - 1 computed as a difference keeps 4 digits in fp32) and up to about 500 (e^s
    overflows fp32 past 88): probabilities within 1e-6 of the float64 formula, finite gradients equal to its within
    1e-5 relative; a row whose visible logits are all <= 0 is exactly zero."""
    cfg = cfg_for('softpick')
    x, (q, k, v) = qkv()
    q = q * scale
    p = attention_probs(q, k, cfg)
    ref = reference_probs(q, k, cfg)
    assert (q @ k.transpose(-2, -1)).abs().max() > {1e-3: 1e-3, 1.0: 1, 60.0: 100}[scale]
    assert (p.double() - ref).abs().max() <= 1e-6
    g = torch.randn(v.shape, dtype=torch.float64)
    got, = torch.autograd.grad(((p.double() @ v.double()) * g).sum(), x, retain_graph=True)
    want, = torch.autograd.grad(((ref @ v.double()) * g).sum(), x)
    assert torch.isfinite(got).all() and (got - want).abs().max() <= 1e-5 * want.abs().max()
    empty = attention_probs(q.abs(), -q.abs(), cfg)      # every logit <= 0
    assert torch.equal(empty, torch.zeros_like(empty))


def test_relu_attention_divides_by_the_query_position_and_is_not_normalised():
    """Head size 1, q = (1, 2, 3), k = (2, -1, 3): logits s_ij = q_i k_j, so by hand row 0 = ReLU(2) / 1 = 2, row 1 =
    ReLU(4, -2) / 2 = (2, 0), row 2 = ReLU(6, -3, 9) / 3 = (2, 0, 3): rows summing to 2, 2 and 5. The last query alone
    after a cache of two keys (S = 3, T = 1) is still divided by its position 3."""
    cfg = cfg_for('relu')
    q, k = torch.tensor([1.0, 2.0, 3.0]).view(1, 1, 3, 1), torch.tensor([2.0, -1.0, 3.0]).view(1, 1, 3, 1)
    p = attention_probs(q, k, cfg)
    assert p[0, 0].tolist() == [[2, 0, 0], [2, 0, 0], [2, 0, 3]]
    assert attention_probs(q[:, :, 2:], k, cfg)[0, 0].tolist() == [[2, 0, 3]]
    empty = attention_probs(-q, k.abs(), cfg)      # every logit < 0: the query attends nowhere
    assert torch.equal(empty, torch.zeros_like(empty))


def test_sigmoid_default_bias_is_minus_log_block_size():
    cfg = cfg_for('sigmoid', block_size=64)
    zeros = torch.zeros(1, 1, 4, 8)
    p = attention_probs(zeros, zeros, cfg)
    assert p[0, 0, 3, 0].item() == pytest.approx(1 / (1 + 64))   # sigmoid(-log 64)
    assert attention_probs(zeros, zeros, cfg_for('sigmoid', sigmoid_bias=0.0))[0, 0, 3, 0] == 0.5


def test_sink_route_is_the_default_and_has_no_extra_position(monkeypatch):
    """Without dropout the training path never builds T+1 positions; with dropout it takes the extra key."""
    calls = []
    monkeypatch.setattr(attention_module, 'extra_key_attention', lambda *a: calls.append(a) or a[0])
    _, (q, k, v) = qkv()
    attention(q, k, v, cfg_for('softmax1'))
    attention(q, k, v, cfg_for('attn_bias'), 0.0, bias_kv())
    assert calls == []
    attention(q, k, v, cfg_for('softmax1'), dropout_p=0.1)
    attention(q, k, v, cfg_for('attn_bias'), 0.1, bias_kv())
    assert len(calls) == 2


def test_sink_route_bf16_within_bf16_rounding():
    cfg = cfg_for('softmax1', block_size=64)
    _, (q, k, v) = qkv(T=64, dtype=torch.bfloat16)
    out = attention(q, k, v, cfg)
    ref = reference_attention(q.double(), k.double(), v.double(), cfg)
    assert out.dtype == torch.bfloat16
    assert (out.double() - ref).abs().max() <= 2e-2 * ref.abs().max()


@pytest.mark.slow   # torch.library.opcheck's many calls
def test_custom_ops_pass_torch_opcheck():
    """Fake (meta) implementations, autograd registration and schemas agree with the real kernels,
    which is what torch.compile relies on: softmax-1 (0-d sink) and attn_bias (per-query logit, per-head value)."""
    _, (q, k, v) = qkv()
    q, k, v = (t.detach().contiguous() for t in (q, k, v))
    key, value = (t.detach() for t in bias_kv())
    zero_c, zero_u = torch.zeros(()), torch.zeros(())
    c = attention_module.sink_logit(q, key)
    for prefix, sink in ((0, (zero_c, zero_u)), (4, (zero_c, zero_u)), (0, (c, value)), (3, (c, value))):
        args = [t.clone().requires_grad_() for t in (q, k, v)] + [s.clone().requires_grad_(s.dim() > 0) for s in sink]
        torch.library.opcheck(torch.ops.softmax1.sink_attention.default, args + [prefix])
    y, lse = attention_module.sink_attention(q, k, v, c, value, 0)
    for sink_grads in (False, True):
        torch.library.opcheck(torch.ops.softmax1.sink_attention_backward.default,
                              [torch.randn(q.shape), q, k, v, c, value, y, lse, 0, sink_grads])
