# The main job's fixed model: softmax-1 + OrthoAdam (the paper's architecture: RMSNorm-S, no biases, absolute
# positions, GELU) at 4 layers x 256 on the bytes of the pinned corpus's CPU subset (the same data on every
# installation), a BOS (the end-of-text byte 256) at position 0 of every window. `python reproduce.py main --jobs 2`
# trains it beside config/main_vanilla.py (softmax, AdamW) and prints the first token's kurtosis of both, about ten
# minutes on two CPU cores; `python train.py config/main.py` trains this model alone (run again, it resumes the
# finished run and prints the same line). The setting is the pilots' (docs/reproducing.md, "The main job").
out_dir = 'out/main'
dataset, windows = 'pinned_cpu_bytes', 'document'
init_from = 'auto'
n_layer, n_head, n_embd, block_size = 4, 4, 256, 256
bias, norm, pos_emb, mlp = False, 'rmsnorm_single', 'absolute', 'gelu'
attn, optimizer = 'softmax1', 'orthoadam'
batch_size, gradient_accumulation_steps = 16, 1
# 500 steps at a learning rate that stays near its 3e-3 peak (the first 500 of a 4,000-step cosine): the outliers
# grow while the loss falls through 2.3 nats a byte, around step 400; a 500-step cosine decays the LR before that
# (pilot A: kurtosis 4.0 against 3.3), and at 2e-3 they had only begun (pilot B: 9.2 against 3.5)
learning_rate, min_lr, beta2, weight_decay = 3e-3, 3e-4, 0.95, 0.1
warmup_iters, max_iters, lr_decay_iters = 50, 500, 4000
eval_interval, eval_tokens, log_interval = 250, 32_768, 50
probe_interval, probe_docs = 50, 16
# fp32 on the CPU: the same arithmetic on every CPU (bf16 would depend on the CPU's bf16 units); compiled
device, compile, dtype = 'cpu', True, 'float32'
