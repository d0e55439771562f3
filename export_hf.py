"""Export a train.py checkpoint to a Hugging Face folder that transformers loads with the same logits.

    python export_hf.py --ckpt out/llama2_130m --out hf/llama2_130m          # a checkpoint or its folder
    python -c "import transformers as t; m = t.AutoModelForCausalLM.from_pretrained('hf/llama2_130m')"

Only models that a stock transformers architecture computes exactly are exported, as that architecture:
  GPT2LMHeadModel   norm='layernorm', bias=True, pos_emb='absolute', mlp='gelu' (activation 'gelu') or
                    'gelu_tanh' ('gelu_pytorch_tanh'), n_kv_head = n_head, tied or untied head;
  LlamaForCausalLM  norm='rmsnorm', pos_emb='rotary', mlp='swiglu', grouped-query attention, rope_base,
                    bias True or False (attention_bias and mlp_bias), tied or untied head;
both with attn='softmax', attn_bias=False, sink_token=False and causal_free_prefix=0. Anything else (softmax-1,
every other attention (model.CHOICES), the attention bias, the sink token, RMSNorm-S, no positions, a free prefix, a
mix such as LayerNorm with rotary positions, GPT-2 without biases) is refused in one line naming what does not fit:
it would need modeling code of its own, loaded with trust_remote_code=True, which this repository does not write
(docs/public-models.md, "Export to Hugging Face", says why). analyze.py, eval_quant.py and lm_eval_adapter.py evaluate every
variant from the checkpoint itself.

The folder (written to a new temporary folder beside OUT, checked, then renamed to OUT):
  config.json, generation_config.json, model.safetensors   transformers' save_pretrained, fp32; the vocabulary is
                    the real one (vocab_size of the data), not the padded embedding; n_positions /
                    max_position_embeddings = block_size; bos_token_id = the checkpoint's BOS (windows='document':
                    the data's eot) or null, eos_token_id = the data's eot.
  tokenizer.json, tokenizer_config.json   the data's tokenizer where it can be written: gpt2 (from GPT-2's local
                    ranks file, see tokenizer.gpt2_ranks_file), a .tiktoken file (still present, same sha256) and
                    bytes, as a byte-level BPE with <|endoftext|> as the document separator (bytes: ids 0-255 are the
                    UTF-8 bytes, no merges, 256 = <|endoftext|>); hf:NAME tokenizers as transformers saves them. The
                    written tokenizer must give the data's ids on tokenizer.PROBE_TEXT (checked). Other tokenizers
                    (synthetic tasks) are not written; the script says so.
Before the rename, the folder is loaded with AutoModelForCausalLM and its logits on a random sequence of block_size
tokens are compared with the checkpoint's: a difference above TOLERANCE is an error and nothing is left behind.
The folder also holds .written-by (fileio.MARK): its first line names export_hf.py, each further line is
"<sha256>  <file>" for a file the export wrote. OUT may not be or contain the checkpoint's folder; an existing OUT is
replaced only with --force, and only when it is empty or an earlier export whose listed files are unchanged: then
those files alone are replaced, one by one (a file added since, e.g. a README.md model card, stays; one the new
export would write over is refused). Never a file, a prepared dataset, a results folder or a run (a folder that
another program has written into, e.g. train.py's config.json over the export's, is not export_hf.py's any more);
nothing else is removed. An export whose .written-by lists no files (written before 2026-11-28) is not replaced:
move it away first.
"""
from harness.entry import early_exit_on_signal   # first: a signal while torch loads is one line, not a traceback
early_exit_on_signal(__name__)

import argparse
import os
import shutil
import sys

import torch

from harness import runs
from harness.entry import run_script
from harness.fileio import (MARK, PrepareError, atomic_write, check_output, disk_full, disk_full_text, mark_folder,
                            own_files, path_arg, remove_temporaries, temporary_folder)
from harness.tokenizer import (EOT_TEXT, GPT2_PAT, gpt2_ranks_file, load_tokenizer, read_tiktoken_ranks,
                               tokenizer_mismatch, transformers_tokenizer)

PROGRAM = 'export_hf.py'   # the name its folders' .written-by holds
TOLERANCE = 1e-4     # largest |logit difference| accepted between the export and the checkpoint (fp32)
# what both architectures need, then what each needs of the keys that differ between them
COMMON = dict(attn=('softmax',), attn_bias=(False,), sink_token=(False,), causal_free_prefix=(0,))
GPT2 = dict(norm=('layernorm',), bias=(True,), pos_emb=('absolute',), mlp=('gelu', 'gelu_tanh'))
LLAMA = dict(norm=('rmsnorm',), pos_emb=('rotary',), mlp=('swiglu',))
GPT2_ACTIVATION = {'gelu': 'gelu', 'gelu_tanh': 'gelu_pytorch_tanh'}


