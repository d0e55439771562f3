# Mitigations, row 5: sigmoid attention (Ramapuram et al., 2024) with bias -log(block_size).
include('base.py')
out_dir = 'out/mitigations/05_sigmoid'
attn, sigmoid_bias = 'sigmoid', None
