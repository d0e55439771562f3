# Guo et al.'s Bigram-Backcopy, 3 layer(s): softmax-1, Adam.
include('base.py')
n_layer = 3
out_dir = 'out/bb/3l_softmax1_adam'
attn = 'softmax1'
