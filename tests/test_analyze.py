"""analyze.py: every metric against an independent computation, the model loaders, the CLI."""
import json
import math
import os
import re
import shlex
import shutil
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import analyze
from harness import measure, plots, runs, tables
from harness.measure import Stats, forward, kurtosis, norm_ratio, pearson
from harness.runs import LoadedModel
from model import GPT, GPTConfig
from orthoadam import OrthoAdam

VOCAB = 40


# ----------------------------------------------------------------------------- fixtures
pytestmark = pytest.mark.usefixtures('one_thread')


def write_docs(path, docs, vocab_size=VOCAB):
    """A prepared-data folder whose val (and train) split holds `docs`, each followed by the eot token."""
    os.makedirs(path, exist_ok=True)
    eot = vocab_size - 1
    toks = np.concatenate([np.append(np.asarray(d, dtype=np.int64), eot) for d in docs]).astype(np.uint16)
    splits = {}
    for split in ('train', 'val'):
        toks.tofile(os.path.join(path, f'{split}.bin'))
        splits[split] = {'documents': len(docs), 'tokens': len(toks), 'sha256': ''}
    meta = {'format': 1, 'tokenizer': 'test', 'vocab_size': vocab_size, 'eot_token': eot, 'dtype': 'uint16',
            'source': 'test documents', 'stand_in_for_c4': True, 'description': '', 'splits': splits, 'args': {}}
    with open(os.path.join(path, 'meta.json'), 'w') as f:
        json.dump(meta, f)
    return path


def random_docs(n=7, seed=0, max_len=40, vocab_size=VOCAB):
    rng = np.random.default_rng(seed)
    lengths = [1, 0] + list(rng.integers(2, max_len, size=n - 2))     # a one-token and an empty document
    return [rng.integers(0, vocab_size - 1, size=n) for n in lengths]


@pytest.fixture(scope='module')
def docs_dir(tmp_path_factory):
    return write_docs(str(tmp_path_factory.mktemp('docs')), random_docs())


def tiny_config(**kw):
    return GPTConfig(**dict(n_layer=3, n_head=2, n_embd=16, block_size=32, vocab_size=VOCAB, bias=False) | kw)


def write_checkpoint(out_dir, optimizer='adamw', seed=0, **model_kw):
    """A train.py-style checkpoint (weights, optimizer state with param_names, config) plus a log.jsonl."""
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(seed)
    cfg = tiny_config(**model_kw)
    model = GPT(cfg)
    named = list(model.named_parameters())
    groups = [{'params': [p for _, p in named], 'param_names': [n for n, _ in named]}]
    opt = torch.optim.AdamW(groups, lr=1e-2) if optimizer == 'adamw' else OrthoAdam(groups, lr=1e-2)
    for _ in range(2):
        idx = torch.randint(0, VOCAB - 1, (4, 16))
        model(idx, idx)[1].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    ckpt = {'model': model.state_dict(), 'optimizer': opt.state_dict(), 'model_args': cfg.__dict__.copy(),
            'iter_num': 2, 'config': {'optimizer': optimizer, 'dataset': 'test'}}
    torch.save(ckpt, os.path.join(out_dir, 'ckpt.pt'))
    with open(os.path.join(out_dir, 'log.jsonl'), 'w') as f:
        for e in ({'event': 'eval', 'iter': 0, 'val_loss': 3.7}, {'event': 'train', 'iter': 1, 'loss': 9.0},
                  {'event': 'train', 'iter': 1, 'loss': 3.5}, {'event': 'eval', 'iter': 2, 'val_loss': 3.4}):
            f.write(json.dumps(e) + '\n')
    return os.path.join(out_dir, 'ckpt.pt')


def np_kurtosis(x):
    x = np.asarray(x, dtype=np.float64)
    return np.mean((x - x.mean()) ** 4) / np.var(x) ** 2


# ----------------------------------------------------------------------------- hidden-state metrics
@pytest.mark.parametrize('D', [4, 64, 1024])
def test_kurtosis_of_a_pure_outlier_is_the_zero_noise_limit(D):
    # x = alpha e_i, alpha -> infinity (no noise): E[(x-mu)^4] / E[(x-mu)^2]^2 = D - 2 + 1/(D - 1) exactly
    x = torch.zeros(2, D, dtype=torch.float64)
    x[0, 1], x[1, D - 1] = 1e3, -7.0
    assert torch.allclose(kurtosis(x), torch.full((2,), D - 2 + 1 / (D - 1), dtype=torch.float64), rtol=1e-10)
    assert torch.allclose(norm_ratio(x), torch.ones(2, dtype=torch.float64))


def test_kurtosis_of_a_planted_outlier_matches_appendix_g():
    g = torch.Generator().manual_seed(0)
    D = 1024
    x = torch.randn(256, D, generator=g, dtype=torch.float64)
    x[:, 5] += D                                              # alpha = D: the paper's G.4
    assert kurtosis(x).mean().item() == pytest.approx(D - 4 + 12 / D - 6 / D ** 2, rel=1e-3)
    assert norm_ratio(x).mean().item() == pytest.approx(D / math.sqrt(D * D + D), abs=1e-3)   # ~ 1 (H.2)
    assert kurtosis(x)[3].item() == pytest.approx(np_kurtosis(x[3].numpy()), rel=1e-12)
    # finite alpha: the ratio of the expected 4th and squared 2nd central moments (Appendix G before G.4)
    D, a = 256, 30.0
    x = torch.randn(4000, D, generator=g, dtype=torch.float64)
    x[:, 7] += a
    u = a * (1 - 1 / D)
    m4 = (u ** 4 + 6 * u ** 2 + 3) / D + (D - 1) / D * (3 + 6 * (a / D) ** 2 + (a / D) ** 4)
    m2 = a * a / D * (1 - 1 / D) + 1
    assert kurtosis(x).mean().item() == pytest.approx(m4 / m2 ** 2, rel=0.02)


def test_rotating_a_planted_outlier_gives_gaussian_kurtosis():
    g = torch.Generator().manual_seed(1)
    D = 1024
    z = torch.randn(256, D, generator=g, dtype=torch.float64)
    x = z.clone()
    x[:, 0] += D
    q, _ = torch.linalg.qr(torch.randn(D, D, generator=g, dtype=torch.float64))     # Haar rotation
    y = x @ q.T
    assert abs(kurtosis(y).mean().item() - 3) < 0.3
    assert norm_ratio(y).mean().item() < 0.15
    h = torch.ones(1, 1, dtype=torch.float64)                                         # Q e_0 = 1/sqrt(D) (App. H)
    while len(h) < D:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)])
    y = x @ (h / math.sqrt(D)).T
    assert kurtosis(y).mean().item() == pytest.approx(3, abs=0.05)
    expected = (D + math.sqrt(2 * D * math.log(D))) / math.sqrt(D * (D * D + D))
    assert norm_ratio(y).mean().item() == pytest.approx(expected, rel=0.05)


def test_hidden_metrics_split_first_token_and_rest():
    g = torch.Generator().manual_seed(2)
    hidden = [torch.randn(3, 5, 6, generator=g) * (m + 1) for m in range(2)]
    hidden[1][0, 2, 4] = 50.0                                 # an outlier in the rest of document 0
    hidden[0][2, 3, 1] = 1e4                                  # a padded position: must be ignored
    lengths = [5, 3, 1]
    mask = torch.arange(5)[None, :] < torch.tensor(lengths)[:, None]
    attn = [torch.full((3, 2, 5, 5), 0.2) for _ in hidden]
    s = Stats(2, 2)
    s.update(hidden, attn, mask)
    r = s.result()['per_layer']
    for m, h in enumerate(hidden):
        h = h.numpy().astype(np.float64)
        first = [h[b, 0] for b in range(3)]
        rest = [h[b, t] for b in range(3) for t in range(1, lengths[b])]
        assert r['kurtosis_first'][m] == pytest.approx(np.mean([np_kurtosis(v) for v in first]), rel=1e-9)
        assert r['kurtosis_rest'][m] == pytest.approx(np.mean([np_kurtosis(v) for v in rest]), rel=1e-9)
        ratio = lambda v: np.abs(v).max() / np.sqrt((v * v).sum())
        assert r['norm_ratio_first'][m] == pytest.approx(np.mean([ratio(v) for v in first]), rel=1e-9)
        assert r['norm_ratio_rest'][m] == pytest.approx(np.mean([ratio(v) for v in rest]), rel=1e-9)
        assert r['max_abs_first'][m] == pytest.approx(np.mean([np.abs(v).max() for v in first]), rel=1e-9)
        per_doc = [np.abs(h[b, 1:lengths[b]]).max() for b in range(3) if lengths[b] > 1]   # doc 2 has no rest
        assert r['max_abs_rest'][m] == pytest.approx(np.mean(per_doc), rel=1e-9)
    assert r['max_abs_rest'][1] >= 50 / 2


