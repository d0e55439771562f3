# Table 5, row 6: RMSNorm-M (one learnt scale per channel), softmax-1, Adam.
include('base.py')
out_dir = 'out/table5/06_rmsnorm_m'
attn, norm = 'softmax1', 'rmsnorm'
