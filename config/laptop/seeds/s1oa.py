# softmax-1 + OrthoAdam at the laptop setting, seed 1337: Table 2's 60M row of both fixes (and Table 5's row 11) at
# the laptop scale, which reproduce.py trains once for all three tables; the spread's reference for s1oa_seed2.py.
include('../base.py')
out_dir = 'out/laptop/seeds/s1oa'
attn, optimizer = 'softmax1', 'orthoadam'