def test_residual_peak_and_largest_channel_on_hand_made_hidden_states():
    """Three documents of 4, 3 and 1 tokens, C = 4, norms by hand. Document 0: h_0 = (1, -2, 2, 4), norm 5, |h_0|
    sorted (1, 2, 2, 4), median 2, largest 4: ratio 2; the rest has norms 1, 2, 4: median 2, peak 5 / 2. Document 1:
    h_0 = (0, 0, 6, 8), norm 10, |h_0| median (0 + 6) / 2 = 3, ratio 8 / 3; rest norms 5 and 1, median 3, peak
    10 / 3. Document 2: h_0 = (-2, 2, 2, 2), norm 4, ratio 1, no rest. Padding holds 100s. Layer 2 is layer 1
    with h_0 three times larger: its norms and peaks triple, the channel ratio stays. The summaries of these three
    metrics are the max over layers."""
    h = torch.full((3, 4, 4), 100.0)
    h[0] = torch.tensor([[1, -2, 2, 4], [0, 1, 0, 0], [0, 0, -2, 0], [0, 0, 0, 4]])
    h[1, :3] = torch.tensor([[0, 0, 6, 8], [3, 4, 0, 0], [0, 0, 0, -1]])
    h[2, 0] = torch.tensor([-2, 2, 2, 2])
    h2 = h.clone()
    h2[:, 0] *= 3
    mask = torch.arange(4)[None, :] < torch.tensor([4, 3, 1])[:, None]
    s = Stats(2, 2)
    s.update([h, h2], [torch.full((3, 2, 4, 4), 0.25)] * 2, mask)
    r = s.result()
    assert r['per_layer']['resid_norm_first'] == pytest.approx([19 / 3, 19])                # (5 + 10 + 4) / 3
    assert r['per_layer']['resid_peak'] == pytest.approx([35 / 12, 35 / 4])                 # (5/2 + 10/3) / 2
    assert r['per_layer']['max_over_median_first'] == pytest.approx([17 / 9, 17 / 9])       # (2 + 8/3 + 1) / 3
    assert (r['resid_norm_first'], r['resid_peak'], r['max_over_median_first']) == pytest.approx((19, 35 / 4, 17 / 9))
    assert r['kurtosis_first'] == pytest.approx(np.mean(r['per_layer']['kurtosis_first']))   # the others: E_m


def test_value_drain_on_hand_made_value_vectors():
    """One layer's value vectors (B = 3 documents of 3, 2 and 1 tokens, H = 2 heads, d = 2), norms by hand.
    Head 0: document 0 has ||v_0|| = ||(.3, .4)|| = .5 and rest norms 5, 1 (median 3): drain 1/6; document 1: 1 over
    2: 1/2; document 2: ||v_0|| = 3, no rest. Head 1: 10 over median(2, 3) = 2.5: 4; 2 over 1: 2; ||v_0|| = 4. So
    value_norm_first = (1.5, 16/3), value_drain = (1/3, 3), the layer's mean 5/3 and min 1/3. Layer 2 halves head 0's
    v_0: drain (1/6, 3), norms (.75, 16/3). Summaries: E_m of the means, and the min over layers of the minimum."""
    v = torch.full((3, 2, 3, 2), 50.0)                                                      # padding: 50s
    v[0, 0] = torch.tensor([[.3, .4], [3, 4], [0, 1]])
    v[0, 1] = torch.tensor([[6, 8], [0, 2], [0, 3]])
    v[1, 0, :2] = torch.tensor([[1, 0], [0, 2]])
    v[1, 1, :2] = torch.tensor([[0, 2], [0, 1]])
    v[2, 0, 0], v[2, 1, 0] = torch.tensor([0, 3]), torch.tensor([4, 0])
    v2 = v.clone()
    v2[:, 0, 0] /= 2
    mask = torch.arange(3)[None, :] < torch.tensor([3, 2, 1])[:, None]
    s = Stats(2, 2)
    s.update([torch.randn(3, 3, 4)] * 2, [torch.full((3, 2, 3, 3), 1 / 3)] * 2, mask, values=[v, v2])
    r = s.result()
    assert r['per_head']['value_norm_first'] == [pytest.approx([1.5, 16 / 3]), pytest.approx([.75, 16 / 3])]
    assert r['per_head']['value_drain'] == [pytest.approx([1 / 3, 3]), pytest.approx([1 / 6, 3])]
    assert r['per_layer']['value_drain'] == pytest.approx([5 / 3, 19 / 12])
    assert r['per_layer']['value_drain_min'] == pytest.approx([1 / 3, 1 / 6])
    assert r['per_layer']['value_norm_first'] == pytest.approx([41 / 12, 73 / 24])
    assert (r['value_drain'], r['value_drain_min'], r['value_norm_first']) == pytest.approx((13 / 8, 1 / 6, 155 / 48))
    no_values = Stats(1, 2)                                     # a Hugging Face model: no value vectors, NaN
    no_values.update([torch.randn(3, 3, 4)], [torch.full((3, 2, 3, 3), 1 / 3)], mask)
    assert math.isnan(no_values.result()['value_drain']) and math.isnan(no_values.result()['value_norm_first'])


def test_unnormalised_rows_and_the_non_trigger_queries_on_hand_made_maps():
    """Weights of ReLU attention, whose rows sum to anything: document 0 (tokens 5 7 9 7) has rows 1-3 summing to
    2, .4 and 0, document 1 (tokens 7 5) row 1 to 1.2; padded queries' rows hold 5s. Over the 4 queries > 0: first-token mass
    (1.5 + .2 + 0 + .9) / 4, row sum (2 + .4 + 0 + 1.2) / 4, nowhere (0 + .6 + 1 + 0) / 4 (the row above 1 counts 0),
    one empty row. With token 7 a trigger, the non-trigger queries are document 0's position 2 and document 1's
    position 1: (.2 + .9) / 2."""
    p = torch.full((2, 1, 4, 4), 5.0)
    p[0, 0] = torch.tensor([[2, 0, 0, 0], [1.5, .5, 0, 0], [.2, .1, .1, 0], [0, 0, 0, 0]])
    p[1, 0, :2] = torch.tensor([[1, 0, 0, 0], [.9, .3, 0, 0]])
    idx = torch.tensor([[5, 7, 9, 7], [7, 5, 0, 0]])
    mask = torch.tensor([[True] * 4, [True, True, False, False]])
    s = Stats(1, 1)
    s.update([torch.randn(2, 4, 8)], [p], mask, queries=~torch.isin(idx, torch.tensor([7])))
    r = s.result()
    assert r['first_attn_mass'] == pytest.approx(2.6 / 4) and r['attn_row_sum'] == pytest.approx(3.6 / 4)
    assert r['attn_nowhere'] == pytest.approx(1.6 / 4) and r['attn_empty'] == pytest.approx(1 / 4)
    assert r['first_attn_mass_nontrigger'] == pytest.approx(1.1 / 2)
    assert r['per_head']['first_attn_mass_nontrigger'] == [pytest.approx([0.55])]
    s = Stats(1, 1)                                             # no filter: no such key
    s.update([torch.randn(2, 4, 8)], [p], mask)
    assert 'first_attn_mass_nontrigger' not in s.result() and 'first_attn_mass_nontrigger' not in s.result()['per_layer']


