# Mitigations, row 3: clipped softmax (Bondarenko et al., 2023) with their BERT stretch factors
# (their OPT rule, gamma = -12 / T, gives -0.047 at T = 256).
include('base.py')
out_dir = 'out/mitigations/03_clipped'
attn, clip_gamma, clip_zeta = 'clipped', -0.025, 1.0
