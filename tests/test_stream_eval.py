"""stream_eval.py: the windowed KV cache against explicit forward passes. Without eviction it gives the ordinary
per-token loss of a full forward pass; with eviction (one layer, where the cached keys and values depend only on
each token and its position) it gives the full forward pass over exactly the kept tokens at the positions the
cache assigns; the first k tokens stay; the command line writes its documented JSON and figure."""
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import stream_eval
from conftest import ROOT
from model import GPT
from test_kv_cache import sharp
from test_model import MODEL_VARIANTS, tiny
from test_sample import trained  # noqa: F401  (the module fixture: a train.py checkpoint on bytes)

pytestmark = pytest.mark.usefixtures('one_thread')


def stream(n, seed=0):
    return torch.randint(0, 50, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize('pos_emb', ['absolute', 'rotary', 'none'])
@pytest.mark.parametrize('variant', list(MODEL_VARIANTS))
def test_without_eviction_the_stream_gives_the_full_forward_loss(variant, pos_emb):
    m = sharp(GPT(tiny(pos_emb=pos_emb, n_head=4, n_embd=32, n_kv_head=2, block_size=16, **MODEL_VARIANTS[variant])))
    tokens = stream(16)
    with torch.no_grad():
        expected = F.cross_entropy(m(tokens[None])[0][0, :-1], tokens[1:], reduction='none').double().numpy()
    for window, sinks in ((16, 0), (15, 0), (12, 4)):    # the cache never fills: nothing is evicted
        nll, cache, kept = stream_eval.stream_nll(m, tokens, window, sinks)
        assert abs(nll - expected).max() <= 1e-5 and kept == list(range(15))
    reference, method, _ = stream_eval.reference_nll(m, tokens)
    assert method == 'full' and abs(reference - expected).max() <= 1e-5


def kept_positions(s, window, sinks):
    """Stream positions a token at position s sees: all before it until the cache is full, then the first `sinks`
    and the `window` most recent (itself included)."""
    return list(range(s + 1)) if s < sinks + window else list(range(sinks)) + list(range(s - window + 1, s + 1))


def explicit_logits(m, ids, positions):
    """A full forward pass of a one-layer model over the tokens ids at the given absolute positions (the sink token,
    if any, at position 0), written out from the model's parts: its last position's logits."""
    x = m.transformer.wte(ids[None]) + m.transformer.wpe(positions)
    if m.config.sink_token:
        x = torch.cat((m.sink + m.transformer.wpe.weight[0], x), dim=1)
    x = m.transformer.h[0](x, None)
    return m.lm_head(m.transformer.ln_f(x[:, -1]))[0, :m.config.vocab_size]


@pytest.mark.parametrize('pos_emb', ['rotary', 'none', 'absolute'])
@pytest.mark.parametrize('variant', ['softmax', 'softmax1', 'sink_token', 'attn_bias'])
def test_after_eviction_the_loss_is_that_of_a_forward_pass_over_the_kept_tokens(variant, pos_emb):
    """One layer: a cached key or value depends only on its token and the position it entered at. Rotary and none:
    the kept tokens at positions 0, 1, ... (an ordinary forward pass over them). Absolute: each kept token at the
    position it entered the cache at, min(stream position, k + W - 1) (after the sink token, if any)."""
    m = sharp(GPT(tiny(n_layer=1, pos_emb=pos_emb, block_size=8, **MODEL_VARIANTS[variant])), seed=7)
    tokens, window = stream(14, seed=3), 3
    for sinks in (0, 1, 2):
        nll, _, kept = stream_eval.stream_nll(m, tokens, window, sinks)
        assert kept == kept_positions(12, window, sinks)
        first = m.config.sink_token
        for s in range(len(tokens) - 1):
            seen = kept_positions(s, window, sinks)
            with torch.no_grad():
                if pos_emb == 'absolute':
                    positions = torch.tensor([first + min(j, sinks + window - 1) for j in seen])
                    logits = explicit_logits(m, tokens[seen], positions)
                else:
                    logits = m(tokens[None, seen])[0][0, -1]
            expected = F.cross_entropy(logits, tokens[s + 1]).item()
            assert nll[s] == pytest.approx(expected, abs=1e-5), (sinks, s)


@pytest.mark.parametrize('variant', ['softmax', 'sink_token'])
def test_the_first_k_tokens_stay_in_the_cache(variant):
    """After 30 tokens through a cache of 4 + 5, its first entries are, in every layer, the keys and values of the
    stream's first 4 tokens (they only ever saw each other), and the rest those of the 5 most recent."""
    m = sharp(GPT(tiny(pos_emb='rotary', block_size=12, **MODEL_VARIANTS[variant])))
    tokens, first = stream(31), m.config.sink_token
    _, cache, kept = stream_eval.stream_nll(m, tokens, window=5, sinks=4)
    assert kept == [0, 1, 2, 3, 25, 26, 27, 28, 29] and len(cache) == first + 9
    with torch.no_grad():
        _, fresh = m.forward_cached(tokens[None, :4])
    for (k, v), (k0, v0) in zip(cache.layers, fresh.layers):
        assert torch.allclose(k[:, :, :first + 4], k0, atol=1e-6) and torch.allclose(v[:, :, :first + 4], v0, atol=1e-6)


def test_strided_reference_scores_each_token_once_with_half_a_block_of_context():
    m = sharp(GPT(tiny(pos_emb='rotary', block_size=8)))
    tokens = stream(21)
    nll, method, stride = stream_eval.reference_nll(m, tokens)
    assert (method, stride) == ('strided', 4)
    with torch.no_grad():
        for t in range(1, 21):
            end = 8 if t < 8 else min(21, 8 + 4 * -(-(t + 1 - 8) // 4))   # the first window ending after t
            start = end - 8
            logits = m(tokens[None, start:end])[0][0, t - 1 - start]
            assert t - start >= (1 if t < 8 else 4)           # tokens seen by the prediction of token t
            assert nll[t - 1] == pytest.approx(F.cross_entropy(logits, tokens[t]).item(), abs=1e-5), t


def run(*args):
    return subprocess.run([sys.executable, 'stream_eval.py', *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=240)


@pytest.mark.slow   # stream_eval.py as a subprocess
def test_command_line_json_table_and_figure(trained, tmp_path):  # noqa: F811
    out = tmp_path / 'out'
    r = run('--ckpt', trained, '--tokens', '120', '--windows', '6', '10', '--sinks', '0', '1', '4', '--json', str(out),
            '--plot', str(tmp_path / 'fig' / 'stream.png'), '--smooth', '8', '--device', 'cpu')
    assert r.returncode == 0, r.stderr
    assert 'PPL sliding' in r.stdout and 'reference (strided, context 16)' in r.stdout
    result = json.load(open(out / 'out.json'))
    assert result['data']['tokens'] == 120 and result['data']['tokenizer'] == 'bytes' and result['block_size'] == 16
    assert [(x['window'], x['sinks'], x['cache']) for x in result['runs']] == \
        [(6, 0, 6), (6, 1, 7), (6, 4, 10), (10, 0, 10), (10, 1, 11), (10, 4, 14)]
    for x in result['runs'] + [result['reference']]:
        assert len(x['nll']) == 119 and x['ppl'] > 1
    assert result['runs'][0]['sliding_from'] == 11
    os.remove(tmp_path / 'fig' / 'stream.png')
    figure = tmp_path / 'fig' / 'stream.png'
    again = run('--replot', str(out / 'out.json'), str(out / 'out.json'), '--plot', str(figure))   # two models
    assert again.returncode == 0 and os.path.getsize(figure) > 10_000


@pytest.mark.slow   # stream_eval.py as a subprocess
@pytest.mark.parametrize('args,message', [
    (['--windows', '16', '--sinks', '1'], 'a cache of 17 tokens exceeds block_size 16'),
    (['--tokens', '100000', '--windows', '8'], 'has only'),
    (['--windows', '0'], '--windows must be >= 1'),
])
def test_command_line_errors_are_one_line(trained, args, message):  # noqa: F811
    r = run('--ckpt', trained, *args)
    assert r.returncode != 0 and message in r.stderr
    assert r.stderr.startswith('stream_eval.py: error:') and r.stderr.count('\n') == 1


@pytest.mark.slow   # stream_eval.py as a subprocess
def test_replot_needs_a_figure_path(tmp_path):
    r = run('--replot', str(tmp_path / 'x.json'))
    assert r.returncode != 0 and r.stderr.startswith('stream_eval.py: error: --replot draws a figure')
