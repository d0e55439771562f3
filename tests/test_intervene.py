"""intervene.py against forward passes written out by hand: a planted outlier channel zeroed or mean-replaced block
by block, the first key hidden by an explicit attention mask, public models through GPT.from_hf, the CLI."""
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import analyze
import intervene
from harness.runs import LoadedModel
from model import GPT
from test_analyze import VOCAB, random_docs, tiny_config, write_checkpoint, write_docs
from harness import measure, runs

pytestmark = pytest.mark.usefixtures('one_thread')

CHANNEL = 5          # the planted outlier channel


@pytest.fixture(scope='module')
def docs_dir(tmp_path_factory):
    return write_docs(str(tmp_path_factory.mktemp('docs')), random_docs(n=9, seed=4))


def planted_model(**kw):
    """A tiny GPT whose first position carries a huge value in CHANNEL: position 0's embedding holds 200 there, so
    every layer's residual stream has it at the first token (plus the blocks' small additions)."""
    torch.manual_seed(0)
    model = GPT(tiny_config(**kw)).eval()
    with torch.no_grad():
        model.transformer.wpe.weight[0, CHANNEL] = 200.0
    return model


def documents(bos=None):
    return [torch.as_tensor(([bos] if bos is not None else []) + d.tolist())[:32]
            for d in random_docs(n=9, seed=4) if len(d)]


@torch.no_grad()
def hand_forward(model, idx, after_block=None):
    """Logits of a GPT with absolute positions, block by block; after_block(m, x) may change x (B, T, C) in place."""
    x = model.transformer.wte(idx) + model.transformer.wpe(torch.arange(idx.size(1)))
    for m, block in enumerate(model.transformer.h):
        x = block(x, None)
        if after_block is not None:
            after_block(m, x)
    return model.lm_head(model.transformer.ln_f(x))[..., :model.config.vocab_size]


def ppl_of(logits_fn, docs):
    total, count = 0.0, 0
    for d in docs:
        if len(d) > 1:
            total += F.cross_entropy(logits_fn(d[None])[0, :-1], d[1:], reduction='sum').item()
            count += len(d) - 1
    return math.exp(total / count)


def run(model, docs_dir, k=1, names=intervene.INTERVENTIONS, bos=None):
    lm = LoadedModel('planted', model, 'ours', bos, 32, VOCAB, {})
    return intervene.intervene(lm, docs_dir, None, 3, 'cpu', k, names, quiet=True)


# ----------------------------------------------------------------------------- massive activations
def test_the_planted_channel_is_chosen_in_every_layer_and_zeroing_it_equals_zeroing_by_hand(docs_dir):
    model = planted_model()
    channels, results, data = run(model, docs_dir)
    docs = documents()
    assert data['documents'] == len(docs)
    assert channels['channels'] == [[CHANNEL]] * 3
    assert all(a[0] > 150 for a in channels['mean_abs'])
    assert channels['massive'] == [[True]] * 3              # 200 > 100 and > 1000 x the median |x| (~0.02)
    expected = ppl_of(lambda idx: hand_forward(model, idx, lambda m, x: x[:, 0, CHANNEL].zero_()), docs)
    assert results['zero']['ppl'] == pytest.approx(expected, rel=1e-5)
    assert results['none']['ppl'] == pytest.approx(ppl_of(lambda idx: hand_forward(model, idx), docs), rel=1e-5)
    assert abs(results['zero']['ppl'] - results['none']['ppl']) > 1e-3      # the intervention changes something
    assert results['zero']['delta_ppl'] == pytest.approx(results['zero']['ppl'] - results['none']['ppl'])
    assert results['zero']['max_abs_first'] < 50 < results['none']['max_abs_first']
    # the control: k other channels per layer, the same zeroing by hand
    rand = channels['random']
    assert all(len(c) == 1 and c[0] != CHANNEL for c in rand)
    expected = ppl_of(lambda idx: hand_forward(model, idx, lambda m, x: x[:, 0, rand[m]].zero_()), docs)
    assert results['zero_random']['ppl'] == pytest.approx(expected, rel=1e-5)
    assert run(model, docs_dir)[0]['random'] == rand                        # seeded: the same draw again
    for m in model.transformer.h:                                           # nothing is left behind
        assert not m._forward_hooks and not m.attn.hide_first_key


