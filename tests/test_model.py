"""model.py against slow eager references: softmax-1 exactness, analysis path, init, toggles."""
import contextlib
import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import model as model_module
from model import GPT, GPTConfig, apply_rotary, attention


def tiny(**kw):
    base = dict(n_layer=2, n_head=2, n_embd=16, block_size=12, vocab_size=50, dropout=0.0)
    base.update(kw)
    return GPTConfig(**base)


def reference_attention(q, k, v, config, dropout_p=0.0):
    """Direct formula in float64: softmax or exp(s_i) / (1 + sum_j exp(s_j)) over the visible keys."""
    T, d = q.size(2), q.size(3)
    s = (q.double() @ k.double().transpose(-2, -1)) / math.sqrt(d)
    visible = torch.ones(T, T, dtype=torch.bool).tril()
    p = config.causal_free_prefix
    visible[:p, :p] = True
    e = torch.exp(s) * visible
    denominator = e.sum(-1, keepdim=True) + (1.0 if config.attn == 'softmax1' else 0.0)
    return ((e / denominator) @ v.double()).to(q.dtype)


@pytest.mark.parametrize('attn', ['softmax', 'softmax1'])
@pytest.mark.parametrize('prefix', [0, 1, 4])
def test_fused_attention_matches_reference_outputs_and_grads(attn, prefix):
    cfg = tiny(attn=attn, causal_free_prefix=prefix)
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 2, 12, 8, requires_grad=True) for _ in range(3))
    g = torch.randn(3, 2, 12, 8)
    out = attention(q, k, v, cfg)
    grads = torch.autograd.grad((out * g).sum(), (q, k, v))
    ref = reference_attention(q, k, v, cfg)
    ref_grads = torch.autograd.grad((ref * g).sum(), (q, k, v))
    assert (out - ref).abs().max() <= 1e-5
    for a, b in zip(grads, ref_grads):
        assert (a - b).abs().max() <= 1e-5


def _qkv(B=3, H=2, T=12, d=8, seed=0, dtype=torch.float32):
    """q, k, v as the model makes them: views into one (B, T, 3 H d) projection, and the leaf."""
    torch.manual_seed(seed)
    x = torch.randn(B, T, 3 * H * d, dtype=dtype, requires_grad=True)
    return x, [t.view(B, T, H, d).transpose(1, 2) for t in x.split(H * d, dim=2)]


@pytest.mark.parametrize('T', [12, 100])
@pytest.mark.parametrize('prefix', [0, 1, 4])
@pytest.mark.parametrize('route', ['lse', 'lse_math', 'extra_key'])
def test_softmax1_routes_match_reference_outputs_and_grads(route, prefix, T, monkeypatch):
    """The log-sum-exp route (with the kernel SDPA picks, and with its eager fallback forced) and the
    extra-key route against the fp64 formula; T=100 spans several kernel blocks, not a multiple of any."""
    cfg = tiny(attn='softmax1', causal_free_prefix=prefix, block_size=T)
    x, (q, k, v) = _qkv(T=T)
    g = torch.randn(q.shape)
    eager = []   # calls of the eager fallback: forced for 'lse_math', never needed on CPU otherwise
    for name in ('_math_forward', '_math_backward'):
        monkeypatch.setattr(model_module, name, lambda *a, f=getattr(model_module, name): eager.append(f) or f(*a))
    with sdpa_kernel([SDPBackend.MATH]) if route == 'lse_math' else contextlib.nullcontext():
        out = model_module.softmax1_extra_key(q, k, v, prefix) if route == 'extra_key' else attention(q, k, v, cfg)
        grad, = torch.autograd.grad((out * g).sum(), x)
    assert len(eager) == (2 if route == 'lse_math' else 0)
    ref = reference_attention(q, k, v, cfg)
    ref_grad, = torch.autograd.grad((ref * g).sum(), x)
    assert (out - ref).abs().max() <= 1e-5
    assert (grad - ref_grad).abs().max() <= 1e-5


