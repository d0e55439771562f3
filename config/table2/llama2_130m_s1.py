# Table 2, llama2_130m: softmax-1 + Adam.
include('../llama2_130m.py')
out_dir = 'out/table2/llama2_130m_s1'
attn = 'softmax1'
