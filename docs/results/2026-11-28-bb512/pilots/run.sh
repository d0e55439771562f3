#!/bin/bash
# BB pilots: seed and dtype at Guo et al.'s batch (512 = 64 x 8), 300 steps, probe every 50 on 64 val docs
# run from the repository root (data/bb_guo_chain: prep_guochain.py; data/bb_shakespeare_600k: python -c "from pinned_corpus.prepare import prepare_bb_shakespeare as p; p('data/bb_shakespeare_600k', train_docs=600_000)")
run() {  # name dtype seed
  OMP_NUM_THREADS=1 python train.py config/bb/1l_softmax_adam.py --batch_size=64 --gradient_accumulation_steps=8 \
    --dtype=$2 --seed=$3 --max_iters=300 --probe_interval=50 --probe_docs=64 --eval_interval=300 \
    --out_dir=out/bbpilot/$1 > out/bbpilot/$1.log 2>&1
}
(run bf16_s1337 bfloat16 1337; run bf16_s1 bfloat16 1; run bf16_s2 bfloat16 2) &
(run fp32_s1337 float32 1337) &
wait
