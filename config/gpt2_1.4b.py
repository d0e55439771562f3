# GPT-2 ~1.4B (num_params() = 1,436,614,753 with the GPT-2 vocabulary). Appendix A: 10000 warmup, 600k steps
# (79B tokens; fewer than 350M's, as in the paper), batch 512 x 256.
include('paper_common.py')
out_dir = 'out/gpt2_1.4b'
n_layer, n_head, n_embd = 48, 24, 1536
batch_size, gradient_accumulation_steps = 16, 32
warmup_iters, max_iters = 10_000, 600_000
eval_interval = 5000
