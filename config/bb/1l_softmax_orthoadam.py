# Guo et al.'s Bigram-Backcopy, 1 layer(s): softmax, OrthoAdam (Adam on gradients in a fixed rotated basis).
include('base.py')
n_layer = 1
out_dir = 'out/bb/1l_softmax_orthoadam'
optimizer = 'orthoadam'
