# Mitigations table (ours, not the paper's): every published fix of attention sinks and outlier activations
# on one model, data and budget. GPT-2 130M in the paper's architecture (RMSNorm-S, no biases, absolute
# positions), softmax + Adam, Table 5's budget: 40k steps of 512 x 256 tokens (5B), 2000 warmup.
# Every row includes this file and states only its differences.
include('../gpt2_130m.py')
warmup_iters, max_iters = 2000, 40_000
