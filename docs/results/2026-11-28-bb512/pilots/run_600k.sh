#!/bin/bash
# run from the repository root (data/bb_guo_chain: prep_guochain.py; data/bb_shakespeare_600k: python -c "from pinned_corpus.prepare import prepare_bb_shakespeare as p; p('data/bb_shakespeare_600k', train_docs=600_000)")
OMP_NUM_THREADS=1 python train.py config/bb/1l_softmax_adam.py --dataset=bb_shakespeare_600k \
    --max_iters=300 --probe_interval=25 --eval_interval=300 --out_dir=out/bbpilot/pool600k_s1337 > out/bbpilot/pool600k_s1337.log 2>&1
