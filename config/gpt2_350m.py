# GPT-2 ~350M (num_params() = 353,763,377 with the GPT-2 vocabulary). Appendix A: 6000 warmup, 960k steps
# (126B tokens), batch 512 x 256.
include('paper_common.py')
out_dir = 'out/gpt2_350m'
n_layer, n_head, n_embd = 24, 16, 1024
batch_size, gradient_accumulation_steps = 32, 16
warmup_iters, max_iters = 6000, 960_000
eval_interval = 5000
