# Table 5, row 1: biases, absolute, LayerNorm, Adam, softmax.
include('base.py')
out_dir = 'out/table5/01_biases'
bias = True
