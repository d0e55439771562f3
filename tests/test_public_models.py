"""Public models through the project's own code: GPT.from_hf against transformers, a model's own tokenizer in
prepare_c4.py (hf:...) against tiktoken on the same BPE, GPT-2's vocabulary from a local ranks file against
tiktoken's own definition, the data/model tokenizer check, --bos, and train.py init_from='hf:...'.
Tiny random models and a tiny BPE are built here; the real SmolLM2 model is in test_real_model.py."""
import base64
import dataclasses
import json
import math
import os

import numpy as np
import pytest
import tiktoken
import torch

import analyze
import prepare_c4
import train
from configurator import load_config
from conftest import ROOT
from harness import (dataset, fileio, measure, optimizers, runs, sources, tables, tokenizer as tokenizer_lib,
                     train_config)
from model import GPT, GPTConfig

transformers = pytest.importorskip('transformers')

# a tiny byte-level BPE: GPT-2's byte order (tiktoken's data-gym order), then these merges, then <|endoftext|>
PAIRS = [(b't', b'h'), (b'th', b'e'), (b' ', b'the'), (b'i', b'n'), (b'in', b'g'), (b' ', b'in'), (b'e', b'r'),
         (b'e', b'n'), (b' ', b'a'), (b'1', b'2'), (b' ', b'1')]
TEXTS = ["the thing in the evening is interesting", "  Theirs: 12 x 123, then 1212!\n\nnew <|endoftext|> line",
         "naïve café — 日本語 🙂", "", "there  are   spaces\tand tabs ending with spaces   "]


pytestmark = [pytest.mark.slow, pytest.mark.usefixtures('one_thread')]   # slow: public models through transformers


def byte_order():
    """GPT-2's bytes in rank order: printable non-space bytes first, then the rest (tiktoken's data-gym order)."""
    first = [b for b in range(256) if chr(b).isprintable() and chr(b) != ' ']
    return first + [b for b in range(256) if b not in first]


def byte_unicode():
    """GPT-2's byte -> printable character map (the alphabet of vocab.bpe, encoder.json and Hugging Face files)."""
    first = [b for b in range(256) if chr(b).isprintable() and chr(b) != ' ']
    rest = [b for b in range(256) if b not in first]
    return {**{b: chr(b) for b in first}, **{b: chr(256 + n) for n, b in enumerate(rest)}}


def tiny_ranks():
    ranks = {bytes([b]): i for i, b in enumerate(byte_order())}
    for a, b in PAIRS:
        ranks[a + b] = len(ranks)
    return ranks


def write_tiktoken(path, ranks):
    path.write_bytes(b''.join(base64.b64encode(t) + b' ' + str(r).encode() + b'\n' for t, r in ranks.items()))
    return path