def test_softmax1_lse_route_is_the_default_and_has_no_extra_position(monkeypatch):
    """Without dropout the training path never builds T+1 positions; with dropout it takes the extra key."""
    calls = []
    monkeypatch.setattr(model_module, 'softmax1_extra_key', lambda *a: calls.append(a) or a[0])
    _, (q, k, v) = _qkv()
    attention(q, k, v, tiny(attn='softmax1'))
    assert calls == []
    attention(q, k, v, tiny(attn='softmax1'), dropout_p=0.1)
    assert len(calls) == 1


def test_softmax1_lse_route_bf16_within_bf16_rounding():
    cfg = tiny(attn='softmax1', block_size=64)
    x, (q, k, v) = _qkv(T=64, dtype=torch.bfloat16)
    out = attention(q, k, v, cfg)
    ref = reference_attention(q.double(), k.double(), v.double(), cfg)
    assert out.dtype == torch.bfloat16
    assert (out.double() - ref).abs().max() <= 2e-2 * ref.abs().max()


def test_softmax1_custom_ops_pass_torch_opcheck():
    """Fake (meta) implementations, autograd registration and schemas agree with the real kernels,
    which is what torch.compile relies on."""
    _, (q, k, v) = _qkv()
    for prefix in (0, 4):
        args = [t.detach().requires_grad_() for t in (q, k, v)] + [prefix]
        torch.library.opcheck(torch.ops.softmax1.attention.default, args)
    y, lse = model_module.softmax1_attention(q, k, v, 0)
    torch.library.opcheck(torch.ops.softmax1.attention_backward.default,
                          [torch.randn(q.shape), q.detach(), k.detach(), v.detach(), y.detach(), lse.detach(), 0])


@pytest.mark.parametrize('pos_emb,prefix', [('absolute', 0), ('rotary', 4), ('none', 1)])
def test_compiled_softmax1_model_matches_eager_reference(pos_emb, prefix, monkeypatch):
    """torch.compile keeps the custom op whole: logits and every parameter gradient of the compiled model
    equal those of the model with the fp64 reference attention."""
    cfg = tiny(attn='softmax1', pos_emb=pos_emb, causal_free_prefix=prefix)
    torch.manual_seed(3)
    m = GPT(cfg)
    idx, tgt = torch.randint(0, 50, (2, 12)), torch.randint(0, 50, (2, 12))
    logits, loss = torch.compile(m, fullgraph=True)(idx, tgt)
    grads = torch.autograd.grad(loss, list(m.parameters()))
    monkeypatch.setattr(model_module, 'attention', reference_attention)
    ref_logits, ref_loss = m(idx, tgt)
    ref_grads = torch.autograd.grad(ref_loss, list(m.parameters()))
    assert (logits - ref_logits).abs().max() <= 1e-5
    for a, b in zip(grads, ref_grads):
        assert (a - b).abs().max() <= 1e-5


def test_softmax1_differs_from_softmax_and_can_attend_nowhere():
    torch.manual_seed(0)
    q = torch.full((1, 1, 4, 8), -3.0)
    k = torch.full((1, 1, 4, 8), 3.0)   # every logit is strongly negative: softmax-1 output ~ 0
    v = torch.randn(1, 1, 4, 8)
    out1 = attention(q, k, v, tiny(attn='softmax1'))
    out0 = attention(q, k, v, tiny(attn='softmax'))
    assert out1.abs().max() < 1e-6
    assert (out0[0, 0, 0] - v[0, 0, 0]).abs().max() < 1e-6   # softmax must put all mass on key 0


@pytest.mark.parametrize('pos_emb', ['absolute', 'rotary', 'none'])
@pytest.mark.parametrize('attn', ['softmax', 'softmax1'])
def test_model_with_fused_attention_matches_model_with_reference(pos_emb, attn, monkeypatch):
    """Whole model (rotary applied before attention): logits and every parameter gradient agree."""
    cfg = tiny(attn=attn, pos_emb=pos_emb)
    torch.manual_seed(1)
    m = GPT(cfg)
    idx = torch.randint(0, 50, (2, 12))
    tgt = torch.randint(0, 50, (2, 12))
    logits, loss = m(idx, tgt)
    grads = torch.autograd.grad(loss, list(m.parameters()))
    monkeypatch.setattr(model_module, 'attention', reference_attention)
    ref_logits, ref_loss = m(idx, tgt)
    ref_grads = torch.autograd.grad(ref_loss, list(m.parameters()))
    assert (logits - ref_logits).abs().max() <= 1e-5
    for a, b in zip(grads, ref_grads):
        assert (a - b).abs().max() <= 1e-5


