# Table 2, gpt2_350m: softmax-1 + OrthoAdam.
include('../gpt2_350m.py')
out_dir = 'out/table2/gpt2_350m_s1oa'
attn, optimizer = 'softmax1', 'orthoadam'