def write_hf_tokenizer(folder, ranks):
    """The same BPE as a Hugging Face tokenizer folder (tokenizers BPE + GPT-2's byte-level pre-tokenizer)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    u = byte_unicode()
    spell = lambda t: ''.join(u[b] for b in t)      # noqa: E731
    bpe = models.BPE(vocab={spell(t): r for t, r in ranks.items()}, merges=[(spell(a), spell(b)) for a, b in PAIRS])
    tk = Tokenizer(bpe)
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, eos_token='<|endoftext|>', bos_token='<|endoftext|>')
    assert tok.convert_tokens_to_ids('<|endoftext|>') == len(ranks)
    tok.save_pretrained(str(folder))
    return folder


def tiny_llama(vocab_size=272, tie=True, kv=2, seed=0, std=0.2):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=72, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=kv, vocab_size=vocab_size, max_position_embeddings=64,
                                   rope_theta=500.0, rms_norm_eps=1e-6, tie_word_embeddings=tie,
                                   bos_token_id=vocab_size - 5, eos_token_id=vocab_size - 5, pad_token_id=0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():      # larger than the default init, so that every part of the model shows in the logits
        for p in model.parameters():
            p.normal_(0, std)
    return model


def tiny_gpt2(seed=0, std=0.2):
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=100,
                                                                 n_positions=64, bos_token_id=99, eos_token_id=99))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, std)
    return model.eval()


# ----------------------------------------------------------------------------- GPT.from_hf
def test_from_hf_gpt2_matches_transformers_and_needs_tanh_gelu(tmp_path):
    hf = tiny_gpt2()
    idx = torch.randint(0, 100, (3, 40))
    with torch.no_grad():
        expected = hf(idx).logits
    ours = GPT.from_hf(hf)
    assert ours.config.mlp == 'gelu_tanh' and ours.config.bias and ours.config.block_size == 64
    assert (ours(idx)[0] - expected).abs().max() <= 1e-4
    hf.save_pretrained(str(tmp_path / 'gpt2'))                        # from a folder, at a shorter block size
    short = GPT.from_hf(str(tmp_path / 'gpt2'), block_size=40)
    assert short.transformer.wpe.weight.shape == (40, 32) and (short(idx)[0] - expected).abs().max() <= 1e-4
    exact = GPT(dataclasses.replace(ours.config, mlp='gelu'))        # the exact GELU is measurably another model
    exact.load_state_dict(ours.state_dict())
    assert (exact.eval()(idx)[0] - expected).abs().max() > 1e-4       # beyond the tolerance above


@pytest.mark.parametrize('tie, kv', [(True, 2), (False, 1), (True, 4)])
def test_from_hf_llama_matches_transformers(tie, kv, tmp_path):
    hf = tiny_llama(tie=tie, kv=kv)
    idx = torch.randint(0, 272, (2, 50))
    with torch.no_grad():
        expected = hf(idx).logits
    ours = GPT.from_hf(hf)
    c = ours.config
    assert (c.n_kv_head, c.rope_base, c.norm_eps, c.mlp_hidden, c.tie_embeddings) == (0 if kv == 4 else kv, 500.0,
                                                                                         1e-6, 72, tie)
    assert (ours.lm_head.weight is ours.transformer.wte.weight) == tie
    assert (ours(idx)[0] - expected).abs().max() <= 1e-4
    assert ours.transformer.wte.weight[272:].abs().sum() == 0          # padded rows of the embedding are zero
    logits, _, trace = ours(idx, analysis=True)
    assert (logits - expected).abs().max() <= 1e-4 and trace['attn'][0].shape == (2, 4, 50, 50)


def test_grouped_query_attention_equals_repeated_key_value_heads():
    """n_kv_head=1 against the same model written with every key/value head repeated (n_kv_head = n_head)."""
    torch.manual_seed(0)
    gqa = GPT(GPTConfig(n_layer=2, n_head=4, n_kv_head=1, n_embd=32, block_size=16, vocab_size=50, bias=False,
                        pos_emb='rotary', norm='rmsnorm', mlp='swiglu')).eval()
    mha = GPT(dataclasses.replace(gqa.config, n_kv_head=0)).eval()
    state = gqa.state_dict()
    for name, w in list(state.items()):
        if name.endswith('attn.c_attn.weight'):                          # (32 + 8 + 8, 32) -> (96, 32)
            q, k, v = w.split((32, 8, 8))
            state[name] = torch.cat([q, k.repeat(4, 1), v.repeat(4, 1)])
    mha.load_state_dict(state)
    idx = torch.randint(0, 50, (2, 16))
    assert gqa.transformer.h[0].attn.c_attn.weight.shape == (48, 32)
    assert torch.allclose(gqa(idx)[0], mha(idx)[0], atol=1e-5)
    assert torch.allclose(gqa(idx, analysis=True)[0], mha(idx)[0], atol=1e-5)


def test_from_hf_refuses_what_it_cannot_represent():
    from model import hf_config
    llama = tiny_llama().config
    hf_config(llama)
    llama.rope_parameters = {'rope_type': 'llama3', 'rope_theta': 500.0, 'factor': 8.0}
    with pytest.raises(ValueError, match="rope scaling 'llama3'.*through transformers"):
        hf_config(llama)
    qwen = transformers.Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                                    num_key_value_heads=2, vocab_size=64)
    with pytest.raises(ValueError, match="model_type 'qwen2'") as e:
        GPT.from_hf(transformers.Qwen2ForCausalLM(qwen))
    assert '\n' not in str(e.value)
    with pytest.raises(ValueError, match='block_size 65'):
        GPT.from_hf(tiny_llama(), block_size=65)


def test_new_config_fields_are_validated_and_old_checkpoints_still_load(tmp_path):
    for bad, match in ((dict(n_head=4, n_kv_head=3), 'n_kv_head'), (dict(norm_eps=0.0), 'norm_eps'),
                       (dict(tie_embeddings='yes'), 'tie_embeddings'), (dict(mlp_hidden=-1), 'mlp_hidden'),
                       (dict(rope_base='big'), 'rope_base'), (dict(mlp='gelu2'), 'gelu_tanh')):
        with pytest.raises(ValueError, match=match):
            GPTConfig(**dict(n_layer=1, n_head=4, n_embd=16, vocab_size=10) | bad)
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=40)
    model = GPT(cfg).eval()
    old_args = {k: v for k, v in vars(cfg).items() if k not in ('n_kv_head', 'mlp_hidden', 'rope_base', 'norm_eps',
                                                                  'tie_embeddings')}
    path = tmp_path / 'ckpt.pt'
    torch.save({'model': model.state_dict(), 'model_args': old_args, 'iter_num': 1}, path)
    loaded, _ = GPT.from_checkpoint(path)
    idx = torch.randint(0, 40, (1, 8))
    assert torch.equal(loaded(idx)[0], model(idx)[0])
    ckpt = runs.load_checkpoint(str(path))
    runs.check_model_args(str(path), ckpt, vars(cfg).copy())    # resuming does not see a change (no error)
    assert ckpt['iter_num'] == 1
    assert set(train_config.PUBLIC_MODEL_KEYS) <= set(train_config.DEFAULTS) and set(train_config.MODEL_KEYS) <= set(train_config.DEFAULTS)


def test_analysis_through_from_hf_equals_analysis_through_transformers(tmp_path):
    from test_analyze import random_docs, write_docs
    data = write_docs(str(tmp_path / 'docs'), random_docs(n=9, max_len=60, vocab_size=272), vocab_size=272)
    hf = tiny_llama(std=0.1)
    through_hf = runs.wrap_hf(hf, 'tiny', block_size=48)
    ours = runs.LoadedModel('tiny', GPT.from_hf(hf, block_size=48), 'ours', through_hf.bos, 48, 272, {})
    a, _ = measure.analyze(through_hf, data, None, 3, 'cpu')
    b, _ = measure.analyze(ours, data, None, 3, 'cpu')
    for k in tables.SUMMARY_KEYS:
        assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-9), k
    value_keys = set(measure.VALUE_METRICS) | {'value_drain_min'}
    for k in a['per_layer']:
        if k in value_keys:   # transformers' modules do not hand out value vectors: unmeasured (NaN, null in JSON)
            assert all(math.isnan(x) for x in a['per_layer'][k]), k
            assert all(math.isfinite(x) for x in b['per_layer'][k]), k
            continue
        assert a['per_layer'][k] == pytest.approx(b['per_layer'][k], rel=1e-5, abs=1e-9), k


# ----------------------------------------------------------------------------- tokenizers
def test_hf_tokenizer_gives_tiktoken_ids_on_the_same_bpe(tmp_path):
    ranks = tiny_ranks()
    ref = tiktoken.Encoding('tiny', pat_str=tokenizer_lib.GPT2_PAT, mergeable_ranks=ranks,
                            special_tokens={'<|endoftext|>': len(ranks)})
    hf = tokenizer_lib.load_tokenizer(f"hf:{write_hf_tokenizer(tmp_path / 'tok', ranks)}")
    tt = tokenizer_lib.load_tokenizer(str(write_tiktoken(tmp_path / 'tiny.tiktoken', ranks)))
    for text in TEXTS + [tokenizer_lib.PROBE_TEXT]:
        assert list(hf.encode(text)) == list(tt.encode(text)) == ref.encode_ordinary(text), text
    assert (hf.vocab_size, hf.eot_token, hf.eot_text, hf.add_bos) == (len(ranks) + 1, len(ranks), '<|endoftext|>', False)
    assert hf.name == f"hf:{os.path.relpath(tmp_path / 'tok')}" and len(hf.sha256) == 64   # no absolute path
    assert tokenizer_lib.tokenizer_mismatch(hf.record(), tt.record()) is None
    assert 'differ' in tokenizer_lib.tokenizer_mismatch(hf.record(), tokenizer_lib.load_tokenizer('bytes').record())
    assert tokenizer_lib.tokenizer_mismatch({'name': 'old'}, hf.record()) is None         # no probe: cannot tell


def test_prepare_with_a_model_tokenizer_records_it_and_round_trips(tmp_path):
    folder = write_hf_tokenizer(tmp_path / 'tok', tiny_ranks())
    out = dataset.prepare_installed_docstrings(tmp_path / 'data', f'hf:{folder}', max_docs=80)
    meta = dataset.load_meta(out)
    info = meta['tokenizer_info']
    assert meta['tokenizer'] == info['name'] == f'hf:{os.path.relpath(folder)}' and meta['eot_token'] == info['eot_token'] == 267
    assert info['probe'] == list(tokenizer_lib.load_tokenizer(f'hf:{os.path.relpath(folder)}').encode(tokenizer_lib.PROBE_TEXT))
    assert meta['args']['tokenizer_sha256'] == info['sha256']
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    docs = sources.docstring_splits(sources.docstring_documents(80))['val']
    assert [tok.decode(d.tolist()) for d in dataset.iter_documents(out, 'val')] == docs


def test_c4_shards_in_a_model_vocabulary(tmp_path):
    from test_prepare_c4 import TRAIN, VAL, write_shard
    (tmp_path / 'c4').mkdir()
    write_shard(tmp_path / 'c4' / 'c4-train.00000-of-00001.json.gz', TRAIN[0])
    write_shard(tmp_path / 'c4' / 'c4-validation.00000-of-00001.json.gz', VAL)
    folder = write_hf_tokenizer(tmp_path / 'tok', tiny_ranks())
    out = dataset.prepare_c4(tmp_path / 'data', f'hf:{folder}', [str(tmp_path / 'c4')])
    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    assert [tok.decode(d.tolist()) for d in dataset.iter_documents(out, 'train')] == TRAIN[0]
    assert dataset.load_meta(out)['tokenizer_info']['name'] == f'hf:{os.path.relpath(folder)}'


def test_a_tokenizer_that_writes_its_separator_inside_a_document_is_refused():
    tok = tokenizer_lib.Tokenizer('t', 10, 3, lambda text: [1, 3, 2])
    with pytest.raises(fileio.PrepareError, match='separator 3 inside a document'):
        tokenizer_lib.encode_chunk(['x'], tok)


def write_data_gym(folder, ranks):
    """GPT-2's own vocabulary format (vocab.bpe merges + encoder.json) for the tiny BPE."""
    u = byte_unicode()
    spell = lambda t: ''.join(u[b] for b in t)      # noqa: E731
    (folder / 'vocab.bpe').write_text('#version: 0.2\n' + ''.join(f'{spell(a)} {spell(b)}\n' for a, b in PAIRS))
    (folder / 'encoder.json').write_text(json.dumps({spell(t): r for t, r in ranks.items()}))


