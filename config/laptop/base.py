# The laptop scale of Table 2 (python reproduce.py table2 table3 --scale laptop): GPT-2 60M's architecture and recipe
# (RMSNorm-S, no biases, absolute positions, GELU, Adam with a cosine schedule) at the size two CPU cores train in
# about 35 minutes a row, with the settings the pilots chose (docs/reproducing.md, "The laptop scale"). reproduce.py
# applies this file's differences from config/table2/gpt2_60m_vanilla.py to each of Table 2's 60M rows.
include('../table2/gpt2_60m_vanilla.py')
out_dir = 'out/laptop/base'
# bytes of the pinned corpus's laptop subset (45,036 train documents; a fresh clone builds it from 169 MB of registry
# artifacts in about 2 minutes: docs/data.md), a BOS (eot) at position 0 of every window: 4,000 steps of 16 read
# 64,000 document starts, each about 1.4 times (pilots 7 and 8, on the archive subset's 44,932: text that repeats
# less grows the first token's kurtosis more)
dataset, windows = 'pinned_laptop_bytes', 'document'
n_layer, n_head, n_embd, block_size = 4, 4, 256, 256
batch_size, gradient_accumulation_steps = 16, 1
# weight decay 0.1 on matrices: lr x wd = 2e-4 a step at the peak, below the band where Gu et al.'s sink collapses
# (8e-4 and more a step); pilot 3's 0.5 (1e-3 a step) lowered the kurtosis
learning_rate, min_lr, beta2, weight_decay = 2e-3, 2e-4, 0.95, 0.1
warmup_iters, max_iters = 100, 4000   # p08's 1,800 steps reached kurtosis 17 and were still rising; bf16 buys more
eval_interval, eval_tokens, log_interval = 1000, 65_536, 100
probe_interval, probe_docs = 250, 16
# bf16 autocast with fp32 weights and optimizer state, compiled: 2.50x fp32 eager's tokens/s on one core here
# (bench.py --sections bf16; eager bf16 2.06x: compile fuses the norms, GELU and casts around the matmuls);
# on a CPU without AMX or AVX512-BF16 bf16 is emulated, 3x slower than fp32: run it with --dtype=float32
device, compile, dtype = 'cpu', True, 'bfloat16'