def test_value_vectors_are_w_v_of_the_normalised_block_input():
    """The model's trace['value'], which value_drain reads: per layer and query head, v = LN(x) W_v + b_v, x the
    block's input (the embeddings, then the previous block's output), in float64 from the weights; with grouped-query
    attention a key/value head serves its group of query heads; with a sink token, the real tokens only (their
    positions start at 1)."""
    for kw in (dict(n_head=4, n_kv_head=2), dict(sink_token=True)):
        torch.manual_seed(0)
        m = GPT(tiny_config(bias=True, n_embd=16, **kw)).eval()
        idx = torch.randint(0, VOCAB, (2, 6))
        with torch.no_grad():
            _, _, trace = m(idx, analysis=True)
        H, kv = m.config.n_head, m.config.kv_heads
        d = 16 // H
        x = m.transformer.wte.weight.double()[idx] + m.transformer.wpe.weight.double()[int(m.config.sink_token):][:6]
        for layer, block in enumerate(m.transformer.h):
            if layer:
                x = trace['hidden'][layer - 1].double()
            ln = block.ln_1
            h = (x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()
            h = h * ln.weight.double() + ln.bias.double()
            w, b = block.attn.c_attn.weight.double()[16 + kv * d:], block.attn.c_attn.bias.double()[16 + kv * d:]
            v = (h @ w.T + b).view(2, 6, kv, d).transpose(1, 2).repeat_interleave(H // kv, dim=1)
            assert trace['value'][layer].shape == (2, H, 6, d)
            assert (trace['value'][layer].double() - v).abs().max() <= 1e-5


def test_attention_metrics_on_hand_made_maps():
    p = torch.zeros(2, 2, 4, 4)
    p[0, 0] = torch.tensor([[1, 0, 0, 0], [.7, .3, 0, 0], [.2, .5, .3, 0], [.4, .1, .1, .4]])   # a tie of 2: 1/2
    p[0, 1] = torch.tensor([[.5, 0, 0, 0], [.1, .6, 0, 0], [.3, .1, .1, 0], [.05, .05, .05, .05]])  # softmax-1; 1/4
    p[1, 0] = torch.tensor([[1, 0, 0, 0], [0, 1, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]])           # rows 2, 3 padded
    p[1, 1] = torch.tensor([[1, 0, 0, 0], [.9, .05, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]])
    mask = torch.tensor([[True] * 4, [True, True, False, False]])
    s = Stats(1, 2)
    s.update([torch.randn(2, 4, 8)], [p], mask)
    r = s.result()
    # key 0 the largest, per (query > 0) row: head 0: 1, 0, 1/2 (tied with key 3), 0; head 1: 0, 1, 1/4 (four-way), 1
    assert r['per_head']['first_attn_argmax'][0] == pytest.approx([1.5 / 4, 2.25 / 4])
    assert r['per_head']['first_attn_mass'][0] == pytest.approx([(.7 + .2 + .4 + 0) / 4, (.1 + .3 + .05 + .9) / 4])
    assert r['per_head']['attn_nowhere'][0] == pytest.approx([0, (.3 + .5 + .8 + .05) / 4], abs=1e-6)
    assert r['first_attn_argmax'] == pytest.approx(3.75 / 8)
    assert r['per_layer']['first_attn_mass'] == pytest.approx([(0.325 + 0.3375) / 2])


def test_rows_with_no_mass_are_left_out_of_the_argmax_share_and_counted_as_empty():
    """A row of zeros (softpick, clipped softmax) attends nowhere: argmax would call it key 0 (ties go to key 0). It is
    left out of first_attn_argmax, whose share is taken over the rows that attend somewhere, and counted in
    attn_empty; its whole mass counts in attn_nowhere."""
    p = torch.zeros(1, 2, 4, 4)
    p[0, 0] = torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0], [.2, .5, .1, 0], [.3, .1, .1, .2]])   # query 1 empty
    p[0, 1] = torch.tensor([[0, 0, 0, 0], [.6, .4, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]])        # queries 2, 3 empty
    s = Stats(1, 2)
    s.update([torch.randn(1, 4, 8)], [p], torch.ones(1, 4, dtype=torch.bool))
    r = s.result()
    assert r['per_head']['first_attn_argmax'][0] == pytest.approx([1 / 2, 1 / 1])       # not [2 / 3, 3 / 3]
    assert r['first_attn_argmax'] == pytest.approx((1 + 1) / (2 + 1))                   # the layer's attending rows
    assert r['per_head']['attn_empty'][0] == pytest.approx([1 / 3, 2 / 3]) and r['attn_empty'] == pytest.approx(0.5)
    assert r['per_head']['attn_nowhere'][0] == pytest.approx([(1 + .2 + .3) / 3, (0 + 1 + 1) / 3])
    s = Stats(1, 2)                                                                     # a head with no such row
    s.update([torch.randn(1, 4, 8)], [p * torch.tensor([1.0, 0.0])[None, :, None, None]], torch.ones(1, 4, dtype=torch.bool))
    assert math.isnan(s.result()['per_head']['first_attn_argmax'][0][1]) and s.result()['first_attn_argmax'] == 0.5


def test_a_tie_for_the_largest_weight_is_split_among_the_tied_keys():
    """first_attn_argmax counts key 0 fully only when it is strictly the largest; a row whose largest weight k keys
    share counts 1/k (argmax alone would give every tie to key 0, so a uniform row would count as a sink). Counted by
    hand: head 0's rows 1-3 are [.5 .5], [1/3 1/3 1/3], [.1 .4 .1 .4] (key 0 not among the largest): 1/2 + 1/3 + 0;
    head 1's: [.6 .4], [.2 .4 .4], [.4 .4 .1 .1]: 1 + 0 + 1/2."""
    p = torch.zeros(1, 2, 4, 4)
    third = 1 / 3
    p[0, 0] = torch.tensor([[1, 0, 0, 0], [.5, .5, 0, 0], [third, third, third, 0], [.1, .4, .1, .4]])
    p[0, 1] = torch.tensor([[1, 0, 0, 0], [.6, .4, 0, 0], [.2, .4, .4, 0], [.4, .4, .1, .1]])
    s = Stats(1, 2)
    s.update([torch.randn(1, 4, 8)], [p], torch.ones(1, 4, dtype=torch.bool))
    r = s.result()
    assert r['per_head']['first_attn_argmax'][0] == pytest.approx([(1 / 2 + 1 / 3) / 3, (1 + 1 / 2) / 3])
    assert r['first_attn_argmax'] == pytest.approx((1 / 2 + 1 / 3 + 1 + 1 / 2) / 6)
    # the sink token's share the same way: query 0 ties the sink (.5) with key 0 (.5): 1/2; query 1: the sink alone
    sink = {'hidden': [torch.randn(1, 8)], 'attn': [torch.tensor([[[.5, .5]]])]}             # (B, H, T)
    real = torch.tensor([[[[.5, 0], [.2, .3]]]])                                             # (B, H, T, T)
    s = Stats(1, 1)
    s.update([torch.randn(1, 2, 8)], [real], torch.ones(1, 2, dtype=torch.bool), sink)
    assert s.result()['sink_attn_argmax'] == pytest.approx((1 / 2 + 1) / 2)


def test_uniform_attention_is_no_sink(tmp_path):
    """A model with all-zero weights attends uniformly (every score 0): query t puts 1/(t + 1) on each of its keys,
    so its row gives key 0 the share 1/(t + 1) of the most-attended key, exactly its mass; counted by hand over
    documents of 1, 3, 9, 10 and 20 tokens: sum over t = 1..T-1 of 1/(t + 1) = H_T - 1 per document, over the 2 + 8 +
    9 + 19 = 38 rows: (0.8333 + 1.8290 + 1.9290 + 2.5977) / 38 = 0.1892 (argmax with ties to key 0: 1.0)."""
    data = write_docs(str(tmp_path / 'd'), [list(range(1, n + 1)) for n in (1, 3, 9, 10, 20)])
    model = GPT(tiny_config()).eval()
    with torch.no_grad():
        for w in model.parameters():
            w.zero_()
    result, _ = measure.analyze(LoadedModel('zero', model, 'ours', None, 32, VOCAB, {}), data, None, 2, 'cpu',
                                quiet=True)
    expected = sum(1 / (t + 1) for n in (3, 9, 10, 20) for t in range(1, n)) / 38
    assert expected == pytest.approx(0.18918, abs=1e-5)
    assert result['first_attn_argmax'] == pytest.approx(expected)
    assert result['first_attn_mass'] == pytest.approx(expected)
    assert result['per_head']['first_attn_argmax'] == [[pytest.approx(expected)] * 2] * 3


@pytest.mark.parametrize('broken', ['nan', 'inf', 'huge'])
def test_a_model_whose_forward_pass_is_not_finite_is_refused_in_one_line(broken, docs_dir, tmp_path):
    """NaN or Inf weights, or weights so large (x 1e30) that float32 overflows: its attention rows would count as
    first-token argmax (ties) and its sink rate as 0; analyze.py says so in one line, exits non-zero and writes no
    JSON."""
    ckpt = write_checkpoint(str(tmp_path / 'r'))
    c = torch.load(ckpt, weights_only=False)
    seen = set()
    for w in c['model'].values():
        if w.is_floating_point() and w.data_ptr() not in seen:            # tied weights once
            seen.add(w.data_ptr())
            w.fill_(math.nan) if broken == 'nan' else w.fill_(math.inf) if broken == 'inf' else w.mul_(1e30)
    assert broken != 'huge' or all(bool(torch.isfinite(w).all()) for w in c['model'].values())
    torch.save(c, ckpt)
    out = tmp_path / 'b.json'
    with pytest.raises(SystemExit) as e:
        analyze.main(['--ckpt', ckpt, '--data', docs_dir, '--max_docs', '2', '--json', str(out)])
    text = str(e.value)
    assert text.startswith('analyze.py: error: ') and '\n' not in text and 'non-finite values' in text, text
    assert ('float32 overflows' in text) == (broken == 'huge') and 'nothing is measured' in text
    assert not out.exists()


