# Table 2, llama2_130m: softmax + OrthoAdam.
include('../llama2_130m.py')
out_dir = 'out/table2/llama2_130m_oa'
optimizer = 'orthoadam'
