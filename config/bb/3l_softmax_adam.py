# Guo et al.'s Bigram-Backcopy, 3 layer(s): softmax attention, Adam (their main run).
include('base.py')
n_layer = 3
out_dir = 'out/bb/3l_softmax_adam'
