# Table 2, gpt2_60m: softmax + Adam (as in ../gpt2_60m.py).
include('../gpt2_60m.py')
out_dir = 'out/table2/gpt2_60m_vanilla'
