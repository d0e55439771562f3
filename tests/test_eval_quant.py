"""eval_quant.py: quantisers against hand-computed examples, schemes on real layers, outlier sensitivity,
exact restoration, transformers' Conv1D, and the CLI end to end."""
import copy
import json
import math
import os
from dataclasses import asdict

import numpy as np
import pytest
import torch

import analyze
import eval_quant as eq
from conftest import write_dataset
from harness import runs
from model import GPT, GPTConfig


pytestmark = pytest.mark.usefixtures('one_thread')


# ----------------------------------------------------------------------------- quantisers by hand

def test_absmax_codes_scale_and_half_to_even_rounding():
    codes, scale = eq.absmax_codes(torch.tensor([-3.5, 1.0, 0.25, 2.0, 0.75]), bits=4)
    assert scale.item() == 0.5                                     # 3.5 / (2^3 - 1)
    assert codes.tolist() == [-7, 2, 0, 4, 2]                      # 0.5 -> 0 and 1.5 -> 2 (half to even)
    assert eq.absmax(torch.tensor([-3.5, 1.0, 0.25, 2.0, 0.75]), bits=4).tolist() == [-3.5, 1.0, 0.0, 2.0, 1.0]


def test_absmax_8bit_uses_127_levels():
    codes, scale = eq.absmax_codes(torch.tensor([0.5, -1.27, 0.004, 1.0]), bits=8)
    assert scale.item() == pytest.approx(0.01)
    assert codes.tolist() == [50, -127, 0, 100]
    assert eq.absmax(torch.zeros(3)).tolist() == [0, 0, 0]        # an all-zero tensor stays zero


def test_absmax_granularity_per_tensor_per_row_per_column():
    w = torch.tensor([[3.5, -1.75], [0.875, 0.125]])
    assert eq.absmax(w, 4).tolist() == [[3.5, -2.0], [1.0, 0.0]]               # one scale 0.5
    codes, scale = eq.absmax_codes(w, 4, dim=1)                                 # per output channel
    assert scale.flatten().tolist() == [0.5, 0.125] and codes.tolist() == [[7, -4], [7, 1]]
    assert eq.absmax(w, 4, dim=1).tolist() == [[3.5, -2.0], [0.875, 0.125]]
    x = torch.tensor([[[3.5, 0.125], [-1.75, 0.875]]])                         # (B=1, T=2, C=2)
    assert eq.absmax(x, 4, dim=-1).tolist() == [[[3.5, 0.0], [-1.75, 1.0]]]   # per token: scales 0.5, 0.25
    assert eq.absmax(x, 4, dim=(0, 1)).tolist() == [[[3.5, 0.125], [-2.0, 0.875]]]  # per channel: 0.5, 0.125


def test_absmax_valid_mask_excludes_padding_from_the_scale():
    x = torch.tensor([[[1.75, -0.5], [100.0, 3.0]]])
    valid = torch.tensor([[True, False]])
    codes, scale = eq.absmax_codes(x, 4, valid=valid)
    assert scale.item() == 0.25                                    # from 1.75 only
    assert codes.tolist() == [[[7, -2], [7, 7]]]                   # the padding row clamps at the code range


def test_zeropoint_codes_rounded_zero_point_and_clamp():
    x = torch.tensor([-1.875, -0.5, 0.3, 1.875])
    codes, scale, zero = eq.zeropoint_codes(x, bits=4)
    assert scale.item() == 0.25 and zero.item() == 8               # 3.75 / 15; round(7.5) = 8
    assert codes.tolist() == [0, 6, 9, 15]                         # min -> 0; max: round(7.5) + 8 = 16 -> clamped
    assert eq.zeropoint(x, 4).tolist() == [-2.0, -0.5, 0.25, 1.75]


def test_zeropoint_positive_tensor_negative_zero_point_and_constant_slices():
    codes, scale, zero = eq.zeropoint_codes(torch.tensor([1.0, 2.0, 4.0, 2.5]), bits=2)
    assert scale.item() == 1.0 and zero.item() == -1
    assert codes.tolist() == [0, 1, 3, 1]                          # 2.5 -> 2 (half to even) - 1
    assert eq.zeropoint(torch.tensor([1.0, 2.0, 4.0, 2.5]), 2).tolist() == [1.0, 2.0, 4.0, 2.0]
    const = torch.tensor([[5.0, 5.0], [0.0, 0.0], [-3.0, -3.0]])
    assert torch.equal(eq.zeropoint(const, 4, dim=1), const)