def architecture(config):
    """(the closest stock architecture's name, the settings of config it cannot express: empty = exportable)."""
    llama = config.norm == 'rmsnorm' or config.pos_emb == 'rotary' or config.mlp == 'swiglu'
    needs = {**COMMON, **(LLAMA if llama else GPT2)}
    problems = [f"{key}={getattr(config, key)!r}" for key, allowed in needs.items() if getattr(config, key) not in allowed]
    if not llama and config.kv_heads != config.n_head:
        problems.append(f"n_kv_head={config.n_kv_head} (grouped-query attention)")
    return ('LlamaForCausalLM' if llama else 'GPT2LMHeadModel'), problems


def hf_model(model, bos, eot):
    """The transformers model (GPT2LMHeadModel or LlamaForCausalLM) holding model's weights, in eval mode."""
    import transformers
    c, sd = model.config, model.state_dict()
    V = c.vocab_size
    name, problems = architecture(c)
    if problems:
        raise ValueError(f"cannot write {', '.join(problems)} as a stock transformers model")
    if name == 'GPT2LMHeadModel':
        config = transformers.GPT2Config(
            vocab_size=V, n_positions=c.block_size, n_embd=c.n_embd, n_layer=c.n_layer, n_head=c.n_head,
            n_inner=c.hidden_size, activation_function=GPT2_ACTIVATION[c.mlp], resid_pdrop=c.dropout,
            embd_pdrop=c.dropout, attn_pdrop=c.dropout, layer_norm_epsilon=c.norm_eps,
            tie_word_embeddings=c.tie_embeddings, bos_token_id=bos, eos_token_id=eot)
        # the same names; GPT-2's Conv1D keeps (in, out) where our Linear keeps (out, in)
        state = {k: v.t() if k.startswith('transformer.h.') and v.dim() == 2 else v for k, v in sd.items()}
    else:
        config = transformers.LlamaConfig(
            vocab_size=V, hidden_size=c.n_embd, intermediate_size=c.hidden_size, num_hidden_layers=c.n_layer,
            num_attention_heads=c.n_head, num_key_value_heads=c.kv_heads, head_dim=c.n_embd // c.n_head,
            max_position_embeddings=c.block_size, rms_norm_eps=c.norm_eps, rope_theta=c.rope_base,
            attention_bias=c.bias, mlp_bias=c.bias, attention_dropout=c.dropout, hidden_act='silu',
            tie_word_embeddings=c.tie_embeddings, bos_token_id=bos, eos_token_id=eot)
        kv = c.kv_heads * (c.n_embd // c.n_head)
        state = {'model.norm.weight': sd['transformer.ln_f.weight']}
        for i in range(c.n_layer):
            ours, theirs = f'transformer.h.{i}.', f'model.layers.{i}.'
            state[theirs + 'input_layernorm.weight'] = sd[ours + 'ln_1.weight']
            state[theirs + 'post_attention_layernorm.weight'] = sd[ours + 'ln_2.weight']
            for kind in ('weight', 'bias') if c.bias else ('weight',):
                q, k, v = sd[ours + f'attn.c_attn.{kind}'].split((c.n_embd, kv, kv))
                state.update({theirs + f'self_attn.q_proj.{kind}': q, theirs + f'self_attn.k_proj.{kind}': k,
                              theirs + f'self_attn.v_proj.{kind}': v,
                              theirs + f'self_attn.o_proj.{kind}': sd[ours + f'attn.c_proj.{kind}'],
                              theirs + f'mlp.gate_proj.{kind}': sd[ours + f'mlp.c_gate.{kind}'],
                              theirs + f'mlp.up_proj.{kind}': sd[ours + f'mlp.c_fc.{kind}'],
                              theirs + f'mlp.down_proj.{kind}': sd[ours + f'mlp.c_proj.{kind}']})
    embed = 'transformer.wte.weight' if name == 'GPT2LMHeadModel' else 'model.embed_tokens.weight'
    state[embed] = sd['transformer.wte.weight'][:V]           # the padding rows go
    state['lm_head.weight'] = sd['lm_head.weight'][:V]
    hf = getattr(transformers, name)(config)
    hf.load_state_dict({k: v.contiguous() for k, v in state.items()}, strict=True)
    return hf.eval()


def hf_tokenizer(record, block_size):
    """(the data's tokenizer as a transformers tokenizer, None) or (None, why it is not written)."""
    name = (record or {}).get('name')
    if name is None:
        return None, 'the checkpoint records no tokenizer'
    if name.startswith('hf:'):
        try:
            return transformers_tokenizer(name[3:]), None
        except PrepareError as e:
            return None, str(e)
    if name == 'bytes':
        ranks = {bytes([b]): b for b in range(256)}
    elif name == 'gpt2':
        path = gpt2_ranks_file()
        if path is None:
            return None, "GPT-2's BPE ranks file is not on this machine (set GPT2_TIKTOKEN, docs/data.md)"
        ranks = read_tiktoken_ranks(path)
    elif name.endswith('.tiktoken'):
        try:
            if load_tokenizer(name).sha256 != record.get('sha256'):
                return None, f"{name} changed since the data was prepared"
        except (OSError, PrepareError) as e:
            return None, f"{name}: {e}"
        ranks = read_tiktoken_ranks(name)
    else:
        return None, f"tokenizer {name!r} has no Hugging Face form"
    import transformers
    from transformers.convert_slow_tokenizer import TikTokenConverter
    converter = TikTokenConverter(pattern=GPT2_PAT, extra_special_tokens=[EOT_TEXT])
    converter.load_tiktoken_bpe = lambda _: ranks     # the ranks read above, not tiktoken's loader
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=converter.converted(), bos_token=EOT_TEXT,
                                                     eos_token=EOT_TEXT, model_max_length=block_size)
    return tokenizer, None


