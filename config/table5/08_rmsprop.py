# Table 5, row 8: RMSProp (Adam with beta1 = 0: no momentum), RMSNorm-S, softmax-1.
include('base.py')
out_dir = 'out/table5/08_rmsprop'
attn, norm = 'softmax1', 'rmsnorm_single'
optimizer, momentum = 'rmsprop', 0.0
