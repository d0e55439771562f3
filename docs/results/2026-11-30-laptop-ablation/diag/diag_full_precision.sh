#!/bin/bash
# Where the laptop models' per-tensor penalty comes from: Table 2's vanilla and softmax-1 + OrthoAdam laptop
# checkpoints under coarse7..coarse4 with some layers in full precision (eval_quant.py --full_precision).
# Run from the repository root after `python reproduce.py table2 --scale laptop` (about 80 s a line).
set -euo pipefail
R=out/reproduce/laptop/runs
for keep in none "*.mlp.c_proj" "*.attn.c_proj" "*.c_proj" "*.c_attn,*.c_fc"; do
  tag=$(echo "$keep" | sed 's/\*\.//g; s/,/+/g; s/\./_/g')
  args=(); [ "$keep" != none ] && args=(--full_precision "$keep")
  python eval_quant.py --ckpt $R/table2-gpt2_60m_vanilla $R/table2-gpt2_60m_s1oa --schemes coarse7,coarse6,coarse5,coarse4 \
    --max_docs 200 --batch_size 1 "${args[@]}" --json diag/full_precision_$tag.json
done
