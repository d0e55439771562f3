"""GPT.forward_cached (decoding with a KV cache) against the model's own full forward pass: token by token and in
chunks, every attention variant, every position encoding, grouped-query attention, the sink token, the free prefix."""
import pytest
import torch

from model import GPT, KVCache
from test_model import MODEL_VARIANTS, tiny

pytestmark = pytest.mark.usefixtures('one_thread')


def sharp(m, seed=0, std=0.3):
    """Weights large enough that attention is far from uniform and the position encodings matter (at the init's
    0.02 every score is ~0 and a wrong position or mask would hardly change the logits)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)
    return m.eval()


def cached_logits(m, idx, cuts):
    """Logits of idx fed to forward_cached in the chunks idx[:, a:b] given by consecutive cut points."""
    cache, out = None, []
    for a, b in zip(cuts[:-1], cuts[1:]):
        logits, cache = m.forward_cached(idx[:, a:b], cache)
        out.append(logits)
    return torch.cat(out, dim=1), cache


@pytest.mark.parametrize('pos_emb', ['absolute', 'rotary', 'none'])
@pytest.mark.parametrize('variant', list(MODEL_VARIANTS))
def test_cache_token_by_token_and_in_chunks_equals_the_full_forward(variant, pos_emb):
    T = 12
    for n_kv_head in (0, 2):   # 4 heads with their own keys and values, or 2 groups of 2 (grouped-query attention)
        m = sharp(GPT(tiny(pos_emb=pos_emb, n_head=4, n_embd=32, n_kv_head=n_kv_head, block_size=T,
                           **MODEL_VARIANTS[variant])))
        idx = torch.randint(0, 50, (2, T), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            full = m(idx)[0]
            assert full.abs().max() > 1    # logits far from zero: the tolerance below is a real test
            for cuts in (list(range(T + 1)), [0, 5, 6, T], [0, T]):
                logits, cache = cached_logits(m, idx, cuts)
                assert (logits - full).abs().max() <= 1e-5, (n_kv_head, cuts)
                assert len(cache) == T + m.config.sink_token
                k, v = cache.layers[0]
                assert k.shape == v.shape == (2, n_kv_head or 4, T + m.config.sink_token, 8)


@pytest.mark.parametrize('pos_emb', ['absolute', 'rotary'])
def test_free_prefix_needs_its_tokens_in_the_first_call(pos_emb):
    m = sharp(GPT(tiny(pos_emb=pos_emb, causal_free_prefix=4)))
    idx = torch.randint(0, 50, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits, _ = cached_logits(m, idx, [0, 4] + list(range(5, 13)))
        assert (logits - m(idx)[0]).abs().max() <= 1e-5
        with pytest.raises(ValueError, match='causal_free_prefix'):
            m.forward_cached(idx[:, :3])


def test_cache_beyond_the_positions_is_refused():
    for kw in (dict(pos_emb='absolute'), dict(pos_emb='rotary', sink_token=True)):
        m = sharp(GPT(tiny(block_size=6, **kw)))
        idx = torch.randint(0, 50, (1, 7))
        with torch.no_grad():
            _, cache = m.forward_cached(idx[:, :6])
            with pytest.raises(ValueError, match='exceeds block_size 6'):
                m.forward_cached(idx[:, 6:], cache)


def test_keep_selects_cached_tokens_in_every_layer():
    m = sharp(GPT(tiny(pos_emb='rotary')))
    with torch.no_grad():
        _, cache = m.forward_cached(torch.randint(0, 50, (1, 8)))
    before = [[t.clone() for t in kv] for kv in cache.layers]
    cache.keep([0, 1, 5, 6, 7])
    assert len(cache) == 5
    for (k, v), (k0, v0) in zip(cache.layers, before):
        assert torch.equal(k, k0[:, :, [0, 1, 5, 6, 7]]) and torch.equal(v, v0[:, :, [0, 1, 5, 6, 7]])
    assert len(KVCache(2)) == 0
