# Table 5, row 7: RMSNorm-S (one learnt scale), softmax-1, Adam.
include('base.py')
out_dir = 'out/table5/07_rmsnorm_s'
attn, norm = 'softmax1', 'rmsnorm_single'
