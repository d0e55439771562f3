# Mitigations, row 12: softpick (Zuhri et al., 2025), ReLU(exp(s_i) - 1) / (sum_j |exp(s_j) - 1| + eps): weights that
# need not sum to 1 and can be exactly 0, so a query may attend nowhere without a sink.
include('base.py')
out_dir = 'out/mitigations/12_softpick'
attn = 'softpick'
