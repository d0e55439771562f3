# Table 2, gpt2_60m: softmax-1 + OrthoAdam.
include('../gpt2_60m.py')
out_dir = 'out/table2/gpt2_60m_s1oa'
attn, optimizer = 'softmax1', 'orthoadam'
