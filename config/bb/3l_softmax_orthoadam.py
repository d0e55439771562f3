# Guo et al.'s Bigram-Backcopy, 3 layer(s): softmax, OrthoAdam (Adam on gradients in a fixed rotated basis).
include('base.py')
n_layer = 3
out_dir = 'out/bb/3l_softmax_orthoadam'
optimizer = 'orthoadam'
