# 3 layers, softmax attention, OrthoAdam at Adam's LR 2e-3: the paper's fix for outliers made by Adam's per-coordinate
# moments.
include('base.py')
out_dir = 'out/bb/pilots/3l_orthoadam'
optimizer = 'orthoadam'