def test_gpt2_from_a_local_ranks_file_equals_tiktokens_gpt2_definition(tmp_path, monkeypatch):
    """tiktoken's own gpt2() (GPT-2's vocab.bpe / encoder.json, its pattern and special token) on a tiny vocabulary,
    against prepare_c4's gpt2 from the same vocabulary as a ranks file found through GPT2_TIKTOKEN."""
    import tiktoken.load
    import tiktoken_ext.openai_public as public
    ranks = tiny_ranks()
    write_data_gym(tmp_path, ranks)
    files = {url: (tmp_path / os.path.basename(url)).read_bytes() for url in tokenizer_lib.GPT2_FILES}
    monkeypatch.setattr(tiktoken.load, 'read_file_cached', lambda url, expected_hash=None: files[url])
    definition = public.gpt2()
    definition['explicit_n_vocab'] = len(ranks) + 1
    definition['special_tokens'] = {'<|endoftext|>': len(ranks)}     # 50256 in the real one: len(ranks) there
    ref = tiktoken.Encoding(**definition)
    path = write_tiktoken(tmp_path / 'gpt2.tiktoken', ranks)
    monkeypatch.setenv('GPT2_TIKTOKEN', str(path))
    with pytest.raises(fileio.PrepareError, match="not GPT-2's BPE ranks"):        # the sha256 is checked
        tokenizer_lib.load_tokenizer('gpt2')
    import hashlib
    monkeypatch.setattr(tokenizer_lib, 'R50K_SHA256', hashlib.sha256(path.read_bytes()).hexdigest())
    tok = tokenizer_lib.load_tokenizer('gpt2')
    for text in TEXTS:
        assert list(tok.encode(text)) == ref.encode_ordinary(text)
    assert tok.name == 'gpt2' and tok.eot_token == len(ranks) and tok.sha256 == tokenizer_lib.R50K_SHA256


