# 3 layers, softmax attention, Adam at LR 2e-3 (base.py): where the residual peak should grow.
include('base.py')
out_dir = 'out/bb/pilots/3l_adam'
