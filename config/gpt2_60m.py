# GPT-2 ~60M (num_params() = 57,344,021 with the GPT-2 vocabulary): RMSNorm-S, no biases, absolute positions.
# Appendix A: 1000 warmup, 160k steps (21B tokens), batch 512 x 256, peak lr 1e-3.
out_dir = 'out/gpt2_60m'
dataset = 'c4'
n_layer, n_head, n_embd, block_size = 10, 8, 512, 256
bias, norm, pos_emb, mlp = False, 'rmsnorm_single', 'absolute', 'gelu'
batch_size, gradient_accumulation_steps = 64, 8
learning_rate, min_lr = 1e-3, 1e-4
warmup_iters, max_iters = 1000, 160_000
eval_interval = 2000
