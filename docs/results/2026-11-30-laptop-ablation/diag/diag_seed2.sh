#!/bin/bash
# Why both seed-2 models lose more at coarse6 than their seed-1337 twins: the seed-2 pair under coarse6 and coarse5 with
# the MLP output projections (all four, or layer 0's alone) in full precision. Run from the repository root.
set -euo pipefail
R=out/reproduce/laptop/runs
for keep in "*.mlp.c_proj" "transformer.h.0.mlp.c_proj"; do
  tag=$(echo "$keep" | sed 's/\*\.//g; s/,/+/g; s/\./_/g')
  python eval_quant.py --ckpt $R/laptop-seeds-vanilla_seed2 $R/laptop-seeds-s1oa_seed2 --schemes coarse6,coarse5 \
    --max_docs 200 --batch_size 1 --full_precision "$keep" --json diag/seed2_full_precision_$tag.json
done
