# A 2-layer model that trains on CPU in a minute or two: first contact and tests.
#   python prepare_c4.py --source pinned && python train.py config/tiny_cpu.py
#   torchrun --standalone --nproc_per_node=2 train.py config/tiny_cpu.py   # the same run on 2 CPU processes
# Running it again resumes the finished run (init_from='auto') and prints the same result.
out_dir = 'out/tiny_cpu'
dataset = 'pinned_cpu'
init_from = 'auto'
n_layer, n_head, n_embd, block_size = 2, 4, 64, 64
batch_size, gradient_accumulation_steps = 16, 1
learning_rate, min_lr = 3e-3, 3e-4
warmup_iters, max_iters, lr_decay_iters = 20, 200, 200
eval_interval, eval_tokens, log_interval = 100, 32_768, 20
device, compile = 'cpu', False
