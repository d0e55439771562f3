"""export_hf.py: tiny random GPT-2-style and Llama-style models of ours -> a Hugging Face folder ->
AutoModelForCausalLM.from_pretrained gives the same logits; the tokenizer it writes gives the data's ids (tiktoken's
on the same ranks); every model a stock architecture cannot compute is refused in one line, leaving nothing."""
import base64
import hashlib
import os

import pytest
import tiktoken
import torch

import export_hf
import prepare_c4
from harness import tokenizer as tokenizer_lib
from model import GPT, GPTConfig

transformers = pytest.importorskip('transformers')
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures('one_thread')]   # slow: export to transformers, its models loaded back

TEXTS = ["the thing in the evening is interesting", "  Theirs: 12 x 123, then 1212!\n\nnew <|endoftext|> line",
         "naïve café — 日本語 🙂", "there  are   spaces\tand tabs ending with spaces   "]
GPT2_STYLE = dict(norm='layernorm', bias=True, pos_emb='absolute')
LLAMA_STYLE = dict(norm='rmsnorm', bias=False, pos_emb='rotary', mlp='swiglu')


def write_checkpoint(path, tokenizer='bytes', bos=None, seed=0, **kw):
    """A train.py-style checkpoint of a tiny model whose every weight is random (std 0.2, so each part shows in the
    logits), recording the tokenizer of its data. Returns (path, model)."""
    torch.manual_seed(seed)
    record = tokenizer_lib.load_tokenizer(tokenizer).record()
    cfg = GPTConfig(**dict(n_layer=2, n_head=4, n_embd=32, block_size=24, vocab_size=record['vocab_size']) | kw)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    torch.save({'model': model.state_dict(), 'model_args': cfg.__dict__.copy(), 'iter_num': 0, 'config': {},
                'tokenizer': record, 'bos': bos}, path)
    return str(path), model


def round_trip(tmp_path, arch, extra=(), **kw):
    """Export a random checkpoint to tmp_path/hf and compare the logits; tmp_path then holds ckpt.pt, hf and the
    names in extra (nothing the export left behind)."""
    extra = list(extra) + [name for name in os.listdir(tmp_path) if name not in ('ckpt.pt', 'hf')]
    ckpt, model = write_checkpoint(tmp_path / 'ckpt.pt', **kw)
    out = str(tmp_path / 'hf')
    export_hf.main(['--ckpt', ckpt, '--out', out])
    hf = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert type(hf).__name__ == arch and sorted(os.listdir(tmp_path)) == sorted(['ckpt.pt', 'hf'] + extra)
    idx = torch.randint(0, model.config.vocab_size, (3, model.config.block_size), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(idx)[0], hf(idx, use_cache=False).logits
    assert theirs.shape == ours.shape and ours.abs().max() > 0.5
    assert (ours - theirs).abs().max() <= 1e-5
    return out, hf


@pytest.mark.parametrize('mlp,tie', [('gelu', True), ('gelu_tanh', False)])
def test_gpt2_style_model_round_trips_through_transformers(tmp_path, mlp, tie):
    out, hf = round_trip(tmp_path, 'GPT2LMHeadModel', mlp=mlp, tie_embeddings=tie, **GPT2_STYLE)
    assert hf.config.activation_function == {'gelu': 'gelu', 'gelu_tanh': 'gelu_pytorch_tanh'}[mlp]
    assert hf.config.tie_word_embeddings is tie and hf.config.n_positions == 24 and hf.config.vocab_size == 257


@pytest.mark.parametrize('bias,kv,tie', [(False, 2, True), (True, 0, False)])
def test_llama_style_model_round_trips_through_transformers(tmp_path, bias, kv, tie):
    out, hf = round_trip(tmp_path, 'LlamaForCausalLM', **dict(LLAMA_STYLE, bias=bias), n_kv_head=kv, tie_embeddings=tie,
                         rope_base=500.0, norm_eps=1e-6, mlp_hidden=48, bos=256)
    c = hf.config
    assert (c.num_key_value_heads, c.attention_bias, c.mlp_bias, c.intermediate_size) == (kv or 4, bias, bias, 48)
    assert c.rope_parameters['rope_theta'] == 500.0 and c.rms_norm_eps == 1e-6
    assert (c.bos_token_id, c.eos_token_id) == (256, 256)      # the checkpoint's BOS and the data's eot


def test_bytes_tokenizer_is_written_as_utf8_bytes_and_eot(tmp_path):
    out, _ = round_trip(tmp_path, 'GPT2LMHeadModel', **GPT2_STYLE)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    for text in TEXTS:
        assert tok.encode(text, add_special_tokens=False, split_special_tokens=True) == list(text.encode('utf-8'))
        assert tok.decode(list(text.encode('utf-8'))) == text
    assert tok.convert_tokens_to_ids('<|endoftext|>') == 256 == tok.eos_token_id


def test_tiktoken_vocabulary_gives_tiktokens_ids(tmp_path):
    ranks = {bytes([b]): b for b in range(256)}
    for merge in (b'th', b'the', b' the', b'in', b'ing', b' in', b'er', b'en', b' a', b'12', b' 1'):
        ranks[merge] = len(ranks)
    path = tmp_path / 'tiny.tiktoken'
    path.write_bytes(b''.join(base64.b64encode(t) + b' ' + str(r).encode() + b'\n' for t, r in ranks.items()))
    enc = tiktoken.Encoding('tiny', pat_str=tokenizer_lib.GPT2_PAT, mergeable_ranks=ranks,
                            special_tokens={'<|endoftext|>': len(ranks)})
    out, _ = round_trip(tmp_path, 'LlamaForCausalLM', tokenizer=str(path), **LLAMA_STYLE)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    for text in TEXTS + [tokenizer_lib.PROBE_TEXT]:
        assert tok.encode(text, add_special_tokens=False, split_special_tokens=True) == enc.encode_ordinary(text)
    assert tok.eos_token_id == len(ranks)


def test_gpt2_tokenizer_gives_gpt2_ids(tmp_path, gpt2_ranks):
    ckpt, _ = write_checkpoint(tmp_path / 'ckpt.pt', tokenizer='gpt2', n_embd=16, **GPT2_STYLE)
    export_hf.main(['--ckpt', ckpt, '--out', str(tmp_path / 'hf')])
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path / 'hf'))
    ours = tokenizer_lib.load_tokenizer('gpt2')
    for text in TEXTS + [tokenizer_lib.PROBE_TEXT]:
        assert tok.encode(text, add_special_tokens=False, split_special_tokens=True) == list(ours.encode(text))
    assert tok.encode('Hello world') == [15496, 995] and tok.eos_token_id == 50256


