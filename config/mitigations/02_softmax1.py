# Mitigations, row 2: softmax-1 (the paper).
include('base.py')
out_dir = 'out/mitigations/02_softmax1'
attn = 'softmax1'
