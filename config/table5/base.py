# Table 5 (ablation): GPT-2 130M trained for 40k steps with 2000 warmup (5B tokens), Appendix A.
# Every row includes this file and states its differences: no biases, absolute positions, LayerNorm,
# Adam, softmax unless the row says otherwise.
include('../gpt2_130m.py')
norm = 'layernorm'
warmup_iters, max_iters = 2000, 40_000
