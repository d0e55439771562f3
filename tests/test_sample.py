"""sample.py: generation with the KV cache against nanoGPT's generation by repeated full forward passes, and its
command line on a checkpoint that train.py wrote (tokenizer found through the checkpoint)."""
import os
import shutil
import subprocess
import sys

import pytest
import torch

import analyze
import prepare_c4
import sample
import train
from conftest import ROOT
from model import GPT
from test_kv_cache import sharp
from test_model import MODEL_VARIANTS, tiny
from test_train import config
from harness import dataset, runs, tokenizer as tokenizer_lib

pytestmark = pytest.mark.usefixtures('one_thread')

TEXTS = ["The cache holds the keys and values of every token seen so far.",
         "Greedy decoding picks the most likely token at every step; sampling draws one.",
         "A sink token soaks up attention that has nowhere else to go."] * 4


def by_full_forwards(m, idx, n, temperature=0.0, generator=None):
    """nanoGPT's generate: a full forward pass over the context, cut to block_size, per token (temperature 0: argmax)."""
    for _ in range(n):
        logits = m(idx[:, -m.config.block_size:])[0]
        idx = torch.cat((idx, sample.next_token(logits[:, -1], temperature, None, generator)), dim=1)
    return idx


@pytest.mark.parametrize('variant,pos_emb', [('softmax', 'absolute'), ('softmax1', 'rotary'), ('attn_bias', 'none'),
                                             ('sink_token', 'absolute'), ('sigmoid', 'rotary'), ('gated', 'none')])
def test_generation_with_the_cache_equals_generation_by_full_forwards(variant, pos_emb, tmp_path):
    """From a checkpoint file; 20 new tokens after 3 with block_size 8, so the context is cut and the cache refilled.
    Greedy, and sampled with the same seed (random models soon repeat one token greedily; samples do not)."""
    m = sharp(GPT(tiny(pos_emb=pos_emb, block_size=8, n_kv_head=1, **MODEL_VARIANTS[variant])), seed=3)
    path = tmp_path / 'ckpt.pt'
    torch.save({'model': m.state_dict(), 'model_args': dict(m.config.__dict__)}, path)
    m, _ = GPT.from_checkpoint(str(path))
    idx = torch.randint(0, 50, (2, 3), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.equal(sample.generate(m, idx, 20, temperature=0), by_full_forwards(m, idx, 20))
        got = sample.generate(m, idx, 20, temperature=1.0, top_k=None, generator=torch.Generator().manual_seed(6))
        expected = by_full_forwards(m, idx, 20, 1.0, torch.Generator().manual_seed(6))
    assert torch.equal(got, expected)
    assert len(set(got[0, 3:].tolist())) > 5


def test_sampling_is_seeded_and_top_k_1_is_greedy():
    m = sharp(GPT(tiny(pos_emb='rotary', attn='softmax1')), seed=5)
    idx = torch.zeros(3, 1, dtype=torch.long)
    draw = lambda seed, **kw: sample.generate(m, idx, 10, generator=torch.Generator().manual_seed(seed), **kw)  # noqa
    assert torch.equal(draw(1), draw(1)) and not torch.equal(draw(1), draw(2))
    assert torch.equal(draw(1, top_k=1), sample.generate(m, idx, 10, temperature=0))


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    """A 6-step train.py run on text in the bytes tokenizer: its checkpoint records that tokenizer."""
    root = tmp_path_factory.mktemp('sample')
    data = dataset.prepare(root / 'data', tokenizer_lib.load_tokenizer('bytes'), {'test': 'sample.py'}, 'test',
                              'TEXTS of test_sample.py', True, lambda split: TEXTS,
                              {'train': (None, None), 'val': (None, None)})
    train.train(config(str(data), str(root / 'out'), '--block_size=16', '--n_layer=1'))
    return str(root / 'out')


def run(*args):
    return subprocess.run([sys.executable, 'sample.py', *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.slow   # sample.py as a subprocess
def test_command_line_samples_from_a_train_py_checkpoint(trained, tmp_path):
    lm = runs.load_gpt(trained)
    assert lm.tokenizer['name'] == 'bytes'
    prompt = tmp_path / 'prompt.txt'
    prompt.write_text('The cache')
    r = run('--ckpt', trained, '--start', f'FILE:{prompt}', '--num_samples', '2', '--max_new_tokens', '20',
            '--seed', '3', '--device', 'cpu')
    assert r.returncode == 0, r.stderr
    samples = r.stdout.split('-' * 40 + '\n')
    assert len(samples) == 3 and samples[-1] == ''
    assert all(s.startswith('The cache') for s in samples[:2])
    assert '2 x 20 tokens' in r.stderr
    greedy = run('--ckpt', trained, '--start', 'The cache', '--max_new_tokens', '20', '--temperature', '0')
    ids = torch.tensor([list(b'The cache')])
    expected = by_full_forwards(lm.model, ids, 20)[0].tolist()
    assert greedy.stdout.split('\n' + '-' * 40)[0] == bytes(expected).decode('utf-8', errors='replace')


@pytest.mark.slow   # sample.py as a subprocess
@pytest.mark.parametrize('args,message', [
    (['--temperature', '-1'], '--temperature must be'),
    (['--start', 'FILE:/no/such/prompt.txt'], 'cannot read the file'),
    (['--num_samples', '0'], '--num_samples must be >= 1'),
    (['--device', 'cuda:7'], 'cuda:7'),
])
def test_command_line_errors_are_one_line(trained, args, message):
    r = run('--ckpt', trained, *args)
    assert r.returncode != 0 and message in r.stderr
    assert r.stderr.startswith('sample.py: error:') and r.stderr.count('\n') == 1


@pytest.mark.parametrize('temperature', ['0.8', '0'])
def test_a_model_with_non_finite_logits_is_one_line(trained, tmp_path, temperature, capsys):
    """NaN weights: a draw would raise inside torch.multinomial, greedy decoding would pick a NaN's index and print
    noise; sample.py says so in one line, with nothing printed."""
    broken = tmp_path / 'nan'
    shutil.copytree(trained, broken)
    c = torch.load(broken / 'ckpt.pt', weights_only=False)
    for w in c['model'].values():
        if w.is_floating_point():
            w.fill_(float('nan'))
    torch.save(c, broken / 'ckpt.pt')
    with pytest.raises(SystemExit) as e:
        sample.main(['--ckpt', str(broken), '--start', 'The', '--max_new_tokens', '3', '--temperature', temperature])
    text = str(e.value)
    assert text.startswith('sample.py: error: ') and '\n' not in text and 'NaN or Inf' in text, text
    assert 'weights hold NaN or Inf' in text and capsys.readouterr().out == ''


@pytest.mark.slow   # sample.py as a subprocess
def test_missing_checkpoint_is_one_line():
    r = run('--ckpt', '/no/such/run')
    assert r.returncode != 0 and r.stderr.startswith('sample.py: error: --ckpt /no/such/run: not found')
