# Mitigations, row 10: softmax-1 + OrthoAdam (the paper's method).
include('base.py')
out_dir = 'out/mitigations/10_softmax1_orthoadam'
attn, optimizer = 'softmax1', 'orthoadam'
