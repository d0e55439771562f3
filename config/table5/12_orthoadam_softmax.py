# Table 5, row 12: OrthoAdam, RMSNorm-S, softmax.
include('base.py')
out_dir = 'out/table5/12_orthoadam_softmax'
norm, optimizer = 'rmsnorm_single', 'orthoadam'
