# GPT-2 ~350M (num_params() = 353,763,377 with the GPT-2 vocabulary): RMSNorm-S, no biases, absolute positions.
# Appendix A: 6000 warmup, 960k steps (126B tokens), batch 512 x 256, peak lr 1e-3.
out_dir = 'out/gpt2_350m'
dataset = 'c4'
n_layer, n_head, n_embd, block_size = 24, 16, 1024, 256
bias, norm, pos_emb, mlp = False, 'rmsnorm_single', 'absolute', 'gelu'
batch_size, gradient_accumulation_steps = 32, 16
learning_rate, min_lr = 1e-3, 1e-4
warmup_iters, max_iters = 6000, 960_000
eval_interval = 5000
