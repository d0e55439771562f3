# Table 5, row 5: softmax-1 (LayerNorm, Adam).
include('base.py')
out_dir = 'out/table5/05_softmax1'
attn = 'softmax1'
