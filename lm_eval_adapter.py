"""Score a train.py checkpoint the way EleutherAI's lm-evaluation-harness scores a causal LM, with the data's tokenizer.

    pip install lm_eval        # optional, not in requirements.txt; the tasks download their data sets
    python lm_eval_adapter.py --ckpt out/x --tasks hellaswag,lambada_openai --json results/x_lm_eval.json
    python lm_eval_adapter.py --ckpt out/x --tasks hellaswag --limit 200 --num_fewshot 0
    python lm_eval_adapter.py --ckpt out/x --tasks my_task --include_path my_tasks/    # task YAML files of your own
    python lm_eval_adapter.py --ckpt out/x --data data/wikitext2 --json x_wt2.json    # no lm_eval: whole-document ppl

The two scoring functions are plain functions of a loaded model (runs.load_model) and a tokenizer
(tokenizer.Tokenizer); lm_eval only wraps them (harness_model):
  loglikelihood(lm, tok, pairs)       per (context, continuation): (sum of the continuation tokens' log-probabilities,
      whether greedy decoding produces every one of them). As lm_eval does for causal models: trailing whitespace of
      the context moves to the continuation; the continuation's tokens are those of encode(context + continuation)
      after the first len(encode(context)); an empty context becomes the prefix token; a sequence longer than the
      block size keeps its last block_size + 1 tokens.
  loglikelihood_rolling(lm, tok, texts)  per text: the log-likelihood of all its tokens, each predicted once, in
      windows of block_size predictions (rolling_windows: the first conditioned on the prefix token, each later one
      on the tokens before it so that every window is full length), as lm_eval's get_rolling_token_windows with
      context_len=1. rolling_nll runs the same windows over a prepared folder's val documents (--data).
Prefix token: the checkpoint's BOS (windows='document': the data's eot), else the tokenizer's eot (every training
document follows one). With a BOS, it is also put before every context, as analyze.py does. Batches are sorted by
length and right-padded. A model with a free prefix (causal_free_prefix = k > 0: its first k positions see each other)
runs one sequence at a time (padding inside the prefix would be seen), and a token at position j < k, which the
full pass would show to the position that predicts it, is scored by its own pass over the j tokens before it
(what train.py's loss leaves out, the harness still asks for). generate_until (generation tasks) is refused: the
tokenizers here encode but do not decode.

--json: with --tasks, lm_eval's {"results", "versions", "n-shot", "configs"} plus "model" and "block_size"; with
--data, {"model", "data", "documents", "predicted_tokens", "nll", "ppl", "block_size", "prefix_token"}.
"""
from harness.entry import early_exit_on_signal   # first: a signal while torch loads is one line, not a traceback
early_exit_on_signal(__name__)

import argparse
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

from harness import devices, measure, runs
from harness.dataset import iter_documents
from harness.entry import run_script
from harness.fileio import PrepareError, Progress, check_output, model_label, number, path_arg, write_json
from harness.tokenizer import load_tokenizer, tokenizer_mismatch


def prefix_token(lm, eot):
    return lm.bos if lm.bos is not None else eot


