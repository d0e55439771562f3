"""model.py against slow eager references: the attention variants in the model, analysis path, init, toggles.

Every value of model.CHOICES is checked here: each attention variant (test_attention.py's float64 formulas) compiled
and eager, through the analysis path; each norm, MLP and position encoding against a float64 formula written below
(NORMS, MLPS, POSITIONS). A value added to model.CHOICES without its formula here fails, saying so."""
import math

import pytest
import torch
import torch.nn.functional as F

import model as model_module
from harness import measure
from model import CHOICES, GPT, GPTConfig, apply_rotary, attention
from test_attention import reference_attention

MODEL_VARIANTS = {   # GPTConfig fields of each attention variant the model offers
    **{a: dict(attn=a) for a in CHOICES['attn']}, 'attn_bias': dict(attn_bias=True), 'sink_token': dict(sink_token=True),
}


def tiny(**kw):
    base = dict(n_layer=2, n_head=2, n_embd=16, block_size=12, vocab_size=50, dropout=0.0)
    base.update(kw)
    return GPTConfig(**base)


def randomise(m, seed=5):
    """Give the parameters that start at a constant (attn_bias's key and value) random values, so that the
    tests see them at work, and the query and key projections 10 times their initial size: logits of order 1, as
    in training, instead of initialisation's 1e-3, where a ratio of near-zero terms (softpick's) turns fp32's
    rounding of q.k into relative errors of the weights that no fp32 implementation avoids."""
    g = torch.Generator().manual_seed(seed)
    for name, p in m.named_parameters():
        if 'bias_k' in name or 'bias_v' in name:
            p.data.copy_(torch.randn(p.shape, generator=g))
        if name.endswith('attn.c_attn.weight'):
            p.data[:2 * m.config.n_embd] *= 10   # q and k (v follows them, and stays)
    return m


def compiled_cases():
    """One case per attention variant, the positions, free prefixes, norms and MLPs taken in turn so that every value of
    model.CHOICES is compiled at least once; softmax-1 (the custom op) also with the other two position encodings."""
    turns = [('absolute', 0), ('rotary', 4), ('none', 1)]
    cases = []
    for i, variant in enumerate(MODEL_VARIANTS):
        pos_emb, prefix = turns[i % 3]
        cases.append((variant, pos_emb, 0 if variant == 'sink_token' else prefix,   # GPTConfig refuses that pair
                      CHOICES['norm'][i % len(CHOICES['norm'])], CHOICES['mlp'][i % len(CHOICES['mlp'])]))
    cases += [('softmax1', pos_emb, prefix, 'layernorm', 'gelu') for pos_emb, prefix in turns
              if not any(c[:3] == ('softmax1', pos_emb, prefix) for c in cases)]
    return cases


