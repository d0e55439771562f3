# Table 2, gpt2_60m: softmax + OrthoAdam.
include('../gpt2_60m.py')
out_dir = 'out/table2/gpt2_60m_oa'
optimizer = 'orthoadam'
