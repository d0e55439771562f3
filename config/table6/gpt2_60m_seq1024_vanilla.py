# Table 6: gpt2_60m trained on sequences of 1024 tokens, softmax + Adam. The 256-token rows are Table 2's runs.
include('../table2/gpt2_60m_vanilla.py')
out_dir = 'out/table6/gpt2_60m_seq1024_vanilla'
block_size = 1024