@pytest.fixture
def fresh_dynamo():
    """Each compiled case starts from a clean torch.compile cache, so no case counts against another's recompile
    limit (eight cases sharing one cache made the ninth fail) and the order does not matter."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.slow   # torch.compile, a fresh cache per case
@pytest.mark.parametrize('variant,pos_emb,prefix,norm,mlp', compiled_cases())
def test_compiled_model_matches_eager_reference(variant, pos_emb, prefix, norm, mlp, monkeypatch, fresh_dynamo):
    """torch.compile (fullgraph: the custom op stays whole) of every variant: logits and every parameter
    gradient equal those of the model with the float64 reference attention, within 1e-5."""
    cfg = tiny(pos_emb=pos_emb, causal_free_prefix=prefix, norm=norm, mlp=mlp, **MODEL_VARIANTS[variant])
    torch.manual_seed(3)
    m = randomise(GPT(cfg))
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
@pytest.mark.parametrize('variant', list(MODEL_VARIANTS))
def test_model_with_fused_attention_matches_model_with_reference(pos_emb, variant, monkeypatch):
    """Whole model (rotary applied before attention, the gate after it, the sink token in front): logits and
    every parameter gradient agree with the model running the float64 reference attention."""
    cfg = tiny(pos_emb=pos_emb, **MODEL_VARIANTS[variant])
    torch.manual_seed(1)
    m = randomise(GPT(cfg))
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


@pytest.mark.parametrize('variant,prefix', [(v, p) for v in MODEL_VARIANTS for p in (0, 3)
                                            if not (v == 'sink_token' and p)])   # GPTConfig refuses that pair
def test_analysis_path_returns_what_training_path_computes(variant, prefix):
    cfg = tiny(pos_emb='rotary', causal_free_prefix=prefix, **MODEL_VARIANTS[variant])
    torch.manual_seed(2)
    m = randomise(GPT(cfg)).eval()
    idx = torch.randint(0, 50, (2, 12))
    logits, _ = m(idx)
    a_logits, _, trace = m(idx, analysis=True)
    assert (logits - a_logits).abs().max() <= 1e-5
    assert len(trace['hidden']) == len(trace['attn']) == cfg.n_layer
    assert trace['attn'][0].shape == (2, cfg.n_head, 12, 12) and trace['hidden'][0].shape == (2, 12, 16)
    # the final hidden state, normalised and projected, gives the logits
    last = m.lm_head(m.transformer.ln_f(trace['hidden'][-1]))[..., :cfg.vocab_size]
    assert (last - logits).abs().max() <= 1e-5
    stats = measure.Stats(cfg.n_layer, cfg.n_head)   # analyze.py's metrics of it: finite, shares within [0, 1]
    with torch.no_grad():
        stats.update(trace['hidden'], trace['attn'], torch.ones(2, 12, dtype=torch.bool), trace.get('sink'), trace['value'])
    result = stats.result()
    for key in measure.ATTN_METRICS + ('sink_rate',):   # shares and masses in [0, 1]; a row's sum need not be
        assert 0 <= result[key] <= (math.inf if key == 'attn_row_sum' else 1), (key, result[key])
    assert all(math.isfinite(result[k]) for k in measure.HIDDEN_METRICS + measure.VALUE_METRICS)
    rows = trace['attn'][1].sum(-1)
    if variant in ('softmax', 'gated'):
        assert torch.allclose(rows, torch.ones_like(rows), atol=1e-6) and result['attn_row_sum'] == pytest.approx(1)
    elif variant in ('softmax1', 'attn_bias'):
        assert (rows < 1).all() and (rows > 0).all()
    elif variant == 'sink_token':   # real keys plus the sink make a softmax row
        total = rows + trace['sink']['attn'][1]
        assert torch.allclose(total, torch.ones_like(total), atol=1e-6) and (trace['sink']['attn'][1] > 0).all()
    if prefix == 0:   # causal: nothing above the diagonal
        assert trace['attn'][0].triu(1).abs().max() == 0


def test_gated_attention_multiplies_each_head_by_its_sigmoid_gate():
    """attn='gated' == softmax attention per head times sigmoid(x W_g + b_g), one gate per head and token
    from the block's normalised input, before the output projection; gates start at 0.25."""
    cfg = tiny(attn='gated')
    torch.manual_seed(4)
    m = GPT(cfg)
    att = m.transformer.h[0].attn
    assert torch.sigmoid(att.c_gate.bias).tolist() == pytest.approx([0.25, 0.25])
    x = torch.randn(2, 12, 16)
    B, T, C, H = 2, 12, 16, 2
    q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in att.c_attn(x).split(C, dim=2))
    heads = reference_attention(q, k, v, tiny()).double()                     # plain softmax, (B, H, T, d)
    gate = torch.sigmoid(x.double() @ att.c_gate.weight.double().T + att.c_gate.bias.double())   # (B, T, H)
    y = (heads * gate.transpose(1, 2)[..., None]).transpose(1, 2).reshape(B, T, C)
    want = y @ att.c_proj.weight.double().T + att.c_proj.bias.double()
    assert (att(x, None, None).double() - want).abs().max() <= 1e-5


