# Table 2, gpt2_350m: softmax + Adam (as in ../gpt2_350m.py).
include('../gpt2_350m.py')
out_dir = 'out/table2/gpt2_350m_vanilla'
