# Mitigations, row 1: vanilla (softmax, Adam).
include('base.py')
out_dir = 'out/mitigations/01_vanilla'
