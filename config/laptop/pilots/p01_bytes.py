# Laptop pilot 1: the base as it is (bytes of the pinned corpus, a BOS at position 0, T = 256, 4 x 256, LR 2e-3, beta2 0.95).
include('base.py')
max_iters, eval_interval = 1500, 750   # the pilots' length (the base trains 900)
out_dir = 'out/laptop/pilots/p01_bytes'
