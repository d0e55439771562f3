# Guo et al.'s Bigram-Backcopy, 3 layer(s): their ReLU attention (ReLU(s_ij) / i, no normalisation), Adam.
include('base.py')
n_layer = 3
out_dir = 'out/bb/3l_relu_adam'
attn = 'relu'
