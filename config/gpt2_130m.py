# GPT-2 ~130M (num_params() = 123,764,761 with the GPT-2 vocabulary), the paper's main architecture.
# Appendix A: 2000 warmup, 320k steps (42B tokens), batch 512 x 256. Vanilla as written; the fix is
#   python train.py config/table2/gpt2_130m_s1oa.py
include('paper_common.py')
out_dir = 'out/gpt2_130m'
n_layer, n_head, n_embd = 12, 12, 768
batch_size, gradient_accumulation_steps = 32, 16     # 512 sequences per step over all ranks
warmup_iters, max_iters = 2000, 320_000
eval_interval = 2000
