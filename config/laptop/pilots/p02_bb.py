# Laptop pilot 2: Guo et al.'s Bigram-Backcopy on Shakespeare's characters instead of bytes of text.
include('../base.py')
out_dir = 'out/laptop/pilots/p02_bb'
dataset = 'bb_shakespeare'
