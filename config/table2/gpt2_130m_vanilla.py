# Table 2, gpt2_130m: softmax + Adam (as in ../gpt2_130m.py).
include('../gpt2_130m.py')
out_dir = 'out/table2/gpt2_130m_vanilla'
