# The SGD pilot of the laptop Table 5 (docs/reproducing.md, "Table 5, the mitigations and where quantisation breaks"): rows 9 and 10
# (softmax-1, RMSNorm-S, SGD with momentum 0.9 or none) at the laptop setting, the first 400 steps of the 8,000 that
# the rows train (2x the base's 4,000: the cosine is the rows' own, lr_decay_iters = 8,000), no weight decay (torch's
# SGD couples it to the gradient). Run over a grid of learning rates, one folder each:
#   python train.py config/laptop/pilots/sgd.py --momentum=0.9 --learning_rate=0.1 --out_dir=out/laptop/pilots/sgd_m0.9_lr0.1
# and the LR with the lowest validation loss at step 400 becomes harness/recipe.py's LAPTOP_SGD_LR for that momentum.
include('../base.py')
out_dir = 'out/laptop/pilots/sgd'
attn, optimizer, momentum, weight_decay = 'softmax1', 'sgd', 0.9, 0.0
learning_rate, min_lr = 0.1, 0.0   # min_lr: a tenth of the LR in the rows; the pilot stops long before it matters
max_iters, lr_decay_iters = 400, 8000
eval_interval, probe_interval = 200, 200
