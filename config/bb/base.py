# Guo et al. (2024), "Active-dormant attention heads": their Bigram-Backcopy experiment, their model and optimiser,
# at their batch of 512 sequences, in bf16 on the CPU (docs/reproducing.md says what differs and why).
#   python prepare_c4.py --source bb_shakespeare && python reproduce.py bb --scale laptop --jobs 2
# Model (their BBM/model.py): d = 256, one head, pre-LayerNorm (with a bias), no biases in the linear layers, learned absolute
# positions, untied output layer, ReLU MLP 4x, PyTorch's default initialisation (N(0, 1) embeddings). Every row
# includes this file and states only its differences.
dataset, windows = 'bb_shakespeare', 'document'   # every window is one of their sequences: <s> and 255 tokens
n_layer, n_head, n_embd, block_size = 1, 1, 256, 256
bias, norm_bias, norm, pos_emb, mlp, init = False, True, 'layernorm', 'absolute', 'relu', 'torch'
tie_embeddings = False
attn = 'softmax'
# their AdamW: betas (0.9, 0.99), eps 1e-8, weight decay 1e-4, constant learning rate 3e-4, no warm-up, no clipping
optimizer, learning_rate, beta1, beta2, eps, weight_decay = 'adamw', 3e-4, 0.9, 0.99, 1e-8, 1e-4
decay_lr, warmup_iters, grad_clip = False, 0, 0.0
# their batch, 512 sequences a step, as 8 micro-batches of 64; 1,000 steps (theirs: 10,000; their sink is 0.78 at
# 1,000 and 0.80 at 2,000: it has plateaued)
batch_size, gradient_accumulation_steps, max_iters = 64, 8, 1000
# an evaluation (and ckpt.pt) every 100 steps, about 8 minutes on one core: a stopped row resumes losing little
eval_interval, eval_tokens, log_interval = 100, 65_536, 50
probe_interval, probe_docs = 25, 64   # the dynamics: every 25 steps on 64 validation sequences
# bf16 autocast (fp32 weights and optimizer state): 2.4x fp32's tokens/s on one core here, the same dynamics as fp32
# (docs/reproducing.md); eager: torch.compile made this step slower (bench.py --sections bf16)
device, compile, dtype = 'cpu', False, 'bfloat16'
