"""export_hf.py: tiny random GPT-2-style and Llama-style models of ours -> a Hugging Face folder ->
AutoModelForCausalLM.from_pretrained gives the same logits; the tokenizer it writes gives the data's ids (tiktoken's
on the same ranks); every model a stock architecture cannot compute is refused in one line, leaving nothing."""
import base64
import os

import pytest
import tiktoken
import torch

import export_hf
import prepare_c4
from model import GPT, GPTConfig
import tokenizer as tokenizer_lib

transformers = pytest.importorskip('transformers')
pytestmark = pytest.mark.usefixtures('one_thread')

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


def round_trip(tmp_path, arch, **kw):
    ckpt, model = write_checkpoint(tmp_path / 'ckpt.pt', **kw)
    out = str(tmp_path / 'hf')
    export_hf.main(['--ckpt', ckpt, '--out', out])
    hf = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert type(hf).__name__ == arch and not os.path.exists(out + '.tmp')
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


def test_gpt2_tokenizer_gives_gpt2_ids(tmp_path):
    if tokenizer_lib.gpt2_ranks_file() is None:
        pytest.skip('no local copy of GPT-2\'s BPE ranks (set GPT2_TIKTOKEN, see docs/data.md)')
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
    assert not os.path.exists(tmp_path / 'hf') and not os.path.exists(tmp_path / 'hf.tmp')


def test_an_existing_folder_needs_force(tmp_path, capsys):
    ckpt, _ = write_checkpoint(tmp_path / 'ckpt.pt', **GPT2_STYLE)
    (tmp_path / 'hf').mkdir()
    (tmp_path / 'hf' / 'notes.txt').write_text('keep')
    with pytest.raises(SystemExit) as e:
        export_hf.main(['--ckpt', ckpt, '--out', str(tmp_path / 'hf')])
    assert '--force' in str(e.value.code) and (tmp_path / 'hf' / 'notes.txt').exists()
    export_hf.main(['--ckpt', ckpt, '--out', str(tmp_path / 'hf'), '--force'])
    assert 'wrote' in capsys.readouterr().out and not (tmp_path / 'hf' / 'notes.txt').exists()
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
