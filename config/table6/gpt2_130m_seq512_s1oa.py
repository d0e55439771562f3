# Table 6: gpt2_130m trained on sequences of 512 tokens, softmax-1 + OrthoAdam. The 256-token rows are Table 2's runs.
include('../table2/gpt2_130m_s1oa.py')
out_dir = 'out/table6/gpt2_130m_seq512_s1oa'
block_size = 512
