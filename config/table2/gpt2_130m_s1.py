# Table 2, gpt2_130m: softmax-1 + Adam.
include('../gpt2_130m.py')
out_dir = 'out/table2/gpt2_130m_s1'
attn = 'softmax1'