def test_missing_gpt2_vocabulary_says_exactly_what_to_do(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv('GPT2_TIKTOKEN', raising=False)
    monkeypatch.setenv('TIKTOKEN_CACHE_DIR', str(tmp_path / 'empty'))
    monkeypatch.setenv('CORPUS_CACHE', str(tmp_path / 'empty'))       # nor the pinned copy of corpus.py fetch
    monkeypatch.setattr(tiktoken, 'get_encoding', lambda name: (_ for _ in ()).throw(ConnectionError('offline')))
    with pytest.raises(SystemExit) as e:
        prepare_c4.main(['--tokenizer', 'gpt2', '--out_dir', str(tmp_path / 'o')])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count('\n') == 1
    assert 'pip download --no-deps --no-binary :all: openai-whisper==20250625' in err and 'GPT2_TIKTOKEN=' in err
    monkeypatch.setenv('GPT2_TIKTOKEN', str(tmp_path / 'nowhere.tiktoken'))
    with pytest.raises(fileio.PrepareError, match='no such file'):
        tokenizer_lib.load_tokenizer('gpt2')


def test_real_gpt2_ranks_give_gpt2_ids(gpt2_ranks):
    tok = tokenizer_lib.load_tokenizer('gpt2')
    assert list(tok.encode('Hello world')) == [15496, 995] and list(tok.encode(' the')) == [262]
    assert (tok.vocab_size, tok.eot_token) == (50257, 50256)
    assert list(tok.encode('<|endoftext|>')) == [27, 91, 437, 1659, 5239, 91, 29]      # text, not the eot token


def test_gguf_metadata_reads_what_the_gguf_package_writes(tmp_path):
    gguf = pytest.importorskip('gguf')
    path = str(tmp_path / 'm.gguf')
    w = gguf.GGUFWriter(path, 'llama')
    w.add_string('tokenizer_lib.ggml.pre', 'smollm')
    w.add_array('tokenizer_lib.ggml.tokens', ['a', 'bb', 'ccc'])
    w.add_array('tokenizer_lib.ggml.token_type', [1, 3, 1])
    w.add_uint32('llama.block_count', 3)
    w.add_float32('llama.rope.freq_base', 100000.0)
    w.add_bool('tokenizer_lib.ggml.add_bos_token', False)
    w.add_tensor('w', np.ones((2, 3), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    # what was written, scalars only (arrays skipped); GGUFWriter adds the architecture key itself
    expected = {'general.architecture': 'llama', 'tokenizer_lib.ggml.pre': 'smollm', 'llama.block_count': 3,
                'llama.rope.freq_base': 100000.0, 'tokenizer_lib.ggml.add_bos_token': False}
    got = tokenizer_lib.gguf_metadata(path)
    assert got == expected and type(got['tokenizer_lib.ggml.add_bos_token']) is bool
    for name, content in (('x.gguf', b'nope'), ('empty.gguf', b''), ('short.gguf', b'GGUF\x03\x00')):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ValueError, match='not a GGUF'):
            tokenizer_lib.gguf_metadata(str(tmp_path / name))


# ----------------------------------------------------------------------------- data check, --bos, default data
@pytest.fixture
def tiny_public(tmp_path):
    """A tiny Llama with its own tokenizer in one folder, like a downloaded model."""
    folder = tmp_path / 'tiny-llama'
    tiny_llama(std=0.05).save_pretrained(str(folder))
    write_hf_tokenizer(folder, tiny_ranks())
    return str(folder)


def test_data_of_another_tokenizer_is_refused_with_the_command_that_makes_it(tiny_public, tmp_path):
    wrong = dataset.prepare_installed_docstrings(tmp_path / 'bytes', 'bytes', max_docs=120)     # ids fit: 257 < 272
    lm = runs.load_model(tiny_public, block_size=32)
    assert lm.tokenizer['name'] == f'hf:{os.path.relpath(tiny_public)}'
    with pytest.raises(ValueError) as e:
        measure.analyze(lm, str(wrong), 5, 2, 'cpu')
    msg = str(e.value)
    assert 'does not fit' in msg and '\n' not in msg
    assert (f'python prepare_c4.py --source installed_docstrings --tokenizer hf:{tiny_public} --max_docs 120 '
            f'--out_dir {wrong}_tiny-llama') in msg   # the data's settings travel with the advice
    right = dataset.prepare_installed_docstrings(tmp_path / 'right', f'hf:{tiny_public}', max_docs=120)
    result, _ = measure.analyze(lm, str(right), 5, 2, 'cpu')
    assert result['data']['documents'] == 1 and math.isfinite(result['ppl'])    # 120 documents: 1 in val


def test_bos_choices(tiny_public, tmp_path):
    data = dataset.prepare_installed_docstrings(tmp_path / 'd', f'hf:{tiny_public}', max_docs=120)
    meta = dataset.load_meta(data)
    lm = runs.load_model(tiny_public, block_size=32)
    assert lm.bos == 267                                             # auto: the config's bos_token_id (Llama)
    assert measure.choose_bos(lm, 'none', meta).bos is None
    assert measure.choose_bos(lm, 'eot', meta).bos == meta['eot_token']
    assert measure.choose_bos(lm, '5', meta).bos == 5
    with pytest.raises(ValueError, match='--bos 999'):
        measure.choose_bos(lm, '999', meta)
    idx, _ = next(measure.val_batches(str(data), 1, 32, 1, measure.choose_bos(lm, '5', meta).bos))
    assert idx[0, 0] == 5


# ----------------------------------------------------------------------------- train.py init_from='hf:...'
def finetune_config(data, out, spec, *overrides):
    args = [os.path.join(ROOT, 'config', 'tiny_cpu.py'), f'--dataset={data}', f'--out_dir={out}', f'--init_from=hf:{spec}',
            '--block_size=32', '--batch_size=4', '--eval_tokens=512', '--log_interval=1', '--warmup_iters=0',
            '--max_iters=2', '--eval_interval=100', '--compile=False', *overrides]
    return load_config(train_config.DEFAULTS, list(args), train_config.CHOICES)


def test_train_init_from_hf_starts_from_the_public_weights_and_resumes(tiny_public, tmp_path):
    data = str(dataset.prepare_installed_docstrings(tmp_path / 'd', f'hf:{tiny_public}', max_docs=400))
    public = GPT.from_hf(tiny_public, block_size=32)
    out = str(tmp_path / 'same')
    cfg = finetune_config(data, out, tiny_public, '--learning_rate=0.0', '--min_lr=0.0', '--attn=softmax1')
    train.train(cfg)
    ckpt = torch.load(os.path.join(out, 'ckpt.pt'), weights_only=False)
    assert all(torch.equal(v, public.state_dict()[k]) for k, v in ckpt['model'].items())   # lr 0: unchanged
    assert ckpt['model_args'] == dict(dataclasses.asdict(public.config), attn='softmax1')
    assert ckpt['tokenizer']['name'] == f'hf:{os.path.relpath(tiny_public)}'
    out = str(tmp_path / 'oa')
    first = train.train(finetune_config(data, out, tiny_public, '--optimizer=orthoadam', '--learning_rate=1e-3'))
    again = train.train(finetune_config(data, out, tiny_public, '--optimizer=orthoadam', '--learning_rate=1e-3',
                                        '--max_iters=4'))                     # the same command resumes
    assert first['iter'] == 2 and again['iter'] == 4 and math.isfinite(again['val_loss'])
    lm = runs.load_model(out)
    assert lm.data == data and lm.tokenizer['probe'] == dataset.load_meta(data)['tokenizer_info']['probe']
    wrong = str(dataset.prepare_installed_docstrings(tmp_path / 'bytes', 'bytes', max_docs=400))
    with pytest.raises(train_config.TrainingError, match=f'--tokenizer hf:{tiny_public}'):
        train.train(finetune_config(wrong, str(tmp_path / 'w'), tiny_public))
    with pytest.raises(train_config.TrainingError, match="'init_from' must be one of"):
        train.train(finetune_config(data, str(tmp_path / 'x'), tiny_public, '--init_from=hf:'))


def test_orthoadam_keeps_the_vocabulary_axis_of_an_untied_head():
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=64, tie_embeddings=False))
    opt = optimizers.configure_optimizer(m, dict(train_config.DEFAULTS, optimizer='orthoadam', n_embd=16), 'cpu')
    skip = [g for g in opt.param_groups if g.get('skip_axes') == (0,)]
    assert len(skip) == 1 and sorted(skip[0]['param_names']) == ['lm_head.weight', 'transformer.wte.weight']


