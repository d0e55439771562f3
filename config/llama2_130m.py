# Llama-2 style ~130M (num_params() = 123,587,328 with the GPT-2 vocabulary): RMSNorm-M (per-channel scale),
# no biases, rotary positions, SwiGLU feed-forward (hidden 2048), tied embeddings.
# Same schedule as GPT-2 130M: 2000 warmup, 320k steps, batch 512 x 256, peak lr 1e-3.
out_dir = 'out/llama2_130m'
dataset = 'c4'
n_layer, n_head, n_embd, block_size = 12, 12, 768, 256
bias, norm, pos_emb, mlp = False, 'rmsnorm', 'rotary', 'swiglu'
batch_size, gradient_accumulation_steps = 32, 16
learning_rate, min_lr = 1e-3, 1e-4
warmup_iters, max_iters = 2000, 320_000
eval_interval = 2000
