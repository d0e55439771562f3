# Guo et al.'s Bigram-Backcopy, 3 layer(s): SGD instead of Adam (their control: momentum 0.9, learning rate 0.03).
include('base.py')
n_layer = 3
out_dir = 'out/bb/3l_softmax_sgd'
optimizer, learning_rate, momentum, weight_decay = 'sgd', 0.03, 0.9, 0.0