def test_cli_defaults_data_hints_and_eval_quant_on_a_public_model(tiny_public, tmp_path, capsys):
    import eval_quant
    with pytest.raises(SystemExit) as e:              # no data: the command that makes it, in the model's vocabulary
        analyze.main(['--init_from', tiny_public, '--data', str(tmp_path / 'nowhere')])
    assert f'--tokenizer hf:{tiny_public} --out_dir {tmp_path / "nowhere"}' in str(e.value)
    data = str(dataset.prepare_installed_docstrings(tmp_path / 'd', f'hf:{tiny_public}', max_docs=120))
    eval_quant.main(['--init_from', tiny_public, '--data', data, '--schemes', 'absmax4', '--bos', 'eot',
                     '--block_size', '32', '--json', str(tmp_path / 'q.json')])
    run = json.loads((tmp_path / 'q.json').read_text())['models'][0]
    assert run['data']['bos'] == dataset.load_meta(data)['eot_token'] and run['ppl']['absmax4'] > 0
    assert run['model'] == os.path.relpath(tiny_public)   # a local model by a relative path: no absolute path
    analyze.main(['--init_from', tiny_public, '--data', data, '--max_docs', '2', '--block_size', '32',
                  '--json', str(tmp_path / 'a.json')])
    assert '"' + str(tmp_path) not in (tmp_path / 'a.json').read_text()
    # our checkpoints measure, by default, the data they were trained on
    from test_analyze import write_checkpoint
    ckpt = write_checkpoint(str(tmp_path / 'run'))
    state = torch.load(ckpt, weights_only=False)
    state['config']['dataset'] = str(tmp_path / 'own')
    torch.save(state, ckpt)
    from test_analyze import random_docs, write_docs
    write_docs(str(tmp_path / 'own'), random_docs())
    analyze.main(['--ckpt', ckpt, '--max_docs', '3', '--json', str(tmp_path / 'a.json')])
    recorded = json.loads((tmp_path / 'a.json').read_text())['data']['dir']      # relative: no absolute path
    assert not os.path.isabs(recorded) and os.path.samefile(recorded, tmp_path / 'own')
    capsys.readouterr()


