# Laptop pilot 5: a constant learning rate of 2e-3 after the warmup instead of the cosine decay to 2e-4 (p01's first
# token kurtosis stopped growing once the cosine had brought the LR below about 6e-4; Guo et al. train at a constant LR).
include('base.py')
out_dir = 'out/laptop/pilots/p05_constlr'
decay_lr = False
