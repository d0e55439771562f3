# Table 5, row 13: OrthoAdam, RMSNorm-M, softmax-1.
include('base.py')
out_dir = 'out/table5/13_orthoadam_rmsnorm_m'
attn, norm, optimizer = 'softmax1', 'rmsnorm', 'orthoadam'
