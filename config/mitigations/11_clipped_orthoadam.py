# Mitigations, row 11: the pair that looked best in the CPU miniature: clipped softmax (lowest first-token
# attention of the attention-side fixes there) with OrthoAdam (the optimizer-side fix of the paper).
include('base.py')
out_dir = 'out/mitigations/11_clipped_orthoadam'
attn, clip_gamma, clip_zeta, optimizer = 'clipped', -0.025, 1.0, 'orthoadam'