def test_mean_replacement_writes_each_layers_mean_over_documents(docs_dir):
    """Without a BOS the first token differs between documents; `mean` writes, per layer, the mean over documents of
    the reference pass (every earlier layer unchanged there), computed here from plain forwards. The planted value
    depends on the first token here (200 + a per-token offset in [-300, 300]), so the mean is not every value."""
    model = planted_model(tie_embeddings=False)
    with torch.no_grad():
        model.transformer.wte.weight[:VOCAB, CHANNEL] += torch.linspace(-300, 300, VOCAB)
    docs = documents()
    firsts, medians = [[] for _ in range(3)], [[] for _ in range(3)]
    for d in docs:
        hand_forward(model, d[None], lambda m, x: (firsts[m].append(x[0, 0].double().clone()),
                                                   medians[m].append(x.abs().median().item())))
    mean = [torch.stack(f).mean(0) for f in firsts]
    top2 = [torch.stack(f).abs().mean(0).argsort(descending=True)[:2] for f in firsts]

    def replace(m, x):
        x[:, 0, top2[m]] = mean[m][top2[m]].float()
    channels, results, _ = run(model, docs_dir, k=2, names=('mean',))
    assert [c for c in channels['channels']] == [t.tolist() for t in top2] and top2[0][0] == CHANNEL
    assert channels['mean'] == [pytest.approx(mean[m][top2[m]].tolist(), rel=1e-6) for m in range(3)]
    assert channels['median_abs'] == pytest.approx([np.mean(v) for v in medians], rel=1e-6)   # whole documents
    assert results['mean']['ppl'] == pytest.approx(ppl_of(lambda idx: hand_forward(model, idx, replace), docs), rel=1e-5)
    assert abs(results['mean']['ppl'] / results['none']['ppl'] - 1) > 1e-4
    assert results['mean']['max_abs_first'] < 0.8 * results['none']['max_abs_first']    # |mean| < mean |x|


def test_massive_only_changes_the_layers_whose_channel_passes_the_bar(docs_dir):
    """A value of 300 added to CHANNEL by the second block's MLP (every token; the median |x| stays ~0.02): massive
    from layer 2 on, nothing massive in layer 1. --massive_only zeroes it in layers 2 and 3 only."""
    torch.manual_seed(0)
    model = GPT(tiny_config(bias=True)).eval()
    with torch.no_grad():
        model.transformer.h[1].mlp.c_proj.bias[CHANNEL] = 300.0
    lm = LoadedModel('m', model, 'ours', None, 32, VOCAB, {})
    channels, results, _ = intervene.intervene(lm, docs_dir, None, 3, 'cpu', 1, ('zero', 'zero_random'), quiet=True,
                                               massive_only=True)
    assert channels['massive'] == [[False], [True], [True]] and channels['channels'][1:] == [[CHANNEL]] * 2
    docs, rand = documents(), channels['random']
    expected = ppl_of(lambda idx: hand_forward(model, idx, lambda m, x: x[:, 0, CHANNEL].zero_() if m else None), docs)
    assert results['zero']['ppl'] == pytest.approx(expected, rel=1e-5)
    expected = ppl_of(lambda idx: hand_forward(model, idx, lambda m, x: x[:, 0, rand[m]].zero_() if m else None), docs)
    assert results['zero_random']['ppl'] == pytest.approx(expected, rel=1e-5)
    everywhere = intervene.intervene(lm, docs_dir, None, 3, 'cpu', 1, ('zero',), quiet=True)[1]['zero']['ppl']
    assert everywhere != pytest.approx(results['zero']['ppl'], rel=1e-6)      # layer 1 matters without the option


def test_with_a_bos_the_first_token_is_the_same_everywhere_and_mean_is_the_identity(docs_dir):
    model = planted_model()
    _, results, data = run(model, docs_dir, k=2, names=('mean',), bos=VOCAB - 2)
    assert data['bos'] == VOCAB - 2
    assert results['mean']['ppl'] == pytest.approx(results['none']['ppl'], rel=1e-6)


def test_channels_of_a_sink_token_model_are_those_of_the_first_real_token(docs_dir):
    torch.manual_seed(0)
    model = GPT(tiny_config(sink_token=True)).eval()
    with torch.no_grad():
        model.transformer.wpe.weight[1, CHANNEL] = 200.0                   # position 1: the first real token
        model.transformer.wpe.weight[0, CHANNEL + 1] = 500.0                # the sink's own channel is not measured
    channels, results, _ = run(model, docs_dir, names=('zero',))
    assert channels['channels'] == [[CHANNEL]] * 3
    assert results['zero']['max_abs_first'] < 50 < results['none']['max_abs_first']


