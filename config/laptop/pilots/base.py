# The base the laptop pilots (p01-p08) changed one lever of: config/laptop/base.py as it was until 2026-11-28 (fp32,
# the CPU subset's bytes, 900 steps), kept so that each pilot runs as it ran (docs/reproducing.md, "The laptop
# scale"). The laptop table's base since is ../base.py.
include('../../table2/gpt2_60m_vanilla.py')
out_dir = 'out/laptop/base'
dataset, windows = 'pinned_cpu_bytes', 'document'    # bytes of the pinned corpus, a BOS (eot) at position 0
n_layer, n_head, n_embd, block_size = 4, 4, 256, 256
batch_size, gradient_accumulation_steps = 16, 1
learning_rate, min_lr, beta2, weight_decay = 2e-3, 2e-4, 0.95, 0.1
warmup_iters, max_iters = 100, 900     # the pilots ran 1,500: kurtosis and peak grew until ~1,050 (docs/reproducing.md)
eval_interval, eval_tokens, log_interval = 450, 65_536, 50
probe_interval, probe_docs = 150, 16
device, compile, dtype = 'cpu', False, 'float32'