@pytest.mark.parametrize('kw,named', [
    (dict(attn='softmax1'), "attn='softmax1'"),
    (dict(attn_bias=True), 'attn_bias=True'),
    (dict(attn='clipped'), "attn='clipped'"),
    (dict(attn='gated'), "attn='gated'"),
    (dict(attn='sigmoid'), "attn='sigmoid'"),
    (dict(sink_token=True), 'sink_token=True'),
    (dict(causal_free_prefix=4), 'causal_free_prefix=4'),
    (dict(norm='rmsnorm_single', bias=False), "norm='rmsnorm_single'"),    # the paper's GPT-2
    (dict(pos_emb='none'), "pos_emb='none'"),
    (dict(bias=False), 'bias=False'),                                       # GPT-2 always has biases
    (dict(n_kv_head=2), 'n_kv_head=2'),                                     # GPT-2 has no grouped-query attention
    (dict(pos_emb='rotary'), "norm='layernorm'"),                          # LayerNorm with rotary: neither
    (dict(LLAMA_STYLE, norm='rmsnorm_single'), "norm='rmsnorm_single'"),
    (dict(LLAMA_STYLE, attn='softmax1'), "attn='softmax1'"),
])
def test_what_no_stock_architecture_computes_is_refused_in_one_line(tmp_path, capsys, kw, named):
    ckpt, _ = write_checkpoint(tmp_path / 'ckpt.pt', **kw)
    with pytest.raises(SystemExit) as e:
        export_hf.main(['--ckpt', ckpt, '--out', str(tmp_path / 'hf')])
    message = str(e.value.code)
    assert message.startswith('export_hf.py: error: ') and '\n' not in message
    assert named in message and 'trust_remote_code' in message and 'does not compute' in message
    assert os.listdir(tmp_path) == ['ckpt.pt']