def test_sink_token_is_seen_by_every_token_and_ignored_by_the_loss():
    cfg = tiny(sink_token=True, pos_emb='absolute')
    torch.manual_seed(6)
    m = GPT(cfg)
    assert m.transformer.wpe.weight.shape[0] == cfg.block_size + 1 and m.sink.shape == (1, 1, 16)
    idx, tgt = torch.randint(0, 50, (2, 12)), torch.randint(0, 50, (2, 12))
    logits, loss = m(idx, tgt)
    assert logits.shape == (2, 12, 50)
    assert loss.item() == pytest.approx(F.cross_entropy(logits.reshape(-1, 50), tgt.reshape(-1)).item())
    # the sink comes first: its hidden state cannot depend on the tokens, and every token sees it
    _, _, t1 = m(idx, analysis=True)
    _, _, t2 = m(torch.randint(0, 50, (2, 12)), analysis=True)
    assert torch.equal(t1['sink']['hidden'][1], t2['sink']['hidden'][1])
    g, = torch.autograd.grad(m(idx, tgt)[1], m.sink)
    assert g.abs().sum() > 0
    # without it the model is a different function of the same weights: the sink is really in the input
    with torch.no_grad():
        m.sink.zero_()
    assert not torch.allclose(m(idx)[0], logits)


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


@pytest.mark.parametrize('tie', [True, False])
def test_torch_initialisation_statistics(tie):
    """init='torch', PyTorch's layer defaults: every Linear weight and bias in [-b, b], b = 1 / sqrt(fan_in), with
    U(-b, b)'s standard deviation b / sqrt(3) and its largest |value| near b; the token and position embeddings (the
    tied head too) and the sink token N(0, 1); norms weight 1, bias 0. Tolerances: 5 standard errors of the statistic
    over the n values (a sample std: sigma / sqrt(2 n) for a normal, sigma / sqrt(5 n) for a uniform, whose fourth
    moment is b^4 / 5; a mean: sigma / sqrt(n)); max |x| < b (1 - 20 / n) has probability (1 - 20 / n)^n < e^-20."""
    cfg = GPTConfig(n_layer=2, n_head=4, n_embd=64, block_size=64, vocab_size=1000, bias=True, sink_token=True,
                    tie_embeddings=tie, init='torch')
    torch.manual_seed(0)
    m = GPT(cfg)
    block = m.transformer.h[1]
    uniform = [(block.attn.c_attn, 64), (block.attn.c_proj, 64), (block.mlp.c_fc, 64), (block.mlp.c_proj, 256)]
    if not tie:
        uniform.append((m.lm_head, 64))
    for layer, fan_in in uniform:
        b = 1 / math.sqrt(fan_in)
        for p in [layer.weight] + ([layer.bias] if layer.bias is not None else []):
            x, n = p.detach().double(), p.numel()
            assert x.abs().max() <= b and x.abs().max() > b * (1 - 20 / n)
            assert abs(x.std().item() - b / math.sqrt(3)) <= 5 * (b / math.sqrt(3)) / math.sqrt(5 * n)
            assert abs(x.mean().item()) <= 5 * (b / math.sqrt(3)) / math.sqrt(n)
    normal = [m.transformer.wte.weight, m.transformer.wpe.weight, m.sink] + ([m.lm_head.weight] if tie else [])
    for p in normal:
        x, n = p.detach().double(), p.numel()
        assert abs(x.std().item() - 1) <= 5 / math.sqrt(2 * n) and abs(x.mean().item()) <= 5 / math.sqrt(n)
    assert (m.lm_head.weight is m.transformer.wte.weight) == tie
    for norm in (block.ln_1, block.ln_2, m.transformer.ln_f):
        assert torch.equal(norm.weight, torch.ones(64)) and torch.equal(norm.bias, torch.zeros(64))


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


def rms(x, eps):
    return x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()


# norm -> (scales: one per channel or one in all, its output in float64 from x, the scale w, the bias b or 0, eps)
NORMS = {
    'layernorm': ('channel', lambda x, w, b, eps: (x - x.mean(-1, keepdim=True)) / (
        x.var(-1, unbiased=False, keepdim=True) + eps).sqrt() * w + b),
    'rmsnorm': ('channel', lambda x, w, b, eps: rms(x, eps) * w),          # RMSNorm-M
    'rmsnorm_single': ('one', lambda x, w, b, eps: rms(x, eps) * w),       # RMSNorm-S: one scalar scale
}


