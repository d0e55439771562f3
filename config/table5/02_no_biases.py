# Table 5, row 2: no biases, absolute, LayerNorm, Adam, softmax.
include('base.py')
out_dir = 'out/table5/02_no_biases'
