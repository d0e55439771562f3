# Laptop pilot 1: the base as it is (bytes of the pinned corpus, a BOS at position 0, T = 256, 4 x 256, LR 2e-3, beta2 0.95).
include('../base.py')
out_dir = 'out/laptop/pilots/p01_bytes'
