"""Guo et al.'s Bigram-Backcopy task (sources.backcopy_documents, pinned_corpus/prepare.py's prepare_bb_shakespeare): the generator against
the task's definition on a hand-made chain (copies after triggers, the chain's frequencies elsewhere, no trigger
first), character bigram counts by hand, and the prepared folder from the pinned corpus's Shakespeare."""
import collections
import json
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from harness.sources import backcopy_documents, char_bigrams  # noqa: E402


def test_char_bigrams_count_pairs_within_texts():
    chars, counts, unigram = char_bigrams(['abca', 'ab'])
    assert chars == 'abc'
    want = np.zeros((3, 3), dtype=int)
    want[0, 1], want[1, 2], want[2, 0] = 2, 1, 1       # a->b twice (both texts), b->c, c->a; none across texts
    assert (counts == want).all() and unigram.tolist() == [3, 2, 1]


def chain(seed=0, v=5):
    """A chain over v tokens plus <s> and <d> (ids v, v + 1, never generated), its first-token law and 2 triggers."""
    rng = np.random.default_rng(seed)
    cond = np.zeros((v + 2, v + 2))
    cond[:, :v] = rng.dirichlet(np.ones(v), size=v + 2)
    first = np.r_[rng.dirichlet(np.ones(v)), 0, 0]
    triggers = [1, 3]
    first[triggers] = 0
    return cond, first / first.sum(), triggers


def test_backcopy_documents_follow_the_task_definition():
    cond, first, triggers = chain()
    docs = np.stack(list(backcopy_documents(600, 48, cond, first, triggers, seed=3, chunk=256)))
    assert docs.shape == (600, 48) and docs.max() < 5                    # <s> and <d> never generated
    assert not np.isin(docs[:, 0], triggers).any()                        # no trigger first
    after = np.isin(docs[:, 1:-1], triggers)                              # a trigger at t - 1 ...
    assert after.sum() > 1000 and (docs[:, 2:][after] == docs[:, :-2][after]).all()   # ... t repeats t - 2
    pairs = collections.Counter()
    for d in docs:
        for a, b in zip(d[:-1], d[1:]):
            if a not in triggers:
                pairs[a, b] += 1
    for a in set(range(5)) - set(triggers):                               # elsewhere the chain's own frequencies
        n = sum(pairs[a, b] for b in range(5))
        for b in range(5):
            p = cond[a, b]
            assert abs(pairs[a, b] / n - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-9, (a, b)
    again = np.stack(list(backcopy_documents(600, 48, cond, first, triggers, seed=3, chunk=256)))
    assert (again == docs).all()                                          # a seed is one draw


def test_the_command_line_defaults_are_the_preparers():
    # harness.dataset.prepare_command says a folder came from `prepare_c4.py --source bb_shakespeare` when its settings
    # are BB_SHAKESPEARE; they must be the defaults prepare_bb_shakespeare runs with
    import inspect

    from harness.dataset import BB_SHAKESPEARE, prepare_command
    from pinned_corpus.prepare import prepare_bb_shakespeare
    params = inspect.signature(prepare_bb_shakespeare).parameters
    assert BB_SHAKESPEARE == {k: params[k].default for k in BB_SHAKESPEARE}
    assert set(params) == set(BB_SHAKESPEARE) | {'out_dir', 'force'}
    args = dict(BB_SHAKESPEARE, source='bb_shakespeare', manifest_sha256='x')
    assert prepare_command(args, 'data/b') == ('python prepare_c4.py --source bb_shakespeare --val_docs 500 '
                                               '--out_dir data/b')
    assert prepare_command(dict(args, seed=1), 'data/b') is None


@pytest.mark.slow   # the pinned corpus's Shakespeare: fetched (or read from the cache) and extracted
def test_prepared_bb_shakespeare_from_the_pinned_corpus(tmp_path):
    from pinned_corpus import build as pinned
    from pinned_corpus import prepare
    try:
        out = prepare.prepare_bb_shakespeare(str(tmp_path / 'bb'), train_docs=300, val_docs=20)
    except pinned.CorpusError as e:
        pytest.skip(f"the pinned corpus's Shakespeare cannot be fetched here: {e}")
    meta = json.loads((out / 'meta.json').read_text())
    chars, c = meta['chars'], len(meta['chars'])
    assert meta['vocab_size'] == c + 2 and meta['eot_token'] == c
    src = next(s for s in pinned.load_manifest()['sources'] if s['id'] == 'shakespeare')
    texts = [t for n, t in pinned.extracted(src, pinned.default_cache()) if prepare.SHAKESPEARE_TEXTS in n]
    counted = collections.Counter(''.join(texts))
    assert sorted(counted) == list(chars)
    assert [chars[i] for i in meta['triggers']] == [ch for ch, _ in counted.most_common(3)]   # ' ', 'e', 't'
    train = np.fromfile(out / 'train.bin', dtype=np.uint16)
    assert len(train) == 300 * 257 and (train[256::257] == c).all()       # every document: 256 tokens, then <s>
    assert c + 1 not in train                                             # the delimiter is never generated


@pytest.mark.slow   # matplotlib
def test_the_dynamics_figure_draws_our_probes_beside_the_reference(tmp_path):
    """plots.plot_bb_dynamics reads layer 0 of each probe of log.jsonl and draws Guo et al.'s curves up to our last
    step; a log without probes gives no figure. The committed reference has the three curves of one layer."""
    from harness import plots
    log = tmp_path / 'log.jsonl'
    with open(log, 'w') as f:
        for it in (0, 100, 200):
            probe = {'documents': 4, 'per_layer': {'first_attn_mass_nontrigger': [0.1 * it / 100],
                                                   'resid_norm_first': [24.0 + it / 50], 'value_norm_first': [9.0 - it / 50]}}
            f.write(json.dumps({'event': 'probe', 'iter': it, 'tokens': it * 2048, 'probe': probe}) + '\n')
    ref = json.load(open(os.path.join(ROOT, 'docs', 'results', 'bb-guo-reference.json')))['curves']
    one = ref['1 layer, Adam']
    assert len(one['step']) == len(one['attn_on_s']) == len(one['resid_norm_s']) == len(one['value_norm_s'])
    assert one['attn_on_s'][one['step'].index(2000)] == pytest.approx(0.798, abs=1e-3)   # paper_tables.GUO_AT_2000
    out = plots.plot_bb_dynamics([('1 L, softmax + Adam', str(log), 1)], ref, str(tmp_path / 'dyn.png'))
    assert out and os.path.getsize(out) > 10_000
    empty = tmp_path / 'empty.jsonl'
    empty.write_text('')
    assert plots.plot_bb_dynamics([('x', str(empty), 1)], ref, str(tmp_path / 'none.png')) is None