def test_sink_rate_counts_heads_over_epsilon_per_document_on_hand_made_maps():
    """Gu et al.'s sink rate: per document, layer and head, alpha = the mean over every query (query 0 included) of
    the probability on key 0; the share of (document, layer, head) with alpha > eps. Alphas counted by hand below;
    document 1 has two tokens, and its padded rows (all mass on key 0) must not count."""
    p = [torch.zeros(2, 2, 4, 4) for _ in range(2)]
    col0 = {(0, 0, 0): [1, .7, .2, .4],    # alpha 0.575
            (0, 0, 1): [.5, .1, .3, .05],  # 0.2375
            (0, 1, 0): [1, 0, 1, 1],       # 0.5 (rows 2, 3 padded)
            (0, 1, 1): [.5, .05, 1, 1],    # 0.275; with the padded rows it would be 0.64
            (1, 0, 0): [1, .1, .1, .1],    # 0.325
            (1, 0, 1): [1, .25, 0, 0],     # 0.3125
            (1, 1, 0): [1, .9, 1, 1],      # 0.95
            (1, 1, 1): [1, 0, 1, 1]}       # 0.5
    for (m, b, h), c in col0.items():
        p[m][b, h, :, 0] = torch.tensor(c)
    mask = torch.tensor([[True] * 4, [True, True, False, False]])
    expected = {0.3: ([[1, 0], [1, 1]], [0.5, 1.0], 0.75),    # layer 0: head 0 in both documents; layer 1: all
                0.5: ([[.5, 0], [.5, 0]], [0.25, 0.25], 0.25)}   # 0.575 and 0.95 only (0.5 is not > 0.5)
    for eps, (per_head, per_layer, rate) in expected.items():
        s = Stats(2, 2, sink_eps=eps)
        s.update([torch.randn(2, 4, 8)] * 2, p, mask)
        r = s.result()
        assert r['per_head']['sink_rate'] == [[pytest.approx(x) for x in row] for row in per_head], eps
        assert r['per_layer']['sink_rate'] == pytest.approx(per_layer) and r['sink_rate'] == pytest.approx(rate)
        assert r['sink_eps'] == eps


@pytest.mark.parametrize('attn, eps, sinks', [('softmax', 0.3, 3), ('softmax', 0.5, 2), ('softmax1', 0.3, 2)])
def test_sink_rate_of_uniform_attention_depends_on_the_document_length(tmp_path, attn, eps, sinks):
    """With every query weight zero each head attends uniformly: query t (0-based) puts 1/(t+1) on the first token
    (softmax-1: 1/(t+2), the sink taking one share), so a document of T tokens has alpha = H_T / T (softmax-1:
    (H_{T+1} - 1) / T) in every layer and head. Softmax: alpha > 0.3 for T <= 9 (H_9/9 = 0.314, H_10/10 = 0.293),
    > 0.5 for T <= 4 (H_4/4 = 0.521, H_5/5 = 0.457); softmax-1: > 0.3 for T <= 4 (0.321; T = 5: 0.290). Of the
    documents of 1, 3, 9, 10 and 20 tokens that makes 3, 2 and 2 sinks."""
    data = write_docs(str(tmp_path / 'd'), [list(range(1, n + 1)) for n in (1, 3, 9, 10, 20)])
    torch.manual_seed(0)
    model = GPT(tiny_config(attn=attn)).eval()
    with torch.no_grad():
        for b in model.transformer.h:
            b.attn.c_attn.weight[:16] = 0                     # q = 0: every score 0
    result, _ = measure.analyze(LoadedModel('u', model, 'ours', None, 32, VOCAB, {}), data, None, 2, 'cpu',
                                quiet=True, sink_eps=eps)
    assert result['per_head']['sink_rate'] == [[pytest.approx(sinks / 5)] * 2] * 3
    assert result['sink_rate'] == pytest.approx(sinks / 5) and result['sink_eps'] == eps


def test_first_attn_mass_nontrigger_follows_the_datas_triggers(tmp_path):
    """meta.json's "triggers": first_attn_mass_nontrigger equals the mean, over the queries > 0 whose token is not a
    trigger and the heads, of the model's attention on key 0, computed document by document here; without the key
    the metric is absent; a malformed list is a one-line error."""
    docs = random_docs()
    data = write_docs(str(tmp_path / 'd'), docs)
    meta_path = os.path.join(data, 'meta.json')
    meta = json.load(open(meta_path))
    triggers = [3, 5, 11, 20]
    json.dump(dict(meta, triggers=triggers), open(meta_path, 'w'))
    torch.manual_seed(0)
    model = GPT(tiny_config()).eval()
    lm = LoadedModel('t', model, 'ours', None, 32, VOCAB, {})
    result, _ = measure.analyze(lm, data, None, 2, 'cpu', quiet=True)
    mass, n = np.zeros(3), 0
    for d in docs:
        d = d[:32]
        with torch.no_grad():
            _, _, trace = model(torch.as_tensor(d)[None], analysis=True) if len(d) else (None, None, None)
        for t in range(1, len(d)):
            if d[t] not in triggers:
                n += 1
                mass += [trace['attn'][m][0, :, t, 0].double().mean().item() for m in range(3)]
    assert n > 0 and result['per_layer']['first_attn_mass_nontrigger'] == pytest.approx(mass / n, rel=1e-6)
    assert result['first_attn_mass_nontrigger'] != pytest.approx(result['first_attn_mass'], rel=1e-3)
    json.dump(dict(meta, triggers=[3, 'x']), open(meta_path, 'w'))
    with pytest.raises(ValueError, match='"triggers" must be a list of token ids') as e:
        measure.analyze(lm, data, None, 2, 'cpu', quiet=True)
    assert '\n' not in str(e.value)
    json.dump(meta, open(meta_path, 'w'))
    assert 'first_attn_mass_nontrigger' not in measure.analyze(lm, data, None, 2, 'cpu', quiet=True)[0]


def test_pearson_matches_numpy_and_is_none_when_undefined():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=12), rng.normal(size=12)
    assert pearson(a, b) == pytest.approx(np.corrcoef(a, b)[0, 1], rel=1e-12)
    assert pearson(a, 3 * a + 1) == pytest.approx(1.0)
    assert pearson([1.0], [2.0]) is None and pearson([1, 1, 1], [1, 2, 3]) is None
    assert pearson([1, float('nan')], [1, 2]) is None


def causal_probs(g, b, h, t):
    s = torch.randn(b, h, t, t, generator=g).masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), -math.inf)
    return torch.softmax(s, -1)


def test_streaming_accumulation_equals_one_shot():
    g = torch.Generator().manual_seed(3)
    L, H, C = 3, 2, 8
    batches = []
    for b, t in ((2, 5), (3, 7), (1, 4)):
        mask = torch.arange(t)[None] < torch.randint(1, t + 1, (b,), generator=g)[:, None]
        mask[0, :] = True
        batches.append(([torch.randn(b, t, C, generator=g) for _ in range(L)], [causal_probs(g, b, H, t)
                                                                                for _ in range(L)], mask))
    streamed = Stats(L, H)
    for hidden, attn, mask in batches:
        streamed.update(hidden, attn, mask)
    T = 7                                         # padded hidden states hold garbage: they must not count
    one = Stats(L, H)
    one.update([torch.cat([F.pad(h[m], (0, 0, 0, T - h[m].size(1)), value=123.0) for h, _, _ in batches])
                for m in range(L)],
               [torch.cat([F.pad(a[m], (0, T - a[m].size(-1), 0, T - a[m].size(-1))) for _, a, _ in batches])
                for m in range(L)],
               torch.cat([F.pad(mask, (0, T - mask.size(1))) for _, _, mask in batches]))
    a, b = streamed.result(), one.result()
    for k in measure.HIDDEN_METRICS + measure.ATTN_METRICS:
        assert a['per_layer'][k] == pytest.approx(b['per_layer'][k], rel=1e-9), k
        assert a[k] == pytest.approx(b[k], rel=1e-9)


# ----------------------------------------------------------------------------- data, perplexity, our models
def test_val_batches_sort_by_length_within_windows_bos_truncation_padding(docs_dir, monkeypatch):
    docs = [[VOCAB - 2] + d.tolist()[:15] for d in random_docs() if len(d)]
    batches = list(measure.val_batches(docs_dir, None, 16, 4, bos=VOCAB - 2))
    rows = [(idx[i][mask[i]]).tolist() for idx, mask in batches for i in range(len(idx))]
    assert rows == sorted(docs, key=len, reverse=True)                  # longest first, ties in file order
    assert [len(idx) for idx, _ in batches] == [4, 2]
    assert [idx.size(1) for idx, _ in batches] == [max(map(len, rows[:4])), max(map(len, rows[4:]))]
    monkeypatch.setattr(measure, 'BUCKET_DOCS', 3)                      # sorted within windows of 3 documents
    rows = [(idx[i][mask[i]]).tolist() for idx, mask in measure.val_batches(docs_dir, None, 16, 4, bos=VOCAB - 2)
            for i in range(len(idx))]
    assert rows == sorted(docs[:3], key=len, reverse=True) + sorted(docs[3:], key=len, reverse=True)
    idx, mask = next(measure.val_batches(docs_dir, 3, 8, 8))
    assert idx.shape == (2, 8) and mask.sum(1).tolist() == [8, 1]      # 3 documents, one of them empty
    assert idx[1, 1:].eq(0).all() and idx.dtype == torch.int64
    plain = [d.tolist()[:16] for d in random_docs() if len(d)]
    for idx, mask, numbers in measure.numbered_batches(docs_dir, None, 16, 4):      # each row's document number
        assert [idx[i][mask[i]].tolist() for i in range(len(idx))] == [plain[n] for n in numbers]


