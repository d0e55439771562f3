# 3 layers, softmax attention, SGD (their control: momentum 0.9, learning rate 0.03, no weight decay), the same warm-up.
include('base.py')
out_dir = 'out/bb/pilots/3l_sgd'
optimizer, learning_rate, momentum, weight_decay = 'sgd', 0.03, 0.9, 0.0
