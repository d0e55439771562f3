# Guo et al.'s Bigram-Backcopy, 1 layer(s): softmax-1 and OrthoAdam.
include('base.py')
n_layer = 1
out_dir = 'out/bb/1l_softmax1_orthoadam'
attn, optimizer = 'softmax1', 'orthoadam'
