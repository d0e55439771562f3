# Table 2, gpt2_1.4b: softmax-1 + OrthoAdam.
include('../gpt2_1.4b.py')
out_dir = 'out/table2/gpt2_1.4b_s1oa'
attn, optimizer = 'softmax1', 'orthoadam'
