# Laptop pilot 4: context 512 instead of 256, at the same tokens per step (longer context: stronger sinks, Barbero et
# al. 2025; Gu et al.'s window experiments).
include('../base.py')
max_iters, eval_interval = 1500, 750   # the pilots' length (the base trains 900)
out_dir = 'out/laptop/pilots/p04_ctx512'
block_size, batch_size = 512, 8
