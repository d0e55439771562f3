# Guo et al.'s Bigram-Backcopy, 1 layer(s): their ReLU attention (ReLU(s_ij) / i, no normalisation), Adam at their
# ReLU run's learning rate, 3e-3.
include('base.py')
n_layer = 1
out_dir = 'out/bb/1l_relu_adam'
attn = 'relu'
learning_rate = 3e-3
