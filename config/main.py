# The main job: a small softmax-1 + OrthoAdam model (the paper's architecture: RMSNorm-S, no biases)
# on the pinned corpus's CPU subset in GPT-2's vocabulary (the same data on every installation),
# about 5 minutes on 2 CPU cores (seconds on a GPU).
#   python prepare_c4.py --source pinned && python train.py config/main.py
# Running it again resumes the finished run (init_from='auto') and prints the same result.
out_dir = 'out/main'
dataset = 'pinned_cpu'
init_from = 'auto'
n_layer, n_head, n_embd, block_size = 4, 4, 128, 128
bias, norm, pos_emb, mlp = False, 'rmsnorm_single', 'absolute', 'gelu'
attn, optimizer = 'softmax1', 'orthoadam'
# 400 steps of 8 x 128 tokens (0.41 M): GPT-2's 50,257-word output layer is most of the cost on a CPU
batch_size, gradient_accumulation_steps = 8, 1
learning_rate, min_lr = 2e-3, 2e-4
warmup_iters, max_iters = 40, 400
eval_interval, eval_tokens, log_interval = 200, 65_536, 50