def test_perplexity_equals_a_direct_computation(docs_dir, tmp_path):
    lm = runs.load_model(write_checkpoint(str(tmp_path / 'run'), attn='softmax1'))
    assert lm.kind == 'ours' and lm.bos is None and lm.block_size == 32
    total, count = 0.0, 0
    for d in random_docs():
        d = torch.as_tensor(d[:32])
        if len(d) > 1:
            logits = lm.model(d[None])[0][0]
            total += F.cross_entropy(logits[:-1], d[1:], reduction='sum').item()
            count += len(d) - 1
    expected = math.exp(total / count)
    assert measure.perplexity(lm, docs_dir, None, 3, 'cpu') == pytest.approx(expected, rel=1e-5)
    result, example = measure.analyze(lm, docs_dir, None, 2, 'cpu')
    assert result['ppl'] == pytest.approx(expected, rel=1e-5)
    assert result['data']['documents'] == 6 and result['data']['predicted_tokens'] == count
    assert result['attn_nowhere'] > 0                       # softmax-1 sends mass nowhere
    assert example['attn'].shape == (1, 1)                  # the first document has one token


@pytest.mark.parametrize('attn', ['softmax', 'softmax1'])
def test_analysis_path_returns_the_training_path_logits(attn):
    torch.manual_seed(0)
    model = GPT(tiny_config(attn=attn, pos_emb='rotary')).eval()
    lm = LoadedModel('m', model, 'ours', None, 32, VOCAB, {})
    idx = torch.randint(0, VOCAB, (2, 20))
    logits, hidden, attn_maps = forward(lm, idx, analysis=True)
    assert torch.allclose(forward(lm, idx), logits, atol=1e-5, rtol=1e-5)
    assert torch.allclose(model.lm_head(model.transformer.ln_f(hidden[-1]))[..., :VOCAB], logits, atol=1e-5)
    assert len(hidden) == len(attn_maps) == 3 and attn_maps[0].shape == (2, 2, 20, 20)


def test_token_ids_outside_the_vocabulary_are_a_clear_error(tmp_path):
    lm = runs.load_model(write_checkpoint(str(tmp_path / 'run')))
    with pytest.raises(ValueError, match='another vocabulary'):
        forward(lm, torch.tensor([[1, VOCAB]]))
    data = write_docs(str(tmp_path / 'big'), [[1, 2, 3]], vocab_size=VOCAB + 10)
    with pytest.raises(ValueError, match='another vocabulary'):
        measure.perplexity(lm, data, None, 2, 'cpu')


def test_optimizer_basis_reads_second_moments_per_output_feature(tmp_path):
    path = write_checkpoint(str(tmp_path / 'a'))
    lm = runs.load_model(path)
    norms, moments, note = measure.optimizer_basis(lm)
    ckpt = torch.load(path, weights_only=False)
    names = ckpt['optimizer']['param_groups'][0]['param_names']
    for m in range(3):
        w = ckpt['model'][f'transformer.h.{m}.mlp.c_proj.weight']
        v = ckpt['optimizer']['state'][names.index(f'transformer.h.{m}.mlp.c_proj.weight')]['exp_avg_sq']
        assert np.allclose(norms[m], w.norm(dim=1).numpy()) and np.allclose(moments[m], v.sum(1).numpy())
    assert 'model basis' in note
    assert 'rotated basis' in measure.optimizer_basis(runs.load_model(
        write_checkpoint(str(tmp_path / 'b'), optimizer='orthoadam')))[2]


def test_read_log_keeps_the_last_line_of_a_repeated_iteration(tmp_path):
    write_checkpoint(str(tmp_path / 'r'))
    train, val = runs.read_log(str(tmp_path / 'r' / 'log.jsonl'))
    assert [(e['iter'], e['loss']) for e in train] == [(1, 3.5)] and [e['iter'] for e in val] == [0, 2]


