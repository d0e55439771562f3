# GPT-2 ~130M (num_params() = 123,764,761 with the GPT-2 vocabulary), the paper's main architecture:
# RMSNorm-S, no biases, learnt absolute positions. Vanilla as written; the paper's fix is
#   python train.py config/gpt2_130m.py --attn=softmax1 --optimizer=orthoadam --out_dir=out/gpt2_130m_s1oa
# Schedule from Appendix A: batch 512 x 256 tokens, peak lr 1e-3, 2000 warmup, 320k steps (42B tokens).
out_dir = 'out/gpt2_130m'
dataset = 'c4'
n_layer, n_head, n_embd, block_size = 12, 12, 768, 256
bias, norm, pos_emb, mlp = False, 'rmsnorm_single', 'absolute', 'gelu'
batch_size, gradient_accumulation_steps = 32, 16   # 512 sequences per step over all ranks
learning_rate, min_lr = 1e-3, 1e-4
warmup_iters, max_iters = 2000, 320_000
eval_interval = 2000
