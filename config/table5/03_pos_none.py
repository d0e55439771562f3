# Table 5, row 3: no position encoding.
include('base.py')
out_dir = 'out/table5/03_pos_none'
pos_emb = 'none'
