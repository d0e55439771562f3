# Llama-2 style ~130M (num_params() = 123,587,328 with the GPT-2 vocabulary): RMSNorm-M (per-channel scale),
# no biases, rotary positions, SwiGLU feed-forward (hidden 2048), tied embeddings. Schedule as GPT-2 130M.
include('gpt2_130m.py')
out_dir = 'out/llama2_130m'
norm, pos_emb, mlp = 'rmsnorm', 'rotary', 'swiglu'
