# Guo et al.'s Bigram-Backcopy, 1 layer(s): SGD instead of Adam (their control: momentum 0.9, learning rate 0.03).
include('base.py')
n_layer = 1
out_dir = 'out/bb/1l_softmax_sgd'
optimizer, learning_rate, momentum, weight_decay = 'sgd', 0.03, 0.9, 0.0
