# Table 5, row 14: OrthoAdam, LayerNorm, softmax-1.
include('base.py')
out_dir = 'out/table5/14_orthoadam_layernorm'
attn, optimizer = 'softmax1', 'orthoadam'
