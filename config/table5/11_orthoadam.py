# Table 5, row 11: OrthoAdam, RMSNorm-S, softmax-1 (the paper's method).
include('base.py')
out_dir = 'out/table5/11_orthoadam'
attn, norm, optimizer = 'softmax1', 'rmsnorm_single', 'orthoadam'