def encode_pair(encode, context, continuation):
    """(context ids, continuation ids) of a non-empty context, split as lm_eval splits them for causal models."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole, head = list(encode(context + continuation)), list(encode(context))
    return head, whole[len(head):]


def score(lm, requests, batch_size=8):
    """(sum of log p(continuation | context), greedy) per (context ids, continuation ids): one forward pass over
    (context + continuation)[-(block_size + 1):][:-1] each, batched by length."""
    T = lm.block_size
    free = getattr(getattr(lm.model, 'config', None), 'causal_free_prefix', 0)
    if free:
        batch_size = 1
    device = next(lm.model.parameters()).device
    order = sorted(range(len(requests)), key=lambda i: -(len(requests[i][0]) + len(requests[i][1])))
    results = [None] * len(requests)
    for start in range(0, len(order), batch_size):
        part = order[start:start + batch_size]
        inputs, conts = [], []
        for i in part:
            context, continuation = requests[i]
            if len(continuation) > T:
                raise ValueError(f"a continuation of {len(continuation)} tokens is longer than the block size {T}")
            inputs.append((list(context) + list(continuation))[-(T + 1):][:-1])
            conts.append(list(continuation))
        idx = torch.zeros(len(part), max(map(len, inputs)), dtype=torch.long)
        for row, ids in enumerate(inputs):
            idx[row, :len(ids)] = torch.tensor(ids)
        logp = F.log_softmax(measure.forward(lm, idx.to(device)).float(), dim=-1).cpu()
        for row, (i, ids, cont) in enumerate(zip(part, inputs, conts)):
            if not cont:
                results[i] = (0.0, True)
                continue
            first = len(ids) - len(cont)
            rows = logp[row, first:len(ids)].clone()
            for t in range(first, min(free - 1, len(ids))):     # position t sees token t + 1 inside the free prefix
                rows[t - first] = F.log_softmax(measure.forward(lm, idx[row:row + 1, :t + 1].to(device))[0, t].float(),
                                                dim=-1).cpu()
            target = torch.tensor(cont)
            results[i] = (float(rows.gather(1, target[:, None]).sum()), bool((rows.argmax(-1) == target).all()))
    return results


def loglikelihood(lm, tok, pairs, batch_size=8):
    """[(log p(continuation | context), greedy)] for (context, continuation) strings (see the module docstring)."""
    prefix, requests = prefix_token(lm, tok.eot_token), []
    for context, continuation in pairs:
        if context == '':
            cont = [int(i) for i in tok.encode(continuation)]
            requests.append(([prefix], cont) if not cont or cont[0] != prefix else (cont[:1], cont[1:]))
            continue
        head, cont = encode_pair(tok.encode, context, continuation)
        bos = [lm.bos] if lm.bos is not None else []
        requests.append((bos + [int(i) for i in head], [int(i) for i in cont]))
    return score(lm, requests, batch_size)


def rolling_windows(tokens, prefix, block_size):
    """(context ids, continuation ids) windows predicting every token once: [prefix] -> tokens[:T], then each next
    block of up to T tokens after the T + 1 - len(block) tokens before it (T = block_size)."""
    T, n = block_size, len(tokens)
    windows, done = ([([prefix], list(tokens[:T]))] if n else []), min(T, n)
    while done < n:
        end = min(done + T, n)
        windows.append((list(tokens[end - T - 1:done]), list(tokens[done:end])))
        done = end
    return windows


def rolling_nll(lm, documents, prefix, batch_size=8):
    """(sum of log-likelihoods per document, in order), each document's tokens scored in rolling_windows."""
    documents = [[int(i) for i in doc] for doc in documents]
    windows = [(d, w) for d, doc in enumerate(documents) for w in rolling_windows(doc, prefix, lm.block_size)]
    totals = [0.0] * len(documents)
    for (d, _), (logp, _) in zip(windows, score(lm, [w for _, w in windows], batch_size)):
        totals[d] += logp
    return totals


def loglikelihood_rolling(lm, tok, texts, batch_size=8):
    """[log-likelihood of each whole text], conditioned on the prefix token (see the module docstring)."""
    return rolling_nll(lm, [tok.encode(t) for t in texts], prefix_token(lm, tok.eot_token), batch_size)


def data_perplexity(lm, data_dir, max_docs=None, batch_size=8, chunk_docs=64):
    """Whole-document perplexity of a prepared folder's val split: every token of every document predicted once,
    in rolling windows. Returns a dict (the --json format with --data)."""
    meta = measure.check_data(data_dir, lm)
    prefix = prefix_token(lm, meta['eot_token'])
    nll, count, docs, chunk = 0.0, 0, 0, []
    progress = Progress(f"{lm.name} rolling ppl", target_docs=min(max_docs or math.inf, meta['splits']['val']['documents']))

    def flush():
        nonlocal nll
        nll -= sum(rolling_nll(lm, chunk, prefix, batch_size))
        chunk.clear()
    for doc in iter_documents(data_dir, 'val', max_docs):
        chunk.append(doc)
        count, docs = count + len(doc), docs + 1
        if len(chunk) == chunk_docs:
            flush()
            progress.update(docs, count)
    flush()
    progress.update(docs, count)   # the last chunk, shorter than chunk_docs, counts too
    progress.done()
    if count == 0:
        raise ValueError(f"{data_dir}: the val documents hold no tokens")
    return {'model': lm.name, 'data': data_dir, 'documents': docs, 'predicted_tokens': count, 'nll': nll / count,
            'ppl': math.exp(nll / count) if nll / count < 700 else math.inf, 'block_size': lm.block_size,
            'prefix_token': prefix}