# ----------------------------------------------------------------------------- the first key hidden
@torch.no_grad()
def masked_forward(model, idx, hide_first=True):
    """An explicit eager forward of a GPT (absolute positions, LayerNorm, GELU) with every query t > 0 forbidden to
    attend to key 0: softmax over the allowed keys, or exp(s) / (1 + sum exp(s)) for softmax-1."""
    cfg = model.config
    B, T = idx.shape
    H, d = cfg.n_head, cfg.n_embd // cfg.n_head
    allowed = torch.ones(T, T).tril().bool()
    if hide_first:
        allowed[1:, 0] = False
    x = model.transformer.wte(idx) + model.transformer.wpe(torch.arange(T))
    for blk in model.transformer.h:
        h = F.layer_norm(x, (cfg.n_embd,), blk.ln_1.weight, blk.ln_1.bias, cfg.norm_eps)
        q, k, v = (h @ blk.attn.c_attn.weight.T).split(cfg.n_embd, dim=2)
        q, k, v = (t.view(B, T, H, d).transpose(1, 2) for t in (q, k, v))
        s = (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(~allowed, -math.inf)
        if cfg.attn == 'softmax1':                           # the scores of this tiny model are small: no overflow
            p = torch.exp(s) / (1 + torch.exp(s).sum(-1, keepdim=True))
        else:
            p = torch.softmax(s, -1)
        y = (p @ v).transpose(1, 2).reshape(B, T, cfg.n_embd)
        x = x + y @ blk.attn.c_proj.weight.T
        h = F.layer_norm(x, (cfg.n_embd,), blk.ln_2.weight, blk.ln_2.bias, cfg.norm_eps)
        x = x + F.gelu(h @ blk.mlp.c_fc.weight.T) @ blk.mlp.c_proj.weight.T
    x = F.layer_norm(x, (cfg.n_embd,), model.transformer.ln_f.weight, model.transformer.ln_f.bias, cfg.norm_eps)
    return (x @ model.lm_head.weight.T)[..., :cfg.vocab_size]


@pytest.mark.parametrize('attn', ['softmax', 'softmax1'])
def test_mask_first_key_equals_a_forward_with_the_mask_written_by_hand(docs_dir, attn):
    model = planted_model(attn=attn)
    idx = torch.randint(0, VOCAB - 1, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(model(idx)[0], masked_forward(model, idx, hide_first=False), atol=1e-4)  # the reference
        with intervene.edited(model, hide_first_key=True):
            hidden = model(idx)[0]
            _, _, trace = model(idx, analysis=True)
    assert torch.allclose(hidden, masked_forward(model, idx), atol=1e-4)
    assert not torch.allclose(hidden, model(idx)[0], atol=1e-2)                  # the mask matters here
    for p in trace['attn']:
        assert p[:, :, 1:, 0].abs().max() == 0 and (p[:, :, 0, 0] > 0).all()
    _, results, _ = run(model, docs_dir, names=('mask_first_key',))
    docs = documents()
    assert results['mask_first_key']['ppl'] == pytest.approx(ppl_of(lambda i: masked_forward(model, i), docs), rel=1e-4)
    assert results['mask_first_key']['first_attn_mass'] == 0
    assert results['none']['first_attn_mass'] > 0


def test_mask_first_key_of_a_sink_token_model_hides_the_first_real_token_not_the_sink(docs_dir):
    torch.manual_seed(0)
    model = GPT(tiny_config(sink_token=True)).eval()
    _, results, _ = run(model, docs_dir, names=('mask_first_key',))
    none, masked = results['none'], results['mask_first_key']
    assert masked['first_attn_mass'] == 0 < none['first_attn_mass']
    assert masked['sink_attn_mass'] > none['sink_attn_mass']          # the sink is still there and takes more


# ----------------------------------------------------------------------------- public models, command line
@pytest.mark.slow   # a public model through transformers
def test_a_public_model_runs_as_our_gpt_with_the_transformers_perplexity(docs_dir, tmp_path, capsys):
    transformers = pytest.importorskip('transformers')
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1, vocab_size=VOCAB, max_position_embeddings=64,
                                   bos_token_id=VOCAB - 2, eos_token_id=VOCAB - 1, pad_token_id=0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(str(tmp_path / 'llama'))
    reference = measure.analyze(runs.load_model(str(tmp_path / 'llama'), block_size=32), docs_dir, None, 3, 'cpu',
                                quiet=True)[0]
    out = tmp_path / 'r' / 'intervene.json'
    intervene.main(['--init_from', str(tmp_path / 'llama'), '--data', docs_dir, '--block_size', '32',
                    '--batch_size', '3', '--json', str(out)])
    text = capsys.readouterr().out
    r = json.loads(out.read_text())
    assert r['k'] == 2 and r['interventions'] == list(intervene.INTERVENTIONS[1:])
    m = r['models'][0]
    assert m['kind'] == 'hf' and m['data']['bos'] == VOCAB - 2 and m['data']['documents'] == reference['data']['documents']
    assert list(m['results']) == list(intervene.INTERVENTIONS)
    for k in ('ppl', 'first_attn_mass', 'sink_rate', 'kurtosis_first'):
        assert m['results']['none'][k] == pytest.approx(reference[k], rel=1e-4), k
    assert len(m['channels']['channels']) == 2 and all(len(c) == 2 for c in m['channels']['random'])
    assert 'mask_first_key' in text and 'massive (> 100 and > 1000 x median) in layers none' in text


@pytest.mark.parametrize('args, message', [
    (['--interventions', 'zero,drop'], "unknown drop; choose from zero, mean, zero_random, mask_first_key"),
    (['--k', '0'], '--k must be >= 1'),
    (['--k', '17'], '--k 17 exceeds the width'),
    (['--sink_eps', '-0.1'], '--sink_eps must be in [0, 1)'),
    (['--max_docs', '-1'], '--max_docs must be >= 0'),
    (['--json', '{tmp}'], 'is a folder, not a file; give the path of a file'),
    (['--ckpt', 'no/such'], '--ckpt no/such: not found'),
    (['--batch_size', '0'], '--batch_size must be >= 1 (documents per forward pass), got 0'),   # was: the default
    (['--batch_size', '-3'], '--batch_size must be >= 1'),
    (['--block_size', '1'], '--block_size must be >= 2'),                                          # was: ppl nan
])
def test_cli_errors_are_one_line(args, message, docs_dir, tmp_path):
    ckpt = write_checkpoint(str(tmp_path / 'run'))
    base = [] if '--ckpt' in args else ['--ckpt', ckpt]
    with pytest.raises(SystemExit) as e:
        intervene.main(base + [a.format(tmp=tmp_path) for a in args] + ['--data', docs_dir])
    assert str(e.value).startswith('intervene.py: error: ') and message in str(e.value) and '\n' not in str(e.value)


def test_cli_on_checkpoints_prints_the_table_and_the_channels(docs_dir, tmp_path, capsys):
    a, b = write_checkpoint(str(tmp_path / 'base')), write_checkpoint(str(tmp_path / 's1'), attn='softmax1', seed=1)
    # a space after a comma and a name given twice change nothing (fileio.comma_list)
    intervene.main(['--ckpt', a, b, '--data', docs_dir, '--k', '1', '--interventions', 'zero, mask_first_key,zero'])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ['Model', 'Intervention', 'PPL', 'ΔPPL']
    assert [line.split()[:2] for line in lines[2:8]] == [['base', 'none'], ['base', 'zero'], ['base', 'mask_first_key'],
                                                         ['s1', 'none'], ['s1', 'zero'], ['s1', 'mask_first_key']]
    assert lines[2].split()[3] == '+0.000' and sum(line.startswith(('base:', 's1:')) for line in lines) == 2


def test_nothing_to_predict_is_one_line_not_a_nan_perplexity(docs_dir, tmp_path):
    """A free prefix of 4 at --block_size 4 leaves no position that does not see its target, and documents of one
    token have nothing to predict: each is a one-line error (both printed `ppl nan` and exited 0)."""
    def error(argv):
        with pytest.raises(SystemExit) as e:
            intervene.main(argv + ['--json', str(tmp_path / 'out' / 'r.json')])
        assert str(e.value).startswith('intervene.py: error: ') and '\n' not in str(e.value)
        return str(e.value)
    free = write_checkpoint(str(tmp_path / 'free'), causal_free_prefix=4)
    assert 'has causal_free_prefix=4' in error(['--ckpt', free, '--data', docs_dir, '--block_size', '4'])
    short = write_docs(str(tmp_path / 'short'), [np.array([3]), np.array([7]), np.array([], dtype=np.int64)])
    message = error(['--ckpt', write_checkpoint(str(tmp_path / 'run')), '--data', short])
    assert 'no document of the 2 measured has a token to predict' in message
    assert not (tmp_path / 'out' / 'r.json').exists()
    # with --block_size 5 the free prefix leaves one prediction (of token 4) per document of five tokens or more
    out = tmp_path / 'five.json'
    intervene.main(['--ckpt', free, '--data', docs_dir, '--block_size', '5', '--interventions', 'zero',
                    '--json', str(out)])
    m = json.loads(out.read_text())['models'][0]
    assert m['data']['predicted_tokens'] == sum(len(d) >= 5 for d in random_docs(n=9, seed=4)) > 0
    assert math.isfinite(m['results']['none']['ppl']) and math.isfinite(m['results']['zero']['ppl'])


def test_layer_ranges():
    assert intervene.layer_ranges([True, True, False, True]) == '1-2, 4'
    assert intervene.layer_ranges([False, False]) == '' and intervene.layer_ranges(np.ones(3, bool)) == '1-3'
