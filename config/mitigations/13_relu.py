# Mitigations, row 13: ReLU attention (Guo et al., 2024), ReLU(s_ij) / i with i the query's position: weights that are
# not normalised (a row may sum to less or more than 1, or be all 0), so a query may attend nowhere without a sink.
include('base.py')
out_dir = 'out/mitigations/13_relu'
attn = 'relu'
