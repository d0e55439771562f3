# Laptop pilot 4: context 512 instead of 256, at the same tokens per step (longer context: stronger sinks, Barbero et
# al. 2025; Gu et al.'s window experiments).
include('base.py')
out_dir = 'out/laptop/pilots/p04_ctx512'
block_size, batch_size = 512, 8