def test_zeropoint_per_output_channel():
    w = torch.tensor([[-1.0, 0.0, 0.5, 2.0], [0.0, 0.1, 0.2, 0.3]])
    codes, scale, zero = eq.zeropoint_codes(w, 2, dim=1)
    assert scale.flatten().tolist() == pytest.approx([1.0, 0.1])
    assert zero.flatten().tolist() == [1, 0]
    assert codes.tolist() == [[0, 1, 1, 3], [0, 1, 2, 3]]          # row 0: round(0.5) + 1 = 1
    assert eq.zeropoint(w, 2, dim=1)[0].tolist() == [-1.0, 0.0, 0.0, 2.0]


def test_weight_only_groups_and_scheme_names():
    w = torch.tensor([[1.0, 2.0, 0.25, 0.5]])
    f, group = eq.parse_scheme('absmax2g2')
    assert group == 2
    f(w)
    assert w.tolist() == [[0.0, 2.0, 0.0, 0.5]]                    # groups [1, 2] and [0.25, 0.5]: scale = max
    w = torch.tensor([[1.0, 2.0, 0.25, 0.5]])
    eq.parse_scheme('absmax2')[0](w)
    assert w.tolist() == [[0.0, 2.0, 0.0, 0.0]]                    # one scale for the row
    w = torch.randn(6, 8)
    expected = eq.zeropoint(w.reshape(6, 2, 4), 3, dim=-1).reshape(6, 8)
    eq.parse_scheme('zeropoint3g4')[0](w)
    assert torch.equal(w, expected)


@pytest.mark.parametrize('name, message', [('int8', 'unknown scheme'), ('zeropoint9', 'bit width 9'),
                                           ('absmax1', 'bit width 1'), ('absmax4g0', 'group size')])
def test_bad_scheme_names(name, message):
    with pytest.raises(ValueError, match=message):
        eq.parse_scheme(name)


# ----------------------------------------------------------------------------- schemes on layers

def run_layer(layer, scheme, x, valid=None):
    layers = [('layer', layer)]
    with eq.quantised(layers, eq.backup_weights(layer, layers), eq.parse_scheme(scheme)[0], {'valid': valid}):
        with torch.no_grad():
            return layer(x)


def scheme_definitions(x, w, b):
    """Scheme name -> a Linear layer's output under it, written from the scheme's definition (docs/quantisation.md)
    with the quantisers checked above: every scheme of eval_quant.ACTIVATION_SCHEMES and, at 4 bits and groups of 4,
    each weight-only method of eval_quant.WEIGHT_METHODS (one per output channel without a group)."""
    per_tensor = lambda t: eq.absmax(t, 8, dim=None)
    return {
        'coarse': per_tensor(per_tensor(x) @ per_tensor(w).T + b),
        'moderate': per_tensor(x) @ per_tensor(w).T + b,
        'fine': eq.absmax(x, 8, dim=-1) @ eq.absmax(w, 8, dim=1).T + b,
        'fine_channel': eq.absmax(x, 8, dim=(0, 1)) @ eq.absmax(w, 8, dim=1).T + b,
        'zeropoint4': x @ eq.zeropoint(w, 4, dim=1).T + b,
        'absmax4': x @ eq.absmax(w, 4, dim=1).T + b,
        'zeropoint4g4': x @ eq.zeropoint(w.reshape(4, 2, 4), 4, dim=-1).reshape(4, 8).T + b,
        'absmax4g4': x @ eq.absmax(w.reshape(4, 2, 4), 4, dim=-1).reshape(4, 8).T + b,
    }


SCHEMES = [*eq.ACTIVATION_SCHEMES, *(f'{m}4' for m in eq.WEIGHT_METHODS), *(f'{m}4g4' for m in eq.WEIGHT_METHODS)]