def write_probe_log(path, growth, triggers=False):
    """A train.py log.jsonl whose evaluations carry probes; iteration 200 is logged twice (a resume), the later wins.
    The first probe is from before attn_nowhere and the value drain were measured (an older log)."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, 'log.jsonl'), 'w') as f:
        for it, stale in ((0, False), (100, False), (200, True), (200, False)):
            k = -1.0 if stale else 3.0 + growth * it / 200
            probe = {'kurtosis_first': k, 'kurtosis_rest': 3.0, 'max_abs_first': 2 * k, 'max_abs_rest': 5.0,
                     'first_attn_argmax': 0.1 + it / 1000, 'first_attn_mass': 0.05, 'per_layer': {}, 'documents': 8}
            if it:
                probe.update(attn_nowhere=it / 1000, resid_peak=k, value_drain=1 / k, value_drain_min=0.5 / k)
            if triggers:
                probe['first_attn_mass_nontrigger'] = 0.5
            f.write(json.dumps({'event': 'eval', 'iter': it, 'val_loss': 3.0, 'tokens': it * 1024, 'probe': probe}) + '\n')
    return path


@pytest.mark.slow   # a figure drawn
def test_trajectories_draw_each_runs_probes_against_tokens_seen(tmp_path, monkeypatch):
    a, b = write_probe_log(str(tmp_path / 'vanilla'), 100.0), write_probe_log(str(tmp_path / 's1oa'), 1.0, True)
    old = write_checkpoint(str(tmp_path / 'old'))            # its log.jsonl holds no probe: left out of the figure
    figures = []
    monkeypatch.setattr(plots, '_save', lambda fig, path: figures.append(fig) or path)
    analyze.main(['--trajectories', a, os.path.join(b, 'log.jsonl'), os.path.dirname(old), '--plots', str(tmp_path / 'p')])
    kurt, act, attn = figures[0].axes[:3]
    assert [line.get_label() for line in kurt.lines[::2]] == ['vanilla', 's1oa']
    tokens = [0, 100 * 1024, 200 * 1024]
    assert list(kurt.lines[0].get_xdata()) == tokens and list(kurt.lines[0].get_ydata()) == [3.0, 53.0, 103.0]
    assert list(kurt.lines[2].get_ydata()) == [3.0, 3.5, 4.0] and list(kurt.lines[3].get_ydata()) == [3.0] * 3
    assert list(act.lines[0].get_ydata()) == [6.0, 106.0, 206.0]
    assert list(attn.lines[0].get_ydata()) == pytest.approx([0.1, 0.2, 0.3])
    assert (kurt.get_yscale(), act.get_yscale(), attn.get_yscale()) == ('log', 'log', 'linear')   # 3 to 103: log
    mass, peak, _, drain = figures[0].axes[3:7]      # the first-token mass beside the mass that went nowhere
    assert [len(ax.lines) for ax in (mass, peak, drain)] == [2 + 3, 4, 4]    # the dotted non-trigger line: s1oa only
    assert list(mass.lines[0].get_ydata()) == [0.05] * 3 and mass.lines[1].get_linestyle() == '--'
    assert np.allclose(mass.lines[1].get_ydata(), [math.nan, 0.1, 0.2], equal_nan=True)   # the older probe: a gap
    assert list(mass.lines[4].get_ydata()) == [0.5] * 3 and mass.lines[4].get_linestyle() == ':'
    assert np.allclose(peak.lines[0].get_ydata(), [math.nan, 53, 103], equal_nan=True) and peak.get_yscale() == 'log'
    assert np.allclose(drain.lines[1].get_ydata(), [math.nan, 0.5 / 53, 0.5 / 103], equal_nan=True)
    monkeypatch.undo()
    analyze.main(['--trajectories', a, b, '--plots', str(tmp_path / 'p')])
    data = (tmp_path / 'p' / 'trajectories.png').read_bytes()
    assert data[:8] == b'\x89PNG\r\n\x1a\n' and len(data) > 5000
    for args, message in ((['--trajectories', os.path.dirname(old)], 'has a probe: train with --probe_docs'),
                          (['--trajectories', str(tmp_path / 'nosuch')], 'no such') ):
        with pytest.raises(SystemExit) as e:
            analyze.main(args + ['--plots', str(tmp_path / 'q')])
        assert message in str(e.value) and '\n' not in str(e.value), e.value
    with pytest.raises(SystemExit) as e:
        analyze.main(['--trajectories', a])                    # the figure needs a folder
    assert e.value.code == 2


@pytest.mark.slow   # analyze.py as a subprocess
def test_trajectories_refuse_a_plots_path_they_cannot_write_before_drawing(tmp_path):
    """Issue 36, cases 28-29: --plots FILE (a FileExistsError) and --plots on a read-only filesystem (an OSError from
    the figure's save) are one line."""
    from conftest import read_only_run
    a = write_probe_log(str(tmp_path / 'vanilla'), 100.0)
    (tmp_path / 'FILE').write_text('mine')
    with pytest.raises(SystemExit) as e:
        analyze.main(['--trajectories', a, '--plots', str(tmp_path / 'FILE')])
    assert str(e.value) == f"analyze.py: error: --plots {tmp_path / 'FILE'} is a file, not a folder; choose another --plots"
    assert (tmp_path / 'FILE').read_text() == 'mine'
    ro = tmp_path / 'ro'
    r = read_only_run([sys.executable, 'analyze.py', '--trajectories', a, '--plots', str(ro)], ro)
    assert r.returncode == 1 and r.stderr.strip() == (f"analyze.py: error: --plots {ro}: cannot write to {ro} "
                                                      f"(a read-only filesystem); choose another --plots"), r.stderr


def test_table_rows_name_each_models_attention_and_optimizer():
    cells = lambda **config: tables.model_cells('x', dict(n_params=2_500_000, **config))[1:]
    assert cells(attn='softpick', optimizer='muon') == ['2.5M', 'softpick', 'muon']
    assert cells(attn='softmax', attn_bias=True, optimizer='adamw')[1] == 'softmax + attn_bias'
    assert cells(attn='gated', sink_token=True, optimizer='orthoadam')[1:] == ['gated + sink_token', 'orthoadam']
    assert cells(model_type='gpt2') == ['2.5M', 'softmax', 'n/a']     # a public model: trained elsewhere


def test_run_label():
    assert tables.run_label('out/x/ckpt.pt') == 'x' and tables.run_label('runs/y.pt') == 'y'
    assert tables.run_label('meta-llama/Llama-2-7b-hf') == 'Llama-2-7b-hf' and tables.run_label('gpt2') == 'gpt2'


# ----------------------------------------------------------------------------- Hugging Face models
def direct_metrics(per_doc):
    """Per-layer metrics from a list of (hidden list of (T, C), attentions list of (H, T, T)), one per document."""
    L = len(per_doc[0][0])
    out = {k: [] for k in measure.HIDDEN_METRICS + measure.ATTN_METRICS}
    for m in range(L):
        hs = [h[m].double().numpy() for h, _ in per_doc]
        out['kurtosis_first'].append(np.mean([np_kurtosis(h[0]) for h in hs]))
        out['kurtosis_rest'].append(np.mean([np_kurtosis(v) for h in hs for v in h[1:]]))
        out['max_abs_first'].append(np.mean([np.abs(h[0]).max() for h in hs]))
        out['max_abs_rest'].append(np.mean([np.abs(h[1:]).max() for h in hs if len(h) > 1]))
        out['norm_ratio_first'].append(np.mean([np.abs(h[0]).max() / np.linalg.norm(h[0]) for h in hs]))
        out['norm_ratio_rest'].append(np.mean([np.abs(v).max() / np.linalg.norm(v) for h in hs for v in h[1:]]))
        out['resid_norm_first'].append(np.mean([np.linalg.norm(h[0]) for h in hs]))
        out['resid_peak'].append(np.mean([np.linalg.norm(h[0]) / np.median(np.linalg.norm(h[1:], axis=-1))
                                          for h in hs if len(h) > 1]))
        out['max_over_median_first'].append(np.mean([np.abs(h[0]).max() / np.median(np.abs(h[0])) for h in hs]))
        ps = [a[m].double().numpy() for _, a in per_doc]
        queries = [(p[:, t], t) for p in ps for t in range(1, p.shape[-1])]          # (H, T) rows, query t > 0
        heads = [(row[h, :t + 1], t) for row, t in queries for h in range(row.shape[0])]   # one (query, head) each
        out['first_attn_argmax'].append(np.mean([(h[0] == h.max()) / (h == h.max()).sum() for h, _ in heads
                                                 if h.max() > 0]))     # a tie of k keys: 1/k each
        out['first_attn_mass'].append(np.mean([row[:, 0].mean() for row, _ in queries]))
        out['attn_nowhere'].append(np.mean([(1 - row.sum(-1)).mean() for row, _ in queries]))
        out['attn_empty'].append(np.mean([h.max() <= 0 for h, _ in heads]))
        out['attn_row_sum'].append(np.mean([row.sum(-1).mean() for row, _ in queries]))
    return out


def check_hf_model(tmp_path, model, final_norm, docs_dir, bos):
    transformers = pytest.importorskip('transformers')
    model.save_pretrained(str(tmp_path / 'hf'))
    lm = runs.load_model(str(tmp_path / 'hf'), block_size=32)
    assert lm.kind == 'hf' and lm.bos == bos and lm.block_size == 32
    assert isinstance(lm.model, transformers.PreTrainedModel)
    per_doc, total, count = [], 0.0, 0
    for d in random_docs():
        if not len(d):
            continue
        d = torch.as_tensor(([bos] if bos is not None else []) + d.tolist())[:32]
        with torch.no_grad():
            out = lm.model(d[None], output_hidden_states=True, output_attentions=True, labels=d[None])
        logits, hidden, attn = forward(lm, d[None], analysis=True)
        # transformers: hidden_states[0] is the embedding output and the last entry has the final norm applied
        for m in range(len(hidden) - 1):
            assert torch.allclose(hidden[m], out.hidden_states[m + 1], atol=1e-6)
        assert torch.allclose(final_norm(lm.model)(hidden[-1]), out.hidden_states[-1], atol=1e-5)
        per_doc.append(([h[0] for h in out.hidden_states[1:-1]] + [hidden[-1][0]], [a[0] for a in out.attentions]))
        if len(d) > 1:
            total, count = total + out.loss.item() * (len(d) - 1), count + len(d) - 1
    result, _ = measure.analyze(lm, docs_dir, None, 3, 'cpu')
    expected = direct_metrics(per_doc)
    for k, v in expected.items():
        assert result['per_layer'][k] == pytest.approx(v, rel=1e-5, abs=1e-7), k
    assert result['ppl'] == pytest.approx(math.exp(total / count), rel=1e-5)
    return result


@pytest.mark.slow   # a public model through transformers
def test_hf_gpt2_metrics_agree_with_output_hidden_states(docs_dir, tmp_path):
    transformers = pytest.importorskip('transformers')
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=3, n_head=2, n_embd=16, vocab_size=VOCAB, n_positions=64,
                                  bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    model = transformers.GPT2LMHeadModel(cfg)
    result = check_hf_model(tmp_path, model, lambda m: m.transformer.ln_f, docs_dir, bos=None)
    assert result['attn_nowhere'] == pytest.approx(0, abs=1e-6) and result['attn_row_sum'] == pytest.approx(1)
    assert math.isnan(result['value_drain']) and math.isnan(result['per_head']['value_norm_first'][0][0])   # ours only
    norms, moments, _ = measure.optimizer_basis(runs.load_model(str(tmp_path / 'hf')))
    w = model.transformer.h[1].mlp.c_proj.weight            # Conv1D: (in, out)
    assert np.allclose(norms[1], w.norm(dim=0).detach().numpy()) and moments == [None] * 3


@pytest.mark.slow   # a public model through transformers
def test_hf_llama_gets_bos_and_metrics_agree(docs_dir, tmp_path):
    transformers = pytest.importorskip('transformers')
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1, vocab_size=VOCAB, max_position_embeddings=64,
                                   bos_token_id=VOCAB - 2, eos_token_id=VOCAB - 1, pad_token_id=0)
    check_hf_model(tmp_path, transformers.LlamaForCausalLM(cfg), lambda m: m.model.norm, docs_dir, bos=VOCAB - 2)


def test_missing_transformers_is_a_one_line_error(monkeypatch):
    monkeypatch.setitem(sys.modules, 'transformers', None)
    with pytest.raises(ValueError, match='pip install transformers') as e:
        runs.load_model('gpt2')
    assert '\n' not in str(e.value)


def test_hf_weights_not_on_this_machine_is_a_one_line_error(monkeypatch, tmp_path):
    pytest.importorskip('transformers')
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    with pytest.raises(ValueError, match='Hugging Face cache') as e:
        runs.load_model(str(tmp_path / 'no-such-model'))
    assert '\n' not in str(e.value)


