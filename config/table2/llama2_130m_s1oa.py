# Table 2, llama2_130m: softmax-1 + OrthoAdam.
include('../llama2_130m.py')
out_dir = 'out/table2/llama2_130m_s1oa'
attn, optimizer = 'softmax1', 'orthoadam'