def test_gguf_without_its_packages_is_a_one_line_error(tmp_path, monkeypatch):
    import importlib.util
    import model as model_module
    path = tmp_path / 'm.gguf'
    path.write_bytes(b'GGUF')
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *a: None if name in ('gguf', 'accelerate') else real(name, *a))
    with pytest.raises(ValueError, match='pip install gguf accelerate') as e:
        model_module.load_hf(str(path))
    assert '\n' not in str(e.value)
    with pytest.raises(ValueError, match='not found'):
        model_module.load_hf(str(tmp_path / 'missing.gguf'))
    monkeypatch.setitem(__import__('sys').modules, 'gguf', None)
    with pytest.raises(fileio.PrepareError, match='needs the gguf package: pip install gguf'):
        tokenizer_lib.load_tokenizer(f'hf:{path}')


def test_reproduce_still_matches_runs_saved_before_the_new_model_keys():
    import reproduce
    cfg = reproduce.resolve('tiny_cpu', [])
    identity = {k: v for k, v in json.loads(json.dumps(cfg, default=str)).items() if k not in reproduce.NOT_IDENTITY}
    old = {k: v for k, v in identity.items() if k not in ('n_kv_head', 'mlp_hidden', 'rope_base', 'norm_eps',
                                                          'tie_embeddings')}
    assert reproduce.saved_identity(old) == identity
    assert reproduce.saved_identity(dict(old, n_layer=7)) != identity