def inside(path, folder):
    """Whether path is folder or lies inside it (both made absolute, links resolved)."""
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def check_paths(ckpt, out, force):
    """One-line ValueErrors, before any model is loaded: --ckpt is a checkpoint or a run folder holding ckpt.pt (a
    local path, so the answer is local, not a Hugging Face hint), and writing --out removes nothing of a user's:
    --out may not be or contain the checkpoint's folder, an existing --out needs --force, and --force replaces only a
    folder this script wrote (its .written-by file names export_hf.py) or an empty one (fileio.check_output), never
    a file, a prepared dataset, a results folder or a run (a new folder inside the run folder is fine)."""
    runs.check_ckpt(ckpt)
    run = ckpt if os.path.isdir(ckpt) else (os.path.dirname(ckpt) or '.')
    if inside(run, out):
        where = 'is' if inside(out, run) else 'contains'
        raise ValueError(f"--out {out} {where} the checkpoint's folder {run}: writing it would replace the run's files "
                         f"(ckpt.pt, best.pt, log.jsonl); choose a folder elsewhere, e.g. hf/"
                         f"{os.path.basename(os.path.realpath(run))}")
    if os.path.isdir(out) and os.listdir(out) and not force:
        raise ValueError(f"--out {out} exists and is not an empty folder; choose another --out or pass --force "
                         f"(which replaces an earlier export only)")
    check_output(out, '--out', folder=True, replace=PROGRAM)


def export(ckpt, out, force=False):
    """Write ckpt (a train.py checkpoint or its folder) to the Hugging Face folder out. Returns (architecture,
    max |logit difference|, the tokenizer note: None when it was written, else why not). Raises ValueError."""
    check_paths(ckpt, out, force)
    lm = runs.load_model(ckpt)
    if lm.kind != 'ours':
        raise ValueError(f"{ckpt} is not a train.py checkpoint")
    config = lm.model.config
    name, problems = architecture(config)
    if problems:
        raise ValueError(f"{ckpt} cannot be written as a stock transformers model: {name}, the closest architecture, "
                         f"does not compute {', '.join(problems)}; that would need modeling code of its own loaded with "
                         f"trust_remote_code=True, which this repository does not write (docs/public-models.md 'Export to Hugging "
                         f"Face'); analyze.py, eval_quant.py and lm_eval_adapter.py evaluate it from the checkpoint")
    try:                                   # only now: a model no stock architecture computes needs no install advice
        import transformers  # noqa: F401
    except ImportError:
        raise ValueError('exporting needs transformers: pip install transformers') from None
    eot = (lm.tokenizer or {}).get('eot_token')
    hf = hf_model(lm.model, lm.bos, eot)
    tokenizer, note = hf_tokenizer(lm.tokenizer, config.block_size)
    try:
        diff = write_folder(lm, hf, tokenizer, out)
    except ValueError:
        raise
    except Exception as e:   # safetensors reports a full disk as a SafetensorError, not an OSError
        if disk_full(e):
            raise ValueError(f"--out {out}: {disk_full_text(os.path.join(out, 'model.safetensors'))}") from None
        if not isinstance(e, OSError):
            raise
        raise ValueError(f"--out {out}: cannot write it ({e.strerror or type(e).__name__}: {e.filename or out}); "
                         f"choose a folder you can write to") from None
    return name, diff, note