@pytest.mark.parametrize('attn', ['softmax', 'softmax1'])
@pytest.mark.parametrize('prefix', [0, 3])
def test_analysis_path_returns_what_training_path_computes(attn, prefix):
    cfg = tiny(attn=attn, pos_emb='rotary', causal_free_prefix=prefix)
    torch.manual_seed(2)
    m = GPT(cfg).eval()
    idx = torch.randint(0, 50, (2, 12))
    logits, _ = m(idx)
    a_logits, _, trace = m(idx, analysis=True)
    assert (logits - a_logits).abs().max() <= 1e-5
    assert len(trace['hidden']) == len(trace['attn']) == cfg.n_layer
    assert trace['attn'][0].shape == (2, cfg.n_head, 12, 12)
    # the final hidden state, normalised and projected, gives the logits
    last = m.lm_head(m.transformer.ln_f(trace['hidden'][-1]))[..., :cfg.vocab_size]
    assert (last - logits).abs().max() <= 1e-5
    rows = trace['attn'][1].sum(-1)
    if attn == 'softmax':
        assert torch.allclose(rows, torch.ones_like(rows), atol=1e-6)
    else:
        assert (rows < 1).all() and (rows > 0).all()
    if prefix == 0:   # causal: nothing above the diagonal
        assert trace['attn'][0].triu(1).abs().max() == 0


def test_rotary_scores_depend_only_on_relative_position():
    torch.manual_seed(0)
    cos, sin = model_module.rotary_tables(8, 16)
    q, k = torch.randn(8), torch.randn(8)

    def score(i, j):
        qs = apply_rotary(q.expand(1, 1, 16, 8).clone(), cos, sin)[0, 0, i]
        ks = apply_rotary(k.expand(1, 1, 16, 8).clone(), cos, sin)[0, 0, j]
        return (qs @ ks).item()
    assert score(5, 2) == pytest.approx(score(9, 6), abs=1e-5)
    assert score(5, 2) == pytest.approx(score(3, 0), abs=1e-5)
    assert score(5, 2) != pytest.approx(score(5, 3), abs=1e-3)
    # position 0 is not rotated
    assert torch.allclose(apply_rotary(q.view(1, 1, 1, 8), cos, sin).flatten(), q)


def test_causal_free_prefix_lets_the_prefix_see_itself_and_masks_the_loss():
    k = 4
    cfg = tiny(causal_free_prefix=k, pos_emb='none')
    torch.manual_seed(3)
    m = GPT(cfg)
    idx = torch.randint(0, 50, (1, 12))
    emb = m.transformer.wte(idx).detach().requires_grad_(True)
    # position 0's output depends on token k-1 but not on token k
    x = emb
    for block in m.transformer.h:
        x = block(x, None)
    g = torch.autograd.grad(x[0, 0].sum(), emb)[0]
    assert g[0, k - 1].abs().sum() > 0 and g[0, k].abs().sum() == 0
    tgt = torch.randint(0, 50, (1, 12))
    logits, loss = m(idx, tgt)
    expected = F.cross_entropy(logits[0, k - 1:], tgt[0, k - 1:])
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_padded_vocab_tied_weights_and_loss_over_real_vocabulary():
    cfg = tiny(vocab_size=50)
    m = GPT(cfg)
    assert m.transformer.wte.weight.shape[0] == 64 and cfg.padded_vocab_size % 64 == 0
    assert m.lm_head.weight is m.transformer.wte.weight
    with torch.no_grad():   # make padded rows attractive: they must still not enter the loss
        m.lm_head.weight[50:] = 10 * m.transformer.ln_f.weight.sign()
    idx = torch.randint(0, 50, (2, 12))
    tgt = torch.randint(0, 50, (2, 12))
    logits, loss = m(idx, tgt)
    assert logits.shape == (2, 12, 50)
    h = m.transformer.ln_f(m(idx, analysis=True)[2]['hidden'][-1])
    full = h @ m.lm_head.weight[:50].T
    assert loss.item() == pytest.approx(F.cross_entropy(full.reshape(-1, 50), tgt.reshape(-1)).item(), rel=1e-5)


