# Table 5, row 9: SGD with momentum 0.9, RMSNorm-S, softmax-1; 8x the steps at peak lr 0.2 (Appendix A).
include('base.py')
out_dir = 'out/table5/09_sgd_momentum'
attn, norm = 'softmax1', 'rmsnorm_single'
optimizer, momentum = 'sgd', 0.9
learning_rate, min_lr = 0.2, 0.02
max_iters = 8 * 40_000
