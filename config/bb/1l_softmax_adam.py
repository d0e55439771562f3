# Guo et al.'s Bigram-Backcopy, 1 layer(s): softmax attention, Adam (their main run).
include('base.py')
n_layer = 1
out_dir = 'out/bb/1l_softmax_adam'
