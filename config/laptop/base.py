# The laptop scale (python reproduce.py table2 table3 / table5 / mitigations --scale laptop): GPT-2 60M's
# architecture and recipe (RMSNorm-S, no biases, absolute positions, GELU, Adam with a cosine schedule) at the size
# two CPU cores train in about an hour a row, two rows at a time, with the settings the pilots chose
# (docs/reproducing.md, "The laptop scale"). reproduce.py applies this file's differences from
# config/table2/gpt2_60m_vanilla.py to each row of Tables 2, 3 and 5 and the mitigations (harness/recipe.py).
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
# fp32, compiled: the same arithmetic on every CPU. bf16 is 2.5x fp32's speed only where the CPU computes it (AMX,
# AVX512-BF16); elsewhere it is emulated and 3.4x slower than fp32 (2026-11-29, a 2-core Ice Lake Xeon without either,
# one thread: fp32 compiled 4,750 tokens/s, fp32 eager 4,250, bf16 compiled 1,390; docs/performance.md), and a table
# whose numbers depend on the CPU's bf16 units is not the same table everywhere. 0.86 s a step there: ~1 h a row.
device, compile, dtype = 'cpu', True, 'float32'
