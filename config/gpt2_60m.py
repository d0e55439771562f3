# GPT-2 ~60M (num_params() = 57,344,021 with the GPT-2 vocabulary). Appendix A: 1000 warmup, 160k steps
# (21B tokens), batch 512 x 256. Vanilla as written; Table 2's other rows are in config/table2/.
include('paper_common.py')
out_dir = 'out/gpt2_60m'
n_layer, n_head, n_embd = 10, 8, 512
batch_size, gradient_accumulation_steps = 64, 8      # 512 sequences per step over all ranks
warmup_iters, max_iters = 1000, 160_000
eval_interval = 2000
