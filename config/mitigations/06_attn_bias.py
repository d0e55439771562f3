# Mitigations, row 6: a learnt attention-bias key and value per head (Sun et al., 2024).
include('base.py')
out_dir = 'out/mitigations/06_attn_bias'
attn_bias = True
