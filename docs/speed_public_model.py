"""Documents/s of analyze.py against a plain one-document-at-a-time transformers loop on the same documents
(docs/public-models.md, "Speed"). Run from the repository root:

    OMP_NUM_THREADS=1 python docs/speed_public_model.py MODEL.gguf data/pinned_cpu_smollm2 200 [BATCH]

(The "before" row of docs/public-models.md is commit 4d41310's analyze.py, which padded every batch: check that commit
out and run this file as it was there.)

Prints one JSON line per measurement: analysis (metrics + perplexity) and perplexity only (eval_quant's pass).
"""
import json
import math
import os
import sys
import time

sys.path.insert(0, os.getcwd())
import torch  # noqa: E402

from harness import measure  # noqa: E402
from harness.dataset import iter_documents  # noqa: E402
from harness.entry import run_script  # noqa: E402
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


def main():
    spec, data, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    batch = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    hf = load_hf(spec)
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
