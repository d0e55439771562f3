# The main job: a small softmax-1 + OrthoAdam model (the paper's architecture: RMSNorm-S, no biases)
# on the offline stand-in corpus, a few minutes on 2 CPU cores (seconds on a GPU).
#   python prepare_c4.py --source offline --tokenizer bytes && python train.py config/main.py
# Running it again resumes the finished run (init_from='auto') and prints the same result.
out_dir = 'out/main'
dataset = 'offline'
init_from = 'auto'
n_layer, n_head, n_embd, block_size = 4, 4, 128, 128
bias, norm, pos_emb, mlp = False, 'rmsnorm_single', 'absolute', 'gelu'
attn, optimizer = 'softmax1', 'orthoadam'
batch_size, gradient_accumulation_steps = 16, 1
learning_rate, min_lr = 1e-3, 1e-4
warmup_iters, max_iters = 100, 1000
eval_interval, eval_tokens, log_interval = 500, 131_072, 100
