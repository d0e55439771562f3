"""Documents/s of analyze.py against a plain one-document-at-a-time transformers loop on the same documents
(docs/public-models.md, "Speed"):

    OMP_NUM_THREADS=1 python docs/speed_public_model.py MODEL.gguf data/pinned_cpu_smollm2 200 [BATCH]

(The "before" row of docs/public-models.md is commit 4d41310's analyze.py, which padded every batch: check that commit
out and run this file as it was there.)

Prints one JSON line per measurement: analysis (metrics + perplexity) and perplexity only (eval_quant's pass).
"""
import argparse
import json
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository: this file is docs/...
sys.path.insert(0, ROOT)
from harness.entry import early_exit_on_signal  # noqa: E402   first: a signal while torch loads is one line
early_exit_on_signal(__name__)

import torch  # noqa: E402

from harness import measure  # noqa: E402
from harness.dataset import iter_documents, load_meta  # noqa: E402
from harness.entry import run_script  # noqa: E402
from harness.fileio import number, path_arg  # noqa: E402
from harness.runs import wrap_hf  # noqa: E402
from model import load_hf  # noqa: E402


def report(name, seconds, ppl, n):
    print(json.dumps(dict(name=name, docs=n, seconds=round(seconds, 1), docs_per_s=round(n / seconds, 3), ppl=ppl)),
          flush=True)


def loop(hf, spec, data, n, analysis):
    """The plain loop: one document per forward pass, block outputs by hooks, the same metrics (Stats)."""
    lm = wrap_hf(hf, spec)
    stats, nll, count, t = None, 0.0, 0, time.time()
    with torch.no_grad():
        for doc in iter_documents(data, 'val', n):
            ids = torch.tensor([[lm.bos] + doc.tolist()])[:, :lm.block_size]
            hidden = []
            hooks = [b.register_forward_hook(lambda m, i, o: hidden.append(o[0] if isinstance(o, tuple) else o))
                     for b in measure.hf_blocks(hf)] if analysis else []
            out = hf(ids, output_attentions=analysis, use_cache=False)
            for h in hooks:
                h.remove()
            if analysis:
                stats = stats or measure.Stats(len(hidden), out.attentions[0].size(1))
                stats.update(hidden, list(out.attentions), torch.ones_like(ids, dtype=torch.bool))
            nll += torch.nn.functional.cross_entropy(out.logits[0, :-1], ids[0, 1:], reduction='sum').item()
            count += ids.size(1) - 1
    return time.time() - t, math.exp(nll / count)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('model', type=path_arg, help='a Hugging Face name or folder, or a .gguf file (local files only)')
    p.add_argument('data', type=path_arg, help="a prepared data folder in the model's vocabulary")
    p.add_argument('n', type=number(int, low=1), help='validation documents (100000, 100_000 or 1e5 alike)')
    p.add_argument('batch', nargs='?', type=number(int, low=1), default=1,
                   help="analyze.py's and eval_quant.py's documents per forward pass (default 1)")
    args = p.parse_args(argv)
    spec, data, n, batch = args.model, args.data, args.n, args.batch
    try:   # the data, then the model, then the two together: one line each, before anything is timed
        load_meta(data)
        hf = load_hf(spec)
        measure.check_data(data, wrap_hf(hf, spec))
    except ValueError as e:
        sys.exit(f"speed_public_model.py: error: {e}")
    report('plain loop, analysis', *loop(hf, spec, data, n, True), n)
    lm = wrap_hf(hf, spec)
    t = time.time()
    result, _ = measure.analyze(lm, data, n, batch, 'cpu')
    report(f'analyze.py, batch {batch}', time.time() - t, result['ppl'], n)
    report('plain loop, perplexity only', *loop(hf, spec, data, n, False), n)
    t = time.time()
    ppl = measure.perplexity(lm, data, n, batch, 'cpu')
    report(f'eval_quant.py full-precision pass, batch {batch}', time.time() - t, ppl, n)


if __name__ == '__main__':
    run_script(main)
