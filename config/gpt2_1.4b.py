# GPT-2 ~1.4B (num_params() = 1,436,614,753 with the GPT-2 vocabulary): RMSNorm-S, no biases, absolute positions.
# Appendix A: 10000 warmup, 600k steps (79B tokens), batch 512 x 256, peak lr 1e-3.
out_dir = 'out/gpt2_1.4b'
dataset = 'c4'
n_layer, n_head, n_embd, block_size = 48, 24, 1536, 256
bias, norm, pos_emb, mlp = False, 'rmsnorm_single', 'absolute', 'gelu'
batch_size, gradient_accumulation_steps = 16, 32
learning_rate, min_lr = 1e-3, 1e-4
warmup_iters, max_iters = 10_000, 600_000
eval_interval = 5000