def test_gpt2_initialisation_statistics():
    cfg = GPTConfig(n_layer=8, n_head=4, n_embd=256, block_size=64, vocab_size=1000)
    torch.manual_seed(0)
    m = GPT(cfg)
    assert m.transformer.h[0].attn.c_attn.weight.std().item() == pytest.approx(0.02, rel=0.03)
    assert m.transformer.h[0].mlp.c_fc.weight.std().item() == pytest.approx(0.02, rel=0.03)
    for proj in (m.transformer.h[3].attn.c_proj, m.transformer.h[3].mlp.c_proj):
        assert proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.03)
        assert proj.bias.abs().max() == 0


def test_num_params_and_flops_match_hand_count():
    C, L, V, T = 16, 2, 64, 12   # vocab 50 is padded to 64
    m = GPT(tiny(bias=False, norm='rmsnorm_single'))
    per_block = 3 * C * C + C * C + 4 * C * C + 4 * C * C + 2   # attn, proj, mlp in/out, two scalar norms
    expected = V * C + T * C + L * per_block + 1
    assert m.num_params() == expected
    assert m.num_params(exclude_embeddings=True) == expected - V * C - T * C
    assert m.flops_per_token() == 6 * (expected - T * C) + 12 * L * C * T
    m2 = GPT(tiny(bias=True, norm='layernorm', mlp='swiglu', pos_emb='rotary'))
    hidden = 64   # 8/3 * 16 = 42 rounded up to a multiple of 64
    per_block2 = (3 * C * C + 3 * C) + (C * C + C) + 2 * (C * hidden + hidden) + (hidden * C + C) + 2 * 2 * C
    assert m2.num_params() == V * C + L * per_block2 + 2 * C


def test_norm_variants_against_formulas():
    x = torch.randn(3, 16) * 5 + 2
    rms = x / x.pow(2).mean(-1, keepdim=True).add(1e-5).sqrt()
    single = model_module.make_norm(tiny(norm='rmsnorm_single'))
    assert single.weight.numel() == 1
    with torch.no_grad():
        single.weight.fill_(1.7)
    assert torch.allclose(single(x), 1.7 * rms, atol=1e-5)
    multi = model_module.make_norm(tiny(norm='rmsnorm'))
    assert multi.weight.numel() == 16
    ln = model_module.make_norm(tiny(norm='layernorm', bias=False))
    assert ln.bias is None
    assert not any('bias' in n for n, _ in GPT(tiny(bias=False)).named_parameters())


@pytest.mark.parametrize('field,value', [('attn', 'softmax2'), ('norm', 'batchnorm'), ('pos_emb', 'alibi'), ('mlp', 'relu')])
def test_invalid_choice_names_field_and_allowed_values(field, value):
    with pytest.raises(ValueError, match=rf"GPTConfig\.{field}=.*allowed: "):
        tiny(**{field: value})


def test_invalid_shapes_are_value_errors():
    with pytest.raises(ValueError, match='divisible'):
        tiny(n_embd=15)
    with pytest.raises(ValueError, match='causal_free_prefix'):
        tiny(causal_free_prefix=13)
    with pytest.raises(ValueError, match='block_size'):
        GPT(tiny())(torch.zeros(1, 13, dtype=torch.long))


def test_from_checkpoint_round_trip_and_clear_errors(tmp_path):
    cfg = tiny(attn='softmax1', pos_emb='rotary')
    m = GPT(cfg).eval()
    path = tmp_path / 'ckpt.pt'
    torch.save({'model': m.state_dict(), 'model_args': vars(cfg).copy(), 'iter_num': 7}, path)
    loaded, ckpt = GPT.from_checkpoint(path)
    idx = torch.randint(0, 50, (1, 12))
    assert torch.equal(loaded(idx)[0], m(idx)[0]) and ckpt['iter_num'] == 7 and 'model' not in ckpt
    with pytest.raises(ValueError, match='not found'):
        GPT.from_checkpoint(tmp_path / 'missing.pt')
    (tmp_path / 'junk.pt').write_bytes(b'not a checkpoint')
    with pytest.raises(ValueError, match='not a readable'):
        GPT.from_checkpoint(tmp_path / 'junk.pt')