def harness_model(lm, tok, batch_size=8):
    """An lm_eval.api.model.LM whose loglikelihood and loglikelihood_rolling are the functions above."""
    from lm_eval.api.model import LM

    class CheckpointLM(LM):
        def loglikelihood(self, requests, disable_tqdm=False):
            return loglikelihood(lm, tok, [r.args for r in requests], batch_size)

        def loglikelihood_rolling(self, requests, disable_tqdm=False):
            return loglikelihood_rolling(lm, tok, [r.args[0] for r in requests], batch_size)

        def generate_until(self, requests, disable_tqdm=False):
            raise NotImplementedError("lm_eval_adapter.py scores loglikelihood tasks only (e.g. hellaswag, "
                                      "lambada_openai, piqa, arc_easy, wikitext); generation needs a decoding tokenizer")
    return CheckpointLM()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument('--ckpt', required=True, type=path_arg,
                   help='train.py checkpoint (ckpt.pt, best.pt, ...) or its folder')
    p.add_argument('--tasks', help='comma-separated lm_eval tasks, e.g. hellaswag,lambada_openai (needs lm_eval)')
    p.add_argument('--data', type=path_arg,
                   help='instead of --tasks: a prepared folder (prepare_c4.py); whole-document perplexity '
                                  'of its val split, no lm_eval needed')
    p.add_argument('--include_path', metavar='DIR', type=path_arg, help='lm_eval: a folder of task YAML files of your own')
    p.add_argument('--num_fewshot', type=number(int, 0), default=None,
                   help='lm_eval: few-shot examples (default: the task\'s)')
    p.add_argument('--limit', type=number(float, 0, low_open=True), default=None,
                   help='lm_eval: examples per task (a fraction if < 1, else a whole number)')
    p.add_argument('--max_docs', type=number(int, 0), default=0, help='--data: first N val documents (0 = all)')
    p.add_argument('--batch_size', type=number(int, 1), default=8, help='sequences per forward pass')
    p.add_argument('--device', default='auto', help="'auto' (cuda if available), 'cpu', 'cuda', 'cuda:1', ...")
    p.add_argument('--json', metavar='PATH', type=path_arg, help='write the results (format: see above)')
    args = p.parse_args(argv)   # the numbers are checked where they are parsed (fileio.number)
    if bool(args.tasks) == bool(args.data):
        p.error('give either --tasks (lm_eval) or --data (a prepared folder)')
    try:
        harness = [f'--{k}' for k in ('limit', 'num_fewshot', 'include_path') if getattr(args, k) is not None]
        if args.data and harness:   # each would be ignored without a word
            raise ValueError(f"{', '.join(harness)} {'is' if len(harness) == 1 else 'are'} lm_eval's (with --tasks); "
                             f"--data scores every val document: use --max_docs N for fewer")
        if args.tasks and args.max_docs:
            raise ValueError("--max_docs is --data's; with --tasks use --limit N (examples per task)")
        if args.limit is not None and args.limit >= 1 and args.limit != int(args.limit):
            raise ValueError(f"--limit {args.limit:g}: a fraction below 1, or a whole number of examples")
        if args.include_path is not None and not os.path.isdir(args.include_path):
            raise ValueError(f"--include_path {args.include_path}: no such folder (a folder of task YAML files)")
        if args.tasks:
            try:
                import lm_eval
            except ImportError:
                raise ValueError('--tasks needs lm-evaluation-harness: pip install lm_eval (or use --data DIR)') from None
        device = devices.choose_device(args.device)
        if args.json:
            check_output(args.json, '--json', inputs=runs.read_paths([args.ckpt], [args.data], [args.include_path]),
                         make=True)
        runs.check_ckpt(args.ckpt)      # a local path gets a local answer, not the Hugging Face download hint
        lm = runs.load_model(args.ckpt, device)
        if lm.kind != 'ours':
            raise ValueError(f"{args.ckpt} is not a train.py checkpoint (lm_eval's own hf model runs Hugging Face models)")
        if args.data:
            result = data_perplexity(lm, args.data, args.max_docs or None, args.batch_size)
            print(f"{args.data} val: {result['documents']:,} documents, {result['predicted_tokens']:,} tokens, whole "
                  f"documents in windows of {lm.block_size}: ppl {result['ppl']:.4f}")
        else:
            if not (lm.tokenizer or {}).get('name'):
                raise ValueError(f"{args.ckpt} records no tokenizer; lm_eval's tasks need the one its data was made with")
            try:
                tok = load_tokenizer(lm.tokenizer['name'])
            except PrepareError as e:
                raise ValueError(str(e)) from None
            problem = tokenizer_mismatch(lm.tokenizer, tok.record())   # e.g. a .tiktoken file edited since
            if problem:
                raise ValueError(f"{args.ckpt}: {lm.tokenizer['name']} as loaded here is not the tokenizer its data "
                                 f"was prepared with ({problem})")
            from lm_eval.tasks import TaskManager
            out = lm_eval.simple_evaluate(model=harness_model(lm, tok, args.batch_size), tasks=args.tasks.split(','),
                                          num_fewshot=args.num_fewshot,
                                          limit=int(args.limit) if args.limit and args.limit >= 1 else args.limit,
                                          task_manager=TaskManager(include_path=args.include_path))
            from lm_eval.utils import make_table
            print(make_table(out))
            result = {k: out.get(k) for k in ('results', 'versions', 'n-shot', 'configs')}
            result.update(model=model_label(args.ckpt), block_size=lm.block_size)
        if args.json:
            write_json(args.json, json.loads(json.dumps(result, default=str)))
    except ValueError as e:
        sys.exit(f'lm_eval_adapter.py: error: {e}')


if __name__ == '__main__':
    run_script(main)