# ----------------------------------------------------------------------------- command line
@pytest.mark.slow   # analyze.py as a user runs it, figures drawn
def test_cli_end_to_end(docs_dir, tmp_path, capsys):
    a = write_checkpoint(str(tmp_path / 'base'))
    b = write_checkpoint(str(tmp_path / 's1oa'), optimizer='orthoadam', attn='softmax1', norm='rmsnorm_single', seed=1)
    out, plots = tmp_path / 'json', tmp_path / 'plots'
    analyze.main(['--ckpt', a, str(tmp_path / 's1oa'), '--data', docs_dir, '--max_docs', '5', '--batch_size', '2',
                  '--json', str(out), '--plots', str(plots)])
    text = capsys.readouterr().out
    lines = [line for line in text.splitlines() if line.startswith(('base', 's1oa'))]
    assert len(lines) == 4 and 'E_m[κ_m,1]' in text and 'First Attn' in text
    assert lines[1].split()[2:4] == ['softmax1', 'orthoadam']   # each row names its attention and optimizer
    for name in ('base', 's1oa'):
        r = json.loads((out / f'{name}.json').read_text())
        assert all(k in r for k in tables.SUMMARY_KEYS + ('config', 'data', 'per_layer', 'per_head'))
        assert all(len(r['per_layer'][k]) == 3 for k in measure.HIDDEN_METRICS + measure.ATTN_METRICS)
        assert r['data']['documents'] == 4 and r['data']['max_docs'] == 5     # one of the 5 is empty
    for png in ('attention_map', 'hidden_states', 'layer_progression', 'optimizer_basis', 'training_curve'):
        data = (plots / f'{png}.png').read_bytes()
        assert data[:8] == b'\x89PNG\r\n\x1a\n' and len(data) > 5000, png
    analyze.main(['--table', str(out)])
    md = capsys.readouterr().out.splitlines()
    assert md[0].startswith('| Model |') and md[1].startswith('|---|---:') and md[2].startswith('| base |')
    assert sum(line.startswith('| s1oa |') for line in md) == 2
    cells = lambda line: line.replace('\\|', '').count('|')       # pipes inside cells are escaped
    assert '\\|' in md[0] and cells(md[0]) == cells(md[1]) == cells(md[2]) == 12
    assert 'Sink rate (ε=0.3)' in md[0]
    old = json.loads((out / 's1oa.json').read_text())            # a file written before sink_rate existed
    del old['sink_rate'], old['sink_eps']
    (out / 's1oa.json').write_text(json.dumps(old))
    analyze.main(['--table', str(out)])
    md = capsys.readouterr().out.splitlines()
    assert 'Sink rate (ε=0.3)' in md[0] and md[3].split('|')[-2].strip() == 'n/a'
    analyze.main(['--ckpt', a, '--data', docs_dir, '--max_docs', '3', '--json', str(tmp_path / 'one.json')])
    assert json.loads((tmp_path / 'one.json').read_text())['model'] == os.path.relpath(a)   # no absolute path


@pytest.mark.parametrize('args, message', [
    (['--ckpt', 'no/such/ckpt.pt'], 'not found'),
    (['--ckpt', 'out/nosuch'], '--ckpt out/nosuch: not found, no such file or folder'),   # a path, not a model name
    (['--ckpt', '{empty}'], 'holds no ckpt.pt'),
    (['--ckpt', '{ckpt}', '--data', 'no/such/data'], 'not a prepared dataset'),
    (['--ckpt', '{ckpt}', '{ckpt}', '--json', 'x.json'], 'pass a folder'),
    (['--table', '{ckpt}'], 'not an analyze.py JSON file'),
    (['--ckpt', '{ckpt}', '--max_docs', '-5'], '--max_docs must be >= 0 (0 = all documents), got -5'),
    (['--ckpt', '{ckpt}', '--sink_eps', '1.5'], '--sink_eps must be in [0, 1)'),
    (['--ckpt', '{ckpt}', '--plots', '{ckpt}'], 'is a file, not a folder'),
    (['--ckpt', '{ckpt}', '--json', '{ckpt}/sub/x.json'], 'ckpt.pt is a file, not a folder; choose another --json'),
    pytest.param(['--ckpt', '{ckpt}', '--device', 'cuda'], "device='cuda' but no CUDA GPU is available",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason='checks the error without a GPU')),
])
def test_cli_errors_are_one_line(args, message, docs_dir, tmp_path, monkeypatch):
    ckpt = write_checkpoint(str(tmp_path / 'r'))
    (tmp_path / 'empty').mkdir()
    args = [x.format(ckpt=ckpt, empty=tmp_path / 'empty') for x in args] + (['--data', docs_dir] if '--data' not in args else [])
    monkeypatch.setattr(analyze, 'analyze', lambda *a: pytest.fail('a refused command analysed a model'))
    with pytest.raises(SystemExit) as e:
        analyze.main(args)
    assert message in str(e.value) and '\n' not in str(e.value) and str(e.value).startswith('analyze.py: error')


@pytest.mark.parametrize('model_tok, data_tok, source, made_by', [
    ('bb_shakespeare', 'bytes', 'installed_docstrings', 'prepare_bb_shakespeare'),   # a task model, text data
    ('bigram_backcopy', 'bytes', 'pinned', 'prepare_bigram_backcopy'),
    ('bytes', 'bb_shakespeare', 'bb_shakespeare', 'prepare_pinned'),                 # a text model, a task's data
    ('bytes', 'test', 'installed_docstrings', 'prepare_installed_docstrings'),       # the data's source in bytes
    (None, 'bytes', 'pinned', None),                                                 # no tokenizer recorded
])
def test_the_advice_of_a_data_model_mismatch_works_when_followed(model_tok, data_tok, source, made_by, tmp_path,
                                                                 monkeypatch):
    """A Bigram-Backcopy model (a vocabulary of its own) on bytes data was told `prepare_c4.py --source pinned
    --tokenizer bb_shakespeare`, which prepare_c4.py refuses. The command advised is now run through prepare_c4.py's
    own checks and its tokenizer loaded (the preparation itself replaced by a record of the call); without a command
    prepare_c4.py can give, the advice names the data the model was trained on."""
    import prepare_c4
    from harness import tokenizer as tokenizer_lib
    data = write_docs(str(tmp_path / 'd'), random_docs(), vocab_size=300)
    meta = json.loads(open(os.path.join(data, 'meta.json')).read())
    meta.update(tokenizer=data_tok, args={'source': source, 'val_docs': 500} if source == 'bb_shakespeare' else
                {'source': source, 'subset': 'cpu', 'tokenizer': data_tok, 'max_docs': 5})
    open(os.path.join(data, 'meta.json'), 'w').write(json.dumps(meta))
    lm = LoadedModel('out/bb', None, 'ours', None, 32, 86, {}, tokenizer={'name': model_tok} if model_tok else None,
                     data='data/its_own')
    with pytest.raises(ValueError) as e:
        measure.check_data(data, lm)
    said = str(e.value)
    if made_by is None:
        assert 'prepare_c4.py' not in said and said.endswith('measure it on the data it was trained on, data/its_own')
        return
    command = re.search(r'make data in its vocabulary with (python prepare_c4\.py .*?)(?: \(or measure|$)', said)[1]
    calls = []

    def made(name):
        def prepare(out, *args, **kw):
            tokenizer = kw.get('tokenizer', args[-1] if name == 'prepare_pinned' else
                               args[0] if name == 'prepare_installed_docstrings' else None)
            if tokenizer not in (None, 'gpt2', 'auto'):
                tokenizer_lib.load_tokenizer(tokenizer)        # the tokenizer it names exists
            calls.append((name, out))
            return data
        return prepare
    for name in ('prepare_bb_shakespeare', 'prepare_bigram_backcopy', 'prepare_pinned', 'prepare_installed_docstrings',
                 'prepare_c4', 'prepare_wikitext2'):
        monkeypatch.setattr(prepare_c4, name, made(name))
    prepare_c4.main(shlex.split(command)[2:])               # a refusal would exit
    assert calls == [(made_by, f'{data}_bb')], (command, calls)


def test_json_folder_is_created(docs_dir, tmp_path):
    a = write_checkpoint(str(tmp_path / 'r'))
    path = tmp_path / 'new' / 'deeper' / 'x.json'
    analyze.main(['--ckpt', a, '--data', docs_dir, '--max_docs', '3', '--json', str(path)])
    assert json.loads(path.read_text())['model'] == os.path.relpath(a)