@pytest.mark.parametrize('scheme', SCHEMES)
def test_every_scheme_on_a_linear_layer_matches_its_definition(scheme):
    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 4)
    w, b = layer.weight.detach().clone(), layer.bias.detach().clone()
    x = torch.randn(2, 3, 8)
    expect = scheme_definitions(x, w, b)
    if scheme not in expect:
        pytest.fail(f"the scheme {scheme} (eval_quant.py) has no definition in scheme_definitions in "
                    f"tests/test_eval_quant.py: write it there")
    assert torch.allclose(run_layer(layer, scheme, x), expect[scheme], atol=1e-6), scheme
    assert torch.equal(layer.weight, w)


def test_schemes_on_a_linear_layer_take_shared_scales_from_real_tokens():
    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 4)
    w, b = layer.weight.detach().clone(), layer.bias.detach().clone()
    x = torch.randn(2, 3, 8)
    x[1, 2] *= 50                                                # the last token of sequence 2 is padding
    valid = torch.tensor([[True, True, True], [True, True, False]])
    xr = x * valid[..., None]                                    # the rows that may set a shared scale
    per_tensor = lambda t: eq.absmax(t, 8, dim=None)
    # with a padding row, shared activation scales come from the real tokens only
    s = xr.abs().amax() / 127
    assert torch.allclose(run_layer(layer, 'moderate', x, valid)[0], (torch.round(x[0] / s) * s) @ per_tensor(w).T + b,
                          atol=1e-6)
    s = xr.abs().amax(dim=(0, 1)) / 127                          # fine_channel: one scale per input feature
    assert torch.allclose(run_layer(layer, 'fine_channel', x, valid)[0],
                          (torch.round(x[0] / s) * s) @ eq.absmax(w, 8, dim=1).T + b, atol=1e-6)
    assert torch.equal(layer.weight, w) and not layer._forward_hooks and not layer._forward_pre_hooks


BLOCK_LINEARS = ('attn.c_attn', 'attn.c_proj', 'mlp.c_fc', 'mlp.c_proj')


def tiny_gpt(**kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(**dict(dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64), **kw))).eval()


@pytest.mark.parametrize('kw', [{}, dict(mlp='swiglu', norm='rmsnorm', bias=False, pos_emb='rotary')])
@pytest.mark.parametrize('lm_head', [False, True])
def test_only_linear_weights_change_and_are_restored_exactly(kw, lm_head):
    model = tiny_gpt(**kw)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        logits = model(x)[0]
    layers = eq.quantisable_layers(model, lm_head)
    names = {n for n, _ in layers}
    expected = {f'transformer.h.{i}.{n}' for i in range(2) for n in BLOCK_LINEARS}
    expected |= {f'transformer.h.{i}.mlp.c_gate' for i in range(2)} if kw else set()
    assert names == expected | ({'lm_head'} if lm_head else set())
    backup = eq.backup_weights(model, layers)
    copied = sum(t.numel() for t in backup.values() if not isinstance(t, torch.nn.Parameter))
    assert copied == sum(model.get_parameter(f'{n}.weight').numel() for n in expected)   # one copy, head excluded
    with eq.quantised(layers, backup, eq.parse_scheme('coarse')[0]):
        inside = model.state_dict()
        for k, v in before.items():
            quantised_weight = k.endswith('.weight') and k[:-len('.weight')] in names
            assert torch.equal(inside[k], v) != quantised_weight, k                # embeddings, norms, biases exact
        assert torch.equal(model.transformer.wte.weight, before['transformer.wte.weight'])
        assert (model.lm_head.weight is model.transformer.wte.weight) != lm_head    # a quantised head is untied
        assert lm_head != torch.equal(model.lm_head.weight, before['lm_head.weight'])
        with torch.no_grad():
            assert not torch.equal(model(x)[0], logits)
    after = model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())
    assert model.lm_head.weight is model.transformer.wte.weight
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    with torch.no_grad():
        assert torch.equal(model(x)[0], logits)


# ----------------------------------------------------------------------------- perplexity under quantisation

@pytest.fixture(scope='module')
def data(tmp_path_factory):
    return write_dataset(str(tmp_path_factory.mktemp('quant') / 'bigram'))   # eot 63 splits ~120 val documents