def gelu_tanh(h):   # GPT-2's approximation
    return 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))


# mlp -> its output in float64 from x and lin(name, x), the block's Linear layer `name` in float64
MLPS = {
    'gelu': lambda x, lin: lin('c_proj', 0.5 * lin('c_fc', x) * (1 + torch.erf(lin('c_fc', x) / math.sqrt(2)))),
    'gelu_tanh': lambda x, lin: lin('c_proj', gelu_tanh(lin('c_fc', x))),
    'swiglu': lambda x, lin: lin('c_proj', lin('c_gate', x) * torch.sigmoid(lin('c_gate', x)) * lin('c_fc', x)),
    'relu': lambda x, lin: lin('c_proj', lin('c_fc', x).clamp_min(0)),     # max(0, x W_fc + b) W_proj + b, no gate
}


def rotate_pairs(x, base):
    """Rotary: channel pair (j, j + d/2) of the token at position t turned by the angle t base^(-2j / d)."""
    T, d = x.size(-2), x.size(-1)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    a, b = x[..., :d // 2], x[..., d // 2:]
    return torch.cat((a * angle.cos() - b * angle.sin(), a * angle.sin() + b * angle.cos()), -1)


# pos_emb -> (the block input from the token embeddings e and the position table wpe, q/k before the scores)
POSITIONS = {
    'absolute': (lambda e, wpe: e + wpe[:e.size(1)], lambda t, base: t),
    'rotary': (lambda e, wpe: e, rotate_pairs),
    'none': (lambda e, wpe: e, lambda t, base: t),
}


def missing_reference(table, field, value):
    if value not in table:
        pytest.fail(f"{field}={value!r} (model.CHOICES) has no float64 reference: write its formula into {table} in "
                    f"tests/test_model.py")


def test_every_choice_has_a_reference():
    for table, field in ((NORMS, 'norm'), (MLPS, 'mlp'), (POSITIONS, 'pos_emb')):
        missing = [v for v in CHOICES[field] if v not in table]
        assert not missing, f"model.CHOICES['{field}'] has {missing} without a float64 reference in tests/test_model.py"


@pytest.mark.parametrize('bias', [True, False])
@pytest.mark.parametrize('norm', CHOICES['norm'])
def test_norm_variants_against_formulas(norm, bias):
    missing_reference(NORMS, 'norm', norm)
    scales, formula = NORMS[norm]
    module = model_module.make_norm(tiny(norm=norm, bias=bias))
    torch.manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape))
    assert module.weight.numel() == (16 if scales == 'channel' else 1)
    b = getattr(module, 'bias', None)
    x = torch.randn(3, 16) * 5 + 2
    want = formula(x.double(), module.weight.double(), 0 if b is None else b.double(), 1e-5)
    assert (module(x).double() - want).abs().max() <= 1e-5
    assert not any('bias' in n for n, _ in GPT(tiny(norm=norm, bias=False)).named_parameters())


def test_norm_bias_gives_layernorm_a_bias_without_the_linear_layers_ones():
    """Guo et al.'s (2024) models: LayerNorm with a bias, Linear layers without (bias=False, norm_bias=True); None
    follows bias. Checked by the parameters each model has, and the normalisation against the formula with a bias."""
    names = lambda **kw: {n for n, _ in GPT(tiny(**kw)).named_parameters() if n.endswith('bias')}
    guo = names(bias=False, norm_bias=True)
    assert guo and all('ln_' in n for n in guo) and len(guo) == 2 * 2 + 1   # 2 per block and the final norm
    assert names(bias=True, norm_bias=False) and not any('ln_' in n for n in names(bias=True, norm_bias=False))
    assert names(bias=True) == names(bias=True, norm_bias=True) and not names(bias=False)
    module = model_module.make_norm(tiny(bias=False, norm_bias=True))
    with torch.no_grad():
        module.bias.copy_(torch.arange(16.0))
    x = torch.randn(3, 16).double()
    want = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5) + torch.arange(16.0).double()
    assert (module(x.float()).double() - want).abs().max() <= 1e-5
    with pytest.raises(ValueError, match='norm_bias'):
        tiny(norm_bias='yes')


