# Settings every run of the paper shares (Appendix A); the size files include this and add their own.
# GPT-2 here is the paper's variant: RMSNorm-S (one learnt scale), no biases, learnt absolute positions.
dataset = 'c4'
block_size = 256                       # training sequence length (Table 6 varies it)
bias, norm, pos_emb, mlp = False, 'rmsnorm_single', 'absolute', 'gelu'
learning_rate, min_lr = 1e-3, 1e-4     # peak lr; cosine to 10% of it after a linear warmup
weight_decay = 0.0                     # Adam, not AdamW
