# Table 5, row 4: rotary position encoding.
include('base.py')
out_dir = 'out/table5/04_pos_rotary'
pos_emb = 'rotary'