@pytest.mark.parametrize('mlp', CHOICES['mlp'])
def test_mlp_variants_against_formulas(mlp):
    missing_reference(MLPS, 'mlp', mlp)
    torch.manual_seed(0)
    block = model_module.MLP(tiny(mlp=mlp))
    x = torch.randn(2, 5, 16)

    def lin(name, t):
        layer = getattr(block, name)
        return t @ layer.weight.double().T + layer.bias.double()
    assert (block(x).double() - MLPS[mlp](x.double(), lin)).abs().max() <= 1e-5


@pytest.mark.parametrize('pos_emb', CHOICES['pos_emb'])
def test_position_encodings_against_formulas(pos_emb):
    """The first layer's attention of a softmax model, recomputed in float64 from the embeddings with POSITIONS'
    formulas, equals the analysis path's."""
    missing_reference(POSITIONS, 'pos_emb', pos_emb)
    embed, turn = POSITIONS[pos_emb]
    cfg = tiny(pos_emb=pos_emb, rope_base=100.0)
    torch.manual_seed(0)
    m = GPT(cfg).eval()
    idx = torch.randint(0, 50, (2, 12))
    attn = m(idx, analysis=True)[2]['attn'][0]
    wpe = m.transformer.wpe.weight.double() if 'wpe' in m.transformer else None
    x = embed(m.transformer.wte.weight.double()[idx], wpe)
    block = m.transformer.h[0]
    h = NORMS['layernorm'][1](x, block.ln_1.weight.double(), block.ln_1.bias.double(), 1e-5)
    q, k, _ = (h @ block.attn.c_attn.weight.double().T + block.attn.c_attn.bias.double()).split(16, -1)
    q, k = (turn(t.view(2, 12, 2, 8).transpose(1, 2), 100.0) for t in (q, k))
    s = (q @ k.transpose(-2, -1) / math.sqrt(8)).masked_fill(~torch.ones(12, 12, dtype=torch.bool).tril(), -math.inf)
    assert (attn.double() - torch.softmax(s, -1)).abs().max() <= 1e-5


@pytest.mark.parametrize('field,value', [('attn', 'softmax2'), ('norm', 'batchnorm'), ('pos_emb', 'alibi'), ('mlp', 'geglu')])
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


@pytest.mark.parametrize('fields,match', [
    (dict(attn='clipped', clip_gamma=0.1), 'clip_gamma must be <= 0'), (dict(clip_zeta=0.9), 'clip_zeta >= 1'),
    (dict(clip_gamma='low'), 'clip_gamma must be a number'), (dict(clip_zeta=float('inf')), 'clip_zeta must be a finite'), (dict(sigmoid_bias=float('nan')), 'sigmoid_bias'),
    (dict(sigmoid_bias='log'), 'sigmoid_bias'), (dict(attn='softmax1', attn_bias=True), "attn='softmax'"),
    (dict(attn_bias='yes'), 'attn_bias must be True or False'), (dict(sink_token=1), 'sink_token must be True'),
    (dict(sink_token=True, causal_free_prefix=2), 'cannot be combined')])
def test_mitigation_fields_are_validated(fields, match):
    with pytest.raises(ValueError, match=match):
        tiny(**fields)


@pytest.mark.slow   # train.py as a subprocess
def test_mitigation_config_errors_are_one_line_from_train(tmp_path):
    import subprocess
    import sys
    from conftest import ROOT
    for args, message in ((['--clip_gamma=0.5'], "'clip_gamma'"), (['--attn=softmax1', '--attn_bias=True'], 'attn_bias'),
                          (['--sigmoid_bias=abc'], 'sigmoid_bias'), (['--muon_lr=0'], "'muon_lr'")):
        r = subprocess.run([sys.executable, 'train.py', 'config/tiny_cpu.py', f'--out_dir={tmp_path / "x"}', *args],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and r.stderr.count('\n') == 1 and message in r.stderr, r.stderr


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