def test_an_existing_folder_needs_force(tmp_path, capsys):
    ckpt, _ = write_checkpoint(tmp_path / 'ckpt.pt', **GPT2_STYLE)
    (tmp_path / 'hf').mkdir()
    (tmp_path / 'hf' / 'notes.txt').write_text('keep')
    with pytest.raises(SystemExit) as e:
        export_hf.main(['--ckpt', ckpt, '--out', str(tmp_path / 'hf')])
    assert '--force' in str(e.value.code) and (tmp_path / 'hf' / 'notes.txt').exists()
    with pytest.raises(SystemExit) as e:   # --force replaces an earlier export only, not a folder of a user's
        export_hf.main(['--ckpt', ckpt, '--out', str(tmp_path / 'hf'), '--force'])
    assert 'not written by export_hf.py' in str(e.value.code) and (tmp_path / 'hf' / 'notes.txt').read_text() == 'keep'
    (tmp_path / 'hf' / 'notes.txt').unlink()
    export_hf.main(['--ckpt', ckpt, '--out', str(tmp_path / 'hf')])      # an empty folder is written into
    assert 'wrote' in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        export_hf.main(['--ckpt', str(tmp_path / 'missing.pt'), '--out', str(tmp_path / 'x')])
    assert 'not found' in str(e.value.code)


def test_a_models_own_tokenizer_is_saved_with_the_export(tmp_path):
    from test_public_models import tiny_ranks, write_hf_tokenizer
    folder = write_hf_tokenizer(tmp_path / 'tokenizer', tiny_ranks())
    out, _ = round_trip(tmp_path, 'LlamaForCausalLM', tokenizer=f'hf:{folder}', **LLAMA_STYLE)
    original, written = (transformers.AutoTokenizer.from_pretrained(str(f)) for f in (folder, out))
    for text in TEXTS:
        assert written.encode(text) == original.encode(text)


# ----------------------------------------------------------------------------- what the user has is kept
def write_run(folder):
    """A run folder as train.py leaves it: ckpt.pt (an exportable model), best.pt and log.jsonl; {name: bytes}."""
    os.makedirs(folder)
    write_checkpoint(os.path.join(folder, 'ckpt.pt'), **GPT2_STYLE)
    with open(os.path.join(folder, 'best.pt'), 'wb') as f:
        f.write(open(os.path.join(folder, 'ckpt.pt'), 'rb').read())
    with open(os.path.join(folder, 'log.jsonl'), 'w') as f:
        f.write('{"event": "eval", "iter": 0}\n')
    return {name: open(os.path.join(folder, name), 'rb').read() for name in sorted(os.listdir(folder))}


def one_line_error(argv):
    with pytest.raises(SystemExit) as e:
        export_hf.main(argv)
    message = str(e.value.code)
    assert message.startswith('export_hf.py: error: ') and '\n' not in message
    return message


@pytest.mark.parametrize('ckpt,out,named', [
    ('run', 'run', "is the checkpoint's folder"),
    ('run/ckpt.pt', 'run', "is the checkpoint's folder"),
    ('run/ckpt.pt', 'run/', "is the checkpoint's folder"),
    ('run', '.', "contains the checkpoint's folder"),
    ('run/best.pt', 'run/ckpt.pt', "--out run/ckpt.pt is a file, not a folder"),
    ('run/ckpt.pt', 'run/ckpt.pt', "--out run/ckpt.pt is a file, not a folder"),   # the checkpoint itself
    ('run', 'run/log.jsonl', "--out run/log.jsonl is a file, not a folder"),
    ('run', 'other', "--out other exists and was not written by export_hf.py"),          # another run's folder
])
def test_an_out_that_would_replace_the_runs_files_is_refused_even_with_force(tmp_path, monkeypatch, ckpt, out, named):
    monkeypatch.chdir(tmp_path)
    files = write_run('run')
    os.makedirs('other/sub')
    open('other/sub/best.pt', 'wb').write(b'a checkpoint')
    message = one_line_error(['--ckpt', ckpt, '--out', out, '--force'])
    assert named in message and 'choose' in message
    assert {name: open(os.path.join('run', name), 'rb').read() for name in sorted(os.listdir('run'))} == files
    assert sorted(os.listdir(tmp_path)) == ['other', 'run']
    assert open('other/sub/best.pt', 'rb').read() == b'a checkpoint'


@pytest.mark.parametrize('kind', ['prepared dataset', 'results'])
def test_force_replaces_only_an_earlier_export(tmp_path, capsys, kind):
    """Issue 36, cases 2 and 3: --force on a folder export_hf.py did not write (a prepared dataset, a results folder)
    is one line and leaves every file as it was; on its own earlier export it replaces it."""
    ckpt, _ = write_checkpoint(tmp_path / 'ckpt.pt', **GPT2_STYLE)
    names = (['meta.json', 'train.bin', 'val.bin'] if kind == 'prepared dataset'
             else ['analysis.json', 'quant.json', 'attention_map.png'])
    folder = tmp_path / 'folder'
    folder.mkdir()
    for i, name in enumerate(names):
        (folder / name).write_bytes(bytes([i]) * 100)
    message = one_line_error(['--ckpt', ckpt, '--out', str(folder), '--force'])
    assert f'--out {folder} exists and was not written by export_hf.py' in message, message
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == {n: bytes([i]) * 100 for i, n in enumerate(names)}
    assert sorted(os.listdir(tmp_path)) == ['ckpt.pt', 'folder']            # nothing left beside it either
    out = str(tmp_path / 'hf')
    export_hf.main(['--ckpt', ckpt, '--out', out])
    export_hf.main(['--ckpt', ckpt, '--out', out, '--force'])
    assert transformers.AutoConfig.from_pretrained(out).model_type == 'gpt2'
    capsys.readouterr()


