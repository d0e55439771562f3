# Table 2, gpt2_130m: softmax + OrthoAdam.
include('../gpt2_130m.py')
out_dir = 'out/table2/gpt2_130m_oa'
optimizer = 'orthoadam'
