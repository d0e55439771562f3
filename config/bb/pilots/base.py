# The residual-state peak in 3 layers (reproduce.py bb_pilots --scale laptop): Guo et al.'s 3-layer Bigram-Backcopy
# model, whose <s> norm after layer 0 grows about linearly in Adam steps at their LR of 3e-4 (24 -> 43 at 2,000 steps
# -> 141 at 10,000; SGD flat at 20-29), at a higher LR and batch 64 so that a CPU reaches the growth: 2,500 steps of
# 64 x 256 tokens (41 M), LR 2e-3 after 100 warm-up steps, then constant (docs/reproducing.md).
include('../base.py')
n_layer = 3
learning_rate, warmup_iters, decay_lr = 2e-3, 100, False
batch_size, gradient_accumulation_steps, max_iters = 64, 1, 2500
eval_interval, log_interval, probe_interval = 500, 100, 100