def test_force_replaces_only_the_files_its_mark_lists_unchanged(tmp_path, capsys):
    """Data lost, case 3. train.py --out_dir on an export (its .written-by still naming export_hf.py), then --force
    with another model: ckpt.pt, best.pt and log.jsonl were removed; a README.md added to an export was removed too.
    Now the mark lists each file the export wrote with its sha256: --force replaces those alone, keeps a file added
    since, and a folder whose listed file another program rewrote (train.py's config.json) is not replaced at all."""
    first, _ = write_checkpoint(tmp_path / 'a.pt', **GPT2_STYLE)
    second, model = write_checkpoint(tmp_path / 'b.pt', seed=1, **LLAMA_STYLE)
    out = tmp_path / 'hf'
    export_hf.main(['--ckpt', first, '--out', str(out)])
    (out / 'README.md').write_text('# my model card')
    export_hf.main(['--ckpt', second, '--out', str(out), '--force'])
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out))
    idx = torch.randint(0, model.config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert type(hf).__name__ == 'LlamaForCausalLM' and (model(idx)[0] - hf(idx).logits).abs().max() <= 1e-5
    assert (out / 'README.md').read_text() == '# my model card'
    mark = (out / '.written-by').read_text().splitlines()
    listed = sorted(line.split('  ', 1)[1] for line in mark[1:])
    assert mark[0] == 'export_hf.py' and listed == sorted(set(os.listdir(out)) - {'.written-by', 'README.md'})
    for line in mark[1:]:   # the sha256 of each file as it is
        sha, name = line.split('  ', 1)
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == sha
    # train.py refuses the export as its out_dir (it wrote its config.json over the export's, silently): one line,
    # nothing written
    from conftest import write_dataset
    from test_train import config
    import train
    data = write_dataset(str(tmp_path / 'data'), vocab_size=256, n_train=4000, n_val=1000)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(train.TrainingError, match=r'is an output of export_hf.py .*choose another --out_dir'):
        train.train(config(data, str(out), '--max_iters=2', '--eval_interval=2'))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # a listed file rewritten since (by hand, another program): --force replaces nothing
    (out / 'config.json').write_text('{"edited": true}')
    (out / 'ckpt.pt').write_bytes(b'a run of mine')
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    message = one_line_error(['--ckpt', first, '--out', str(out), '--force'])
    assert 'exists and holds config.json, changed since export_hf.py wrote it' in message, message
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(os.listdir(tmp_path)) == ['a.pt', 'b.pt', 'data', 'hf']   # no temporary folder left either
    capsys.readouterr()


def test_a_folder_inside_the_run_folder_is_written_and_replaced(tmp_path, capsys):
    files = write_run(str(tmp_path / 'run'))
    for force in ([], ['--force']):          # a new folder, then the earlier export replaced
        export_hf.main(['--ckpt', str(tmp_path / 'run'), '--out', str(tmp_path / 'run' / 'hf')] + force)
        assert 'wrote' in capsys.readouterr().out
        assert sorted(os.listdir(tmp_path / 'run')) == sorted(list(files) + ['hf'])
    assert transformers.AutoConfig.from_pretrained(str(tmp_path / 'run' / 'hf')).model_type == 'gpt2'


def test_a_users_folder_named_like_a_temporary_one_is_kept(tmp_path, monkeypatch):
    (tmp_path / 'hf.tmp').mkdir()
    (tmp_path / 'hf.tmp' / 'notes.txt').write_text('mine')
    round_trip(tmp_path, 'GPT2LMHeadModel', **GPT2_STYLE)
    assert (tmp_path / 'hf.tmp' / 'notes.txt').read_text() == 'mine'
    # a failed check removes what this run wrote, and only that
    monkeypatch.setattr(export_hf, 'logit_difference', lambda model, folder: 1.0)
    message = one_line_error(['--ckpt', str(tmp_path / 'ckpt.pt'), '--out', str(tmp_path / 'other')])
    assert 'differ from the checkpoint' in message
    assert sorted(os.listdir(tmp_path)) == ['ckpt.pt', 'hf', 'hf.tmp']
    assert os.listdir(tmp_path / 'hf.tmp') == ['notes.txt']


def test_a_full_disk_and_a_killed_export_leave_nothing_of_theirs(tmp_path, monkeypatch, capsys):
    """Found attacking issue 36's --force rule: safetensors reports a full disk as its own error (a traceback); and an
    export killed before its rename left its temporary folder for good. Now: one line, nothing left; the next export
    of the same --out removes a killed one's folder (it carries export_hf.py's mark from the start), and only that."""
    ckpt, _ = write_checkpoint(tmp_path / 'ckpt.pt', **GPT2_STYLE)
    out = str(tmp_path / 'hf')

    class SafetensorError(Exception):
        pass

    def full(self, folder, **kw):
        raise SafetensorError('Error while serializing: I/O error: No space left on device (os error 28)')
    monkeypatch.setattr(transformers.PreTrainedModel, 'save_pretrained', full)
    message = one_line_error(['--ckpt', ckpt, '--out', out])
    assert 'is full' in message and 'free some space' in message
    assert sorted(os.listdir(tmp_path)) == ['ckpt.pt']
    monkeypatch.undo()
    for killed in (tmp_path / '.hf.k1ll3d.tmp', tmp_path / 'hf.0123abcd.tmp'):   # what kills left (before and since
        killed.mkdir()                                                           # 2026-11-28: fileio.temporary_folder)
        (killed / '.written-by').write_text('export_hf.py\n')
        (killed / 'config.json').write_text('{}')
    mine = tmp_path / '.hf.notes.tmp'                    # a user's folder of the same shape, without the mark
    mine.mkdir()
    (mine / 'notes.txt').write_text('mine')
    export_hf.main(['--ckpt', ckpt, '--out', out])
    assert sorted(os.listdir(tmp_path)) == ['.hf.notes.tmp', 'ckpt.pt', 'hf'] and 'wrote' in capsys.readouterr().out
    assert (mine / 'notes.txt').read_text() == 'mine'


def test_an_out_that_cannot_be_written_is_one_line(tmp_path, monkeypatch):
    ckpt, _ = write_checkpoint(tmp_path / 'ckpt.pt', **GPT2_STYLE)
    (tmp_path / 'a_file').write_text('x')
    message = one_line_error(['--ckpt', ckpt, '--out', str(tmp_path / 'a_file' / 'hf')])
    assert f"--out {tmp_path / 'a_file' / 'hf'}: {tmp_path / 'a_file'} is a file, not a folder" in message
    assert (tmp_path / 'a_file').read_text() == 'x'

    def read_only(path, program):   # what a read-only folder gives (chmod does not stop root, who may run the tests)
        raise PermissionError(13, 'Permission denied', os.path.dirname(path))
    monkeypatch.setattr(export_hf, 'temporary_folder', read_only)
    message = one_line_error(['--ckpt', ckpt, '--out', str(tmp_path / 'ro' / 'hf')])
    assert 'cannot write it (Permission denied: ' in message and 'choose a folder you can write to' in message


def test_local_checkpoint_paths_get_a_local_answer(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.makedirs('out/only_best')
    write_checkpoint('out/only_best/best.pt', **GPT2_STYLE)
    message = one_line_error(['--ckpt', 'out/only_best', '--out', 'hf/x'])
    assert 'the folder holds no ckpt.pt' in message and 'best.pt' in message and 'Hugging Face' not in message
    message = one_line_error(['--ckpt', 'out/nope', '--out', 'hf/x'])
    assert '--ckpt out/nope: not found' in message and 'Hugging Face' not in message
    assert not os.path.exists('hf')


def test_without_transformers_a_model_that_cannot_be_exported_is_told_so_first(tmp_path, monkeypatch):
    refused, _ = write_checkpoint(tmp_path / 'ckpt.pt', attn='softmax1', **GPT2_STYLE)
    monkeypatch.setitem(__import__('sys').modules, 'transformers', None)      # import transformers fails
    message = one_line_error(['--ckpt', refused, '--out', str(tmp_path / 'hf')])
    assert "does not compute attn='softmax1'" in message and 'pip install' not in message
    exportable, _ = write_checkpoint(tmp_path / 'ok.pt', **GPT2_STYLE)
    assert 'pip install transformers' in one_line_error(['--ckpt', exportable, '--out', str(tmp_path / 'hf')])
    assert sorted(os.listdir(tmp_path)) == ['ckpt.pt', 'ok.pt']