def write_folder(lm, hf, tokenizer, out):
    """Write hf (and tokenizer) into a new temporary folder beside out, marked as export_hf.py's from its creation
    (fileio.temporary_folder: a killed export's leftover the next export of out removes), check it, list its files
    in the mark (what --force may replace later), then rename it to out, or move its files into an earlier export
    (replace_files). Removing the temporary folder on failure removes only what this run wrote. Returns the max
    |logit difference|."""
    parent, name = os.path.dirname(os.path.abspath(out)), os.path.basename(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    remove_temporaries(parent, [name, f'.{name}.*'], PROGRAM)   # exports of out killed before their rename (marked)
    tmp = temporary_folder(os.path.join(parent, name), PROGRAM)
    try:
        hf.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
            problem = tokenizer_mismatch(lm.tokenizer, load_tokenizer(f'hf:{tmp}').record())
            if problem:
                raise ValueError(f"the written tokenizer does not reproduce the data's ids ({problem})")
        diff = logit_difference(lm.model, tmp)
        if not diff <= TOLERANCE:
            raise ValueError(f"the exported model's logits differ from the checkpoint's by {diff:.3g} > {TOLERANCE}")
        mark_folder(tmp, PROGRAM, files=True)
        check_output(out, '--out', folder=True, replace=PROGRAM)   # again: it may have changed since the start
        if os.path.isdir(out) and os.listdir(out):
            replace_files(tmp, out)
        else:
            os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return diff


def replace_files(new, out):
    """Move the export in folder `new` into `out`, an earlier export (fileio.own_files): each file it writes replaces
    the old one, the old export's other files are removed, anything else in out stays. A name out holds that the old
    export did not write is a one-line ValueError before anything moves. The mark lists both exports' files until the
    last step, so a kill at any moment leaves a folder whose files are each the old export's, the new one's or not
    export_hf.py's, and which the next --force replaces again."""
    own = own_files(out, PROGRAM)
    with open(os.path.join(new, MARK)) as f:
        listed = f.read().splitlines()[1:]
    files = [line.partition('  ')[2] for line in listed]
    theirs = [n for n in files if os.path.lexists(os.path.join(out, n)) and n not in own]
    if theirs:
        raise ValueError(f"--out {out} holds {theirs[0]}, which {PROGRAM} did not write and this export would "
                         f"replace: move it away, or choose another --out")
    with open(os.path.join(out, MARK)) as f:
        old = f.read().splitlines()[1:]
    with atomic_write(os.path.join(out, MARK)) as f:
        f.write('\n'.join([PROGRAM, *old, *listed]) + '\n')
    for name in files:
        os.makedirs(os.path.dirname(os.path.join(out, name)), exist_ok=True)
        os.replace(os.path.join(new, name), os.path.join(out, name))
    for name in own:
        if name not in files:
            os.remove(os.path.join(out, name))
    os.replace(os.path.join(new, MARK), os.path.join(out, MARK))


@torch.no_grad()
def logit_difference(model, folder, seed=0):
    """max |logits of model - logits of the transformers model in folder| on one random sequence of block_size."""
    import transformers
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True).eval()
    c = model.config
    idx = torch.randint(0, c.vocab_size, (1, c.block_size), generator=torch.Generator().manual_seed(seed))
    return float((model(idx)[0] - hf(idx, use_cache=False).logits).abs().max())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument('--ckpt', required=True, type=path_arg,
                   help='train.py checkpoint (ckpt.pt, best.pt, ckpt_<iter>.pt) or its folder')
    p.add_argument('--out', required=True, type=path_arg, help='the Hugging Face folder to write')
    p.add_argument('--force', action='store_true', help='replace --out when it exists')
    args = p.parse_args(argv)
    try:
        name, diff, note = export(args.ckpt, args.out, args.force)
    except ValueError as e:
        sys.exit(f'export_hf.py: error: {e}')
    tok = 'with the tokenizer' if note is None else f'without a tokenizer ({note})'
    print(f"wrote {args.out}: {name} {tok}; logits within {diff:.2g} of the checkpoint's")


if __name__ == '__main__':
    run_script(main)
