# Mitigations, row 4: gated attention (Bondarenko et al., 2023), one sigmoid gate per head and token, initialised at 0.25.
include('base.py')
out_dir = 'out/mitigations/04_gated'
attn = 'gated'