@pytest.fixture(scope='module')
def trained(data):
    """A tiny GPT fitted to the bigram data (~1 s)."""
    model = tiny_gpt().train()
    tokens = torch.from_numpy(np.fromfile(os.path.join(data, 'train.bin'), dtype=np.uint16).astype(np.int64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(60):
        start = torch.randint(0, len(tokens) - 17, (16,), generator=g)
        x = torch.stack([tokens[s:s + 17] for s in start.tolist()])
        loss = model(x[:, :-1], x[:, 1:])[1]
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def plant_outlier_channel(model, channel, factor):
    """Function-preserving: the norm gain/bias of `channel` before every c_attn and c_fc is multiplied by
    factor and the matching input column of the Linear divided by it. factor >> 1 makes an outlier input
    activation channel (as LayerNorm gains do in trained LLMs); factor << 1 an outlier weight column."""
    with torch.no_grad():
        for block in model.transformer.h:
            for norm, linear in ((block.ln_1, block.attn.c_attn), (block.ln_2, block.mlp.c_fc)):
                norm.weight[channel] *= factor
                norm.bias[channel] *= factor
                linear.weight[:, channel] /= factor
    return model


def quant_ppl(model, data, schemes, name='tiny'):
    lm = runs.LoadedModel(name, model, 'ours', None, 16, 64, dict(n_params=model.num_params()))
    result = eq.evaluate(lm, {s: eq.parse_scheme(s) for s in schemes}, data, 60, 8, 'cpu')
    return result['ppl']


def test_fine_is_nearly_lossless_and_planted_outliers_break_coarse_and_4bit(trained, data):
    schemes = ('coarse', 'moderate', 'fine', 'fine_channel', 'zeropoint4')
    before = {k: v.clone() for k, v in trained.state_dict().items()}
    clean = quant_ppl(trained, data, schemes)
    assert all(torch.equal(trained.state_dict()[k], v) for k, v in before.items())     # restored bit for bit
    assert clean['full'] < 12                                      # it learnt something (uniform: 64)
    for s in schemes:                                              # a well-behaved model survives every scheme
        assert abs(clean[s] - clean['full']) < (0.005 if s.startswith('fine') else 0.03) * clean['full'], s
    acts = quant_ppl(plant_outlier_channel(copy.deepcopy(trained), 3, 300.0), data, schemes)
    assert acts['full'] == pytest.approx(clean['full'], rel=1e-4)  # same function in full precision
    assert acts['coarse'] > 3 * acts['full'] and acts['moderate'] > 3 * acts['full']
    assert acts['fine'] > 1.2 * acts['full']                       # a per-token scale still sees the outlier
    assert acts['fine_channel'] < 1.05 * acts['full']              # a per-channel scale isolates it
    weights = quant_ppl(plant_outlier_channel(copy.deepcopy(trained), 3, 1 / 300), data, schemes)
    assert weights['full'] == pytest.approx(clean['full'], rel=1e-4)
    assert weights['zeropoint4'] > 1.5 * weights['full'] and weights['coarse'] > 3 * weights['full']


def test_full_precision_layers_are_left_out_and_show_where_the_penalty_comes_from(trained, data):
    """The planted outlier channel enters c_attn and c_fc: with those two left in full precision coarse int8 costs what
    it costs the clean model (the other layers' inputs are unchanged), and the result names the layers it quantised."""
    outlier = plant_outlier_channel(copy.deepcopy(trained), 3, 300.0)
    lm = runs.LoadedModel('tiny', outlier, 'ours', None, 16, 64, dict(n_params=outlier.num_params()))
    schemes = {'coarse': eq.parse_scheme('coarse')}
    every = eq.evaluate(lm, schemes, data, 60, 8, 'cpu')
    kept = eq.evaluate(lm, schemes, data, 60, 8, 'cpu', full_precision=('*.c_attn', '*.c_fc'))
    clean = quant_ppl(trained, data, ['coarse'])
    assert every['ppl']['coarse'] > 3 * every['ppl']['full']
    assert kept['ppl']['full'] == every['ppl']['full']
    assert abs(kept['ppl']['coarse'] - kept['ppl']['full']) < 0.03 * kept['ppl']['full']
    assert abs(kept['delta']['coarse'] - (clean['coarse'] - clean['full'])) < 0.03 * clean['full']
    assert kept['quantised_layers'] == [n for n in every['quantised_layers'] if n.endswith('c_proj')]
    assert kept['full_precision'] == ['*.c_attn', '*.c_fc'] and every['full_precision'] == []


@pytest.mark.slow   # a public model through transformers
def test_conv1d_layers_of_transformers_gpt2(data):
    transformers = pytest.importorskip('transformers')
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    names = [n for n, _ in eq.quantisable_layers(model)]
    assert names == [f'transformer.h.{i}.{n}' for i in range(2) for n in BLOCK_LINEARS]     # Conv1D
    assert [n for n, _ in eq.quantisable_layers(model, lm_head=True)] == names + ['lm_head']
    conv = model.transformer.h[0].mlp.c_fc                         # weight (in 32, out 128), y = x W + b
    w, b = conv.weight.detach().clone(), conv.bias.detach().clone()
    x = torch.randn(2, 5, 32)
    per_out = eq.zeropoint(w.T, 4, dim=1).T                        # one scale per output channel = per column
    assert torch.allclose(run_layer(conv, 'zeropoint4', x), x @ per_out + b, atol=1e-6)
    assert not torch.allclose(per_out, eq.zeropoint(w, 4, dim=1))
    fine = eq.absmax(x, 8, dim=-1) @ eq.absmax(w.T, 8, dim=1).T + b
    assert torch.allclose(run_layer(conv, 'fine', x), fine, atol=1e-6)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    lm = runs.wrap_hf(model, 'tiny-gpt2', 16)
    schemes = {s: eq.parse_scheme(s) for s in ('coarse', 'zeropoint4')}
    result = eq.evaluate(lm, schemes, data, 20, 8, 'cpu', lm_head=True)
    assert all(math.isfinite(v) for v in result['ppl'].values()) and len(result['quantised_layers']) == 9
    assert result['ppl']['zeropoint4'] != result['ppl']['full']
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
    assert model.lm_head.weight is model.transformer.wte.weight


# ----------------------------------------------------------------------------- command line

def save_checkpoint(model, path, optimizer='adamw'):
    torch.save({'model': model.state_dict(), 'model_args': asdict(model.config), 'iter_num': 60,
                'config': {'optimizer': optimizer, 'dataset': 'bigram'}}, path)
    return path


def test_cli_table_json_and_markdown(trained, data, tmp_path, capsys):
    clean = save_checkpoint(trained, str(tmp_path / 'clean.pt'))
    outlier = save_checkpoint(plant_outlier_channel(copy.deepcopy(trained), 3, 300.0), str(tmp_path / 'outlier.pt'))
    out = str(tmp_path / 'quant.json')
    eq.main(['--ckpt', clean, outlier, '--data', data, '--max_docs', '40', '--batch_size', '16',
             '--schemes', 'coarse,fine,zeropoint4,absmax3g8', '--json', out])
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert lines[0].split() == ['Model', '#Params', 'Attention', 'Optimizer', 'full', 'coarse', 'Δ', 'fine', 'Δ',
                                'zeropoint4', 'Δ', 'absmax3g8', 'Δ']
    assert [line.split()[0] for line in lines[2:4]] == ['clean', 'outlier']
    assert lines[4].startswith(f'{os.path.relpath(data)} val: 40 documents')
    assert 'docs/s' in captured.err
    run = json.load(open(out))
    assert run['format'] == 1 and run['schemes'] == ['coarse', 'fine', 'zeropoint4', 'absmax3g8'] and not run['lm_head']
    a, b = run['models']
    assert a['label'] == 'clean' and a['kind'] == 'ours' and a['model'] == os.path.relpath(clean)
    assert set(a) >= {'ppl', 'delta', 'seconds', 'config', 'data', 'quantised_layers'}
    assert set(a['ppl']) == {'full', 'coarse', 'fine', 'zeropoint4', 'absmax3g8'}
    assert a['delta']['fine'] == pytest.approx(a['ppl']['fine'] - a['ppl']['full'])
    assert a['data']['documents'] == 40 and a['data']['predicted_tokens'] > 0 and a['data']['batch_size'] == 16
    assert b['delta']['coarse'] > 10 * a['delta']['coarse'] + 1
    row = lines[2].split()
    assert row[4] == f"{a['ppl']['full']:.2f}" and row[6] == f"{a['delta']['coarse']:.2f}"
    # a second run (other schemes) rendered side by side
    out2 = str(tmp_path / 'quant2.json')
    eq.main(['--ckpt', clean, '--data', data, '--max_docs', '20', '--schemes', 'moderate', '--json', out2])
    capsys.readouterr()
    eq.main(['--table', out, out2])
    md = capsys.readouterr().out.strip().splitlines()
    assert md[0].startswith('| Model | #Params |') and '| coarse | Δ |' in md[0]
    assert md[0].endswith('| moderate | Δ |')                    # the union of both runs' schemes
    assert md[1].startswith('|---|') and len(md[2:5]) == 3 and all(r.startswith('| ') for r in md[2:5])
    moderate = json.load(open(out2))['models'][0]['ppl']['moderate']
    assert md[4].split(' | ')[-4:-2] == ['-', '-'] and f"{moderate:.2f}" in md[4]     # absmax3g8 not run
    assert any(out2 in line and '20 documents' in line for line in md)


@pytest.mark.parametrize('args, message', [
    (['--ckpt', 'nowhere/ckpt.pt'], '--ckpt nowhere/ckpt.pt: not found, no such file or folder'),
    (['--schemes', 'fine,int4'], "unknown scheme 'int4'"),
    (['--schemes', 'zeropoint12'], 'bit width 12 is not supported'),
    (['--schemes', 'absmax4g5'], 'group size 5 does not divide'),
    (['--data', 'no/such/dir'], 'is not a prepared dataset'),
    (['--full_precision', '*.mlp.c_fc,*.wte'], "--full_precision *.wte matches none of the quantisable layers"),
    (['--full_precision', 'transformer.*'], 'leaves no layer to quantise'),
    (['--table', 'missing.json'], 'no such file'),
    (['--table', os.path.join(os.path.dirname(__file__), 'conftest.py')], 'is not an eval_quant.py JSON file'),
    (['--json', os.path.join(os.path.dirname(__file__), 'conftest.py', 'q.json')], 'conftest.py is a file, not a folder'),
    (['--json', os.path.dirname(__file__)], 'is a folder, not a file; give the path of a file'),
    pytest.param(['--device', 'cuda'], "device='cuda' but no CUDA GPU is available",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason='checks the error without a GPU')),
])
def test_cli_errors_are_one_line(trained, data, tmp_path, args, message, monkeypatch):
    ckpt = save_checkpoint(trained, str(tmp_path / 'ckpt.pt'))
    base = ['--ckpt', ckpt, '--data', data, '--max_docs', '4']
    monkeypatch.setattr(eq, 'perplexity', lambda *a: pytest.fail('a refused command evaluated a model'))
    with pytest.raises(SystemExit) as e:
        eq.main(base + args)
    assert str(e.value).startswith('eval_quant.py: error: ') and message in str(e.value)
    assert '\n' not in str(e.value)


def test_json_folder_is_created_before_the_model_runs(trained, data, tmp_path):
    ckpt = save_checkpoint(trained, str(tmp_path / 'ckpt.pt'))
    path = tmp_path / 'new' / 'deeper' / 'q.json'
    eq.main(['--ckpt', ckpt, '--data', data, '--max_docs', '4', '--schemes', 'moderate', '--json', str(path)])
    assert json.loads(path.read_text())['models'][0]['model'] == os.path.relpath(ckpt)


def test_a_temporary_name_beside_json_that_is_a_link_is_not_written_through(trained, data, tmp_path):
    """Data lost, case 2: q.json.tmp, a link to a user's file beside --json q.json, got the results (and was renamed
    onto q.json). Now the results go to a new name: the user's file and the link stay as they were."""
    ckpt = save_checkpoint(trained, str(tmp_path / 'ckpt.pt'))
    (tmp_path / 'mine.txt').write_text('my notes')
    (tmp_path / 'q.json.tmp').symlink_to(tmp_path / 'mine.txt')
    eq.main(['--ckpt', ckpt, '--data', data, '--max_docs', '4', '--schemes', 'moderate', '--json',
             str(tmp_path / 'q.json')])
    assert (tmp_path / 'mine.txt').read_text() == 'my notes' and (tmp_path / 'q.json.tmp').is_symlink()
    assert not (tmp_path / 'q.json').is_symlink() and json.loads((tmp_path / 'q.json').read_text())['format'] == 1
    assert sorted(os.listdir(tmp_path)) == ['ckpt.pt', 'mine.txt', 'q.json', 'q.json.tmp']