def test_sink_token_model_measures_real_tokens_and_reports_the_sink_apart(docs_dir):
    """With sink_token the first token is the first real token, and the sink's own numbers (kurtosis, max
    |x|, the attention it gets and how often it is the most-attended key) come from a per-document
    computation on the model's trace here."""
    torch.manual_seed(0)
    model = GPT(tiny_config(sink_token=True)).eval()
    with torch.no_grad():
        model.sink.mul_(50)                                # a sink that stands out
    lm = LoadedModel('sink', model, 'ours', None, 32, VOCAB, {})
    result, _ = measure.analyze(lm, docs_dir, None, 3, 'cpu')
    want = {k: [[] for _ in range(3)] for k in ('sink_kurtosis', 'sink_max_abs', 'kurtosis_first')}
    mass, top, queries = np.zeros(3), np.zeros(3), 0
    for d in random_docs():
        if not len(d):
            continue
        with torch.no_grad():
            _, _, trace = model(torch.as_tensor(d[:32])[None], analysis=True)
        queries += len(d[:32]) * 2                          # (query, head) pairs
        for m in range(3):
            h = trace['sink']['hidden'][m][0].double().numpy()
            c = h - h.mean()
            want['sink_kurtosis'][m].append((c ** 4).mean() / (c ** 2).mean() ** 2)
            want['sink_max_abs'][m].append(np.abs(h).max())
            x = trace['hidden'][m][0, 0].double().numpy() - trace['hidden'][m][0, 0].double().numpy().mean()
            want['kurtosis_first'][m].append((x ** 4).mean() / (x ** 2).mean() ** 2)
            p_sink, p_real = trace['sink']['attn'][m][0].numpy(), trace['attn'][m][0].numpy()   # (H, T), (H, T, T)
            mass[m] += p_sink.sum()
            top[m] += ((p_sink >= p_real.max(-1)) / (1 + (p_real == p_sink[..., None]).sum(-1))).sum()   # ties split
    for k, v in want.items():
        assert result['per_layer'][k] == pytest.approx([np.mean(x) for x in v], rel=1e-5), k
    assert result['per_layer']['sink_attn_mass'] == pytest.approx(mass / queries, rel=1e-5)
    assert result['per_layer']['sink_attn_argmax'] == pytest.approx(top / queries, rel=1e-5)
    assert result['sink_max_abs'] > 5 * result['max_abs_first']          # the sink is not among the measured tokens
    assert result['attn_nowhere'] > 0                                     # real keys get less than everything


def test_perplexity_leaves_out_the_targets_a_free_prefix_lets_the_model_see(tmp_path):
    """With causal_free_prefix = k the first k tokens see each other, so positions t < k - 1 see their next
    token: analyze.py's perplexity leaves them out, as train.py's loss does; counted by hand."""
    import torch
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=12, vocab_size=30, causal_free_prefix=4)).eval()
    lm = runs.LoadedModel('x', model, 'ours', None, 12, 30, {})
    idx = torch.randint(0, 30, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 7:] = False                                # the second document has 7 tokens
    with torch.no_grad():   # a measurement: no graph
        logits = model(idx)[0]
    nll, n = measure.nll_sum(logits, idx, mask, measure.seen_targets(lm))
    logp = torch.log_softmax(logits.double(), -1)
    want = [-logp[0, t, idx[0, t + 1]] for t in range(3, 11)] + [-logp[1, t, idx[1, t + 1]] for t in range(3, 6)]
    assert measure.seen_targets(lm) == 3 and n == len(want) == 11
    assert abs(nll - float(sum(want))) < 1e-6 * len(want) * 10


@pytest.mark.slow   # figures drawn, a script as a subprocess
@pytest.mark.parametrize('n_layer', [4, 2])   # analyze.py's Appendix K figure: 4 panels, or 3 for 2-3 layers
def test_the_readme_figure_takes_the_hidden_states_and_the_mean_attention_panel(tmp_path, n_layer):
    """docs/front_figure.py puts hidden_states.png beside the first panel (mean over layers) of attention_layers.png,
    pixels copied. The mean map is drawn all at its colour bar's top (viridis yellow), every single layer at a quarter
    of it (one cell aside), so the cut is right when the copied part holds that yellow image whole and the rest of
    the figure next to none."""
    import subprocess
    import matplotlib.image as mpimg
    T = 32
    mean = np.tril(np.ones((T, T)))
    layer = 0.25 * mean
    layer[-1, 0] = 1.0                                         # one cell sets the colour scale: the rest is not yellow
    ex = {'attn': mean, 'attn_layers': [layer] * n_layer, 'hidden': np.abs(np.random.default_rng(0).normal(size=(T, 40)))}
    folder = tmp_path / 'model'
    folder.mkdir()
    plots.plot_hidden_states([('model', ex)], str(folder / 'hidden_states.png'))
    plots.plot_attention_layers([('model', ex)], str(folder / 'attention_layers.png'))
    out = tmp_path / 'front.png'
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'docs', 'front_figure.py')
    r = subprocess.run([sys.executable, script, str(folder), '--out', str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr

    def yellow(img):                                           # viridis(1.0) = (0.993, 0.906, 0.144)
        return (np.abs(img[..., :3] - np.array([0.993, 0.906, 0.144])).max(-1) < 0.05).sum()
    hidden = mpimg.imread(folder / 'hidden_states.png')
    layers = mpimg.imread(folder / 'attention_layers.png')
    front = mpimg.imread(out)
    copied = front[:, hidden.shape[1]:]                        # the attention part (and the gap before it)
    triangle = T * (T + 1) / 2 / T ** 2                        # share of the image the mean map fills
    assert yellow(copied) > 0.9 * triangle * (layers.shape[0] * 0.5) ** 2 / 4   # a whole image of yellow, roughly
    rest = yellow(layers) - yellow(copied)
    assert 0 <= rest < 0.05 * yellow(copied)                  # what was left: the other colour bars' tops only
    # Every panel after the first is as wide as the distance from one image's left edge to the next one's (the same
    # labels, constrained layout), so what was cut away is (panels - 1) of those distances, within a few pixels.
    near = lambda img, rgb: np.abs(img[..., :3] - np.array(rgb)).max(-1) < 0.05
    image = (near(layers, [0.267, 0.005, 0.329]) | near(layers, [0.231, 0.322, 0.545])).sum(0)   # viridis(0), (0.25)
    columns = np.flatnonzero(image > 0.5 * image.max())
    lefts = columns[np.r_[True, np.diff(columns) > 1]]         # each image's left edge
    panels = 3 if n_layer < 4 else 4
    assert len(lefts) == panels
    width = copied.shape[1] - 24                               # the copied panel, after the gap between the two
    assert abs((layers.shape[1] - width) - (panels - 1) * (lefts[2] - lefts[1])) <= 8
    r = subprocess.run([sys.executable, script, str(tmp_path / 'nothing')], capture_output=True, text=True)
    assert r.returncode != 0 and r.stderr.count('\n') == 1 and 'has no hidden_states.png' in r.stderr
    for name in ('hidden_states.png', 'attention_layers.png'):      # --out on an input: refused, the input unchanged
        before = (folder / name).read_bytes()
        r = subprocess.run([sys.executable, script, str(folder), '--out', str(folder / '.' / name)],
                           capture_output=True, text=True)
        assert r.returncode != 0 and r.stderr.count('\n') == 1 and 'is the input' in r.stderr, r.stderr
        assert (folder / name).read_bytes() == before


@pytest.mark.slow   # a script as a subprocess
def test_the_readme_figure_is_redrawn_byte_for_byte_and_a_broken_png_is_one_line(tmp_path):
    """docs/front_figure.py without a folder drew docs/figures/smollm2 (an older figure) where the tracked front.png
    came from docs/figures/smollm2-pinned: its default rewrote the README's figure with other bytes. A
    hidden_states.png cut short or a text file under that name was a traceback."""
    import subprocess
    from PIL import Image
    import matplotlib
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script, tracked = os.path.join(root, 'docs', 'front_figure.py'), os.path.join(root, 'docs', 'figures', 'front.png')
    out = tmp_path / 'front.png'
    r = subprocess.run([sys.executable, script, '--out', str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    if matplotlib.__version__ in Image.open(tracked).info.get('Software', ''):   # the PNG names the matplotlib it used
        assert out.read_bytes() == open(tracked, 'rb').read()
    else:
        assert np.array_equal(np.asarray(Image.open(out)), np.asarray(Image.open(tracked)))
    good = os.path.join(root, 'docs', 'figures', 'smollm2-pinned', 'hidden_states.png')
    for name, content in (('cut', open(good, 'rb').read()[:20000]), ('text', b'not a figure\n')):
        folder = tmp_path / name
        folder.mkdir()
        (folder / 'hidden_states.png').write_bytes(content)
        shutil.copy(os.path.join(os.path.dirname(good), 'attention_map.png'), folder)
        r = subprocess.run([sys.executable, script, str(folder), '--out', str(folder / 'F.png')], capture_output=True,
                           text=True)
        assert r.returncode == 1 and r.stderr.count('\n') == 1 and 'Traceback' not in r.stderr, r.stderr
        assert r.stderr.startswith(f"front_figure.py: error: {folder / 'hidden_states.png'} is not a whole PNG file")
        assert not (folder / 'F.png').exists()
