"""Generate text from a train.py checkpoint or a public model, decoding with a KV cache (nanoGPT's sample.py).

    python sample.py --ckpt out/main                                          # 3 samples of 200 new tokens
    python sample.py --ckpt out/main/best.pt --start "def main(" --temperature 0.8 --top_k 50
    python sample.py --ckpt out/main --start FILE:prompt.txt --num_samples 1 --max_new_tokens 500
    python sample.py --init_from hf:path/model.Q4_1.gguf --start "The capital of France is" --temperature 0
    python sample.py --init_from hf:gpt2 --start "Hello, I'm a language model,"  # cached Hugging Face weights

Models: --ckpt takes a train.py checkpoint (ckpt.pt, best.pt, or the out_dir holding ckpt.pt); its text tokenizer
is the one recorded with it (the checkpoint's "tokenizer", else its dataset's meta.json "tokenizer_info"), so a
model trained on bigram or byte data can be sampled only if that tokenizer can be loaded here. --init_from takes a
public model as analyze.py does (a Hugging Face name or folder from local files, or a GGUF file; "hf:" in front is
optional), copied into this repository's GPT (GPT.from_hf: GPT-2 and Llama families), with its own tokenizer.
Prompt: --start TEXT, or FILE:path for a file's contents (UTF-8). The model's BOS goes first when it has one, as
analyze.py --bos auto (ours trained with windows='document': the data's eot; Hugging Face models: the config's BOS,
except GPT-2); an empty prompt without a BOS starts from the document separator (eot), like nanoGPT's
'<|endoftext|>'. The printed samples leave that first token out; each ends with a line of 40 dashes, and
one line on stderr says how many tokens were generated, and how fast.
Decoding: the prompt in one forward pass (GPT.forward_cached), then one new token per pass over the KV cache; this
equals the full forward pass over the whole sequence (tests/test_sample.py). Once the sequence is longer than
block_size, the context is cropped to the last block_size tokens, as nanoGPT does, which means a fresh cache over
them at every step. --temperature 0 is greedy decoding (argmax); otherwise each token is drawn from
softmax(logits / temperature) over the --top_k most likely tokens (0 = all).
"""
from harness.entry import early_exit_on_signal   # first: a signal while torch loads is one line, not a traceback
early_exit_on_signal(__name__)

import argparse
import os
import sys
import time

import torch

from harness.devices import choose_device
from harness.entry import run_script
from harness.fileio import PrepareError, integer, number, path_arg
from harness.runs import check_ckpt, load_gpt
from harness.tokenizer import load_tokenizer


