# Table 2, llama2_130m: softmax + Adam (as in ../llama2_130m.py).
include('../llama2_130m.py')
out_dir = 'out/table2/llama2_130m_vanilla'
