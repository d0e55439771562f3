# Table 2, gpt2_1.4b: softmax + Adam (as in ../gpt2_1.4b.py).
include('../gpt2_1.4b.py')
out_dir = 'out/table2/gpt2_1.4b_vanilla'