def next_token(logits, temperature=1.0, top_k=0, generator=None):
    """(B, 1) token ids from the last position's logits (B, vocab): argmax for temperature 0, else a draw from
    softmax(logits / temperature) restricted to the top_k largest (0 = every token)."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float('-inf'))
    return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)


@torch.no_grad()
def generate(model, idx, max_new_tokens, temperature=1.0, top_k=0, generator=None):
    """idx (B, T) followed by max_new_tokens generated tokens: the context's new tokens go through the KV cache; when
    the cache holds block_size tokens, the context is cropped to the last block_size tokens and a new cache starts."""
    block, sink = model.config.block_size, model.config.sink_token
    cache, new = None, idx[:, -block:]
    for step in range(max_new_tokens):
        if cache is not None and len(cache) - sink == block:   # no position left: crop and recompute
            cache, new = None, idx[:, -block:]
        logits, cache = model.forward_cached(new, cache)
        if not bool(torch.isfinite(logits[:, -1]).all()):   # multinomial would fail, argmax would pick a NaN
            broken = any(not bool(torch.isfinite(w).all()) for w in model.parameters())
            raise ValueError(f"the model's logits are NaN or Inf at generated token {step + 1}: "
                             f"{'its weights hold NaN or Inf' if broken else 'float32 overflows in its forward pass'}"
                             f" (a broken model, or one that diverged: sample an earlier checkpoint)")
        new = next_token(logits[:, -1], temperature, top_k, generator)
        idx = torch.cat((idx, new), dim=1)
    return idx


def text_tokenizer(lm):
    """The prepare_c4 Tokenizer (encode and decode) of a loaded model: its recorded tokenizer, or a one-line
    ValueError saying why there is none."""
    record = lm.tokenizer or {}
    if not record.get('name'):
        raise ValueError(f"{lm.name} records no tokenizer (neither the checkpoint nor its data's meta.json "
                         f"tokenizer_info): sample.py cannot turn text into its token ids")
    try:
        tok = load_tokenizer(record['name'])
    except PrepareError as e:
        raise ValueError(f"{lm.name} was trained with the tokenizer {record['name']!r}, which cannot be loaded here "
                         f"({e})") from None
    if tok.decode is None:
        raise ValueError(f"the tokenizer {record['name']!r} of {lm.name} cannot turn ids back into text")
    return tok


def prompt_ids(start, tok, bos):
    """Token ids of --start (text or FILE:path) with the model's BOS first, or the eot when there is neither."""
    if start.startswith('FILE:'):
        try:
            with open(start[5:], encoding='utf-8') as f:
                start = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"--start {start}: cannot read the file ({e})") from None
    ids = [int(i) for i in tok.encode(start)]
    first = bos if bos is not None else (None if ids else tok.eot_token)
    return ids if first is None else [first] + ids, first is not None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument('--ckpt', metavar='PATH', type=path_arg, help='a train.py checkpoint (ckpt.pt, best.pt or its out_dir)')
    p.add_argument('--init_from', metavar='NAME', type=path_arg,
                   help='a public model: hf:NAME_OR_DIR or hf:FILE.gguf (local files)')
    p.add_argument('--start', default='', help="the prompt: text, or FILE:path for a file's contents (default: empty)")
    p.add_argument('--num_samples', type=integer, default=3, help='samples to draw (default 3)')
    p.add_argument('--max_new_tokens', type=integer, default=200, help='tokens generated per sample (default 200)')
    p.add_argument('--temperature', type=float, default=0.8, help='0 = greedy; default 0.8')
    p.add_argument('--top_k', type=integer, default=200, help='sample among the k most likely tokens; 0 = all (default 200)')
    p.add_argument('--seed', type=number(int, 0, 2 ** 63 - 1, what=' (a 64-bit seed)'), default=1337,
                   help='random seed of the draws (default 1337)')
    p.add_argument('--device', default='auto', help="'auto' (cuda if available), 'cpu', 'cuda', 'cuda:1', ...")
    args = p.parse_args(argv)
    try:
        if (args.ckpt is None) == (args.init_from is None):
            raise ValueError("give one model: --ckpt PATH (a train.py checkpoint) or --init_from hf:NAME")
        for name in ('num_samples', 'max_new_tokens', 'top_k'):
            if getattr(args, name) < (1 if name == 'num_samples' else 0):
                raise ValueError(f"--{name} must be >= {1 if name == 'num_samples' else 0}, got {getattr(args, name)}")
        if not args.temperature >= 0 or args.temperature == float('inf'):
            raise ValueError(f"--temperature must be a finite number >= 0 (0 = greedy), got {args.temperature}")
        device = choose_device(args.device)
        if args.ckpt is not None:
            check_ckpt(args.ckpt)
            spec = args.ckpt
        else:
            spec = args.init_from[3:] if args.init_from.startswith('hf:') else args.init_from
            if not spec or (os.path.isfile(os.path.join(spec, 'ckpt.pt')) or spec.endswith('.pt')):
                raise ValueError(f"--init_from {args.init_from}: expected hf:NAME_OR_DIR or hf:FILE.gguf; a train.py "
                                 f"checkpoint goes to --ckpt")
        lm = load_gpt(spec, device)
        tok = text_tokenizer(lm)
        ids, first = prompt_ids(args.start, tok, lm.bos)
        if max(ids) >= lm.vocab_size:
            raise ValueError(f"the prompt has token id {max(ids)} >= vocab_size {lm.vocab_size} of {lm.name}: the "
                             f"tokenizer {tok.name} does not fit the model")
        prefix = lm.model.config.causal_free_prefix
        if len(ids) < prefix:
            raise ValueError(f"the prompt has {len(ids)} tokens, but the first {prefix} tokens of this model attend to "
                             f"each other (causal_free_prefix): give a longer --start")
        generator = torch.Generator(device).manual_seed(args.seed)
        idx = torch.tensor([ids], dtype=torch.long, device=device)
        t0 = time.time()
        for _ in range(args.num_samples):
            out = generate(lm.model, idx, args.max_new_tokens, args.temperature, args.top_k, generator)
            print(tok.decode(out[0, int(first):].tolist()))
            print('-' * 40, flush=True)
        dt = time.time() - t0
        print(f"{lm.name}: {args.num_samples} x {args.max_new_tokens} tokens after a prompt of {len(ids)} in "
              f"{dt:.1f} s ({args.num_samples * args.max_new_tokens / max(dt, 1e-9):,.1f} tokens/s)", file=sys.stderr)
    except ValueError as e:
        sys.exit(f'sample.py: error: {e}')


if __name__ == '__main__':
    run_script(main)
