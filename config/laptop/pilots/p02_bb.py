# Laptop pilot 2: Guo et al.'s Bigram-Backcopy on Shakespeare's characters instead of bytes of text.
include('base.py')
max_iters, eval_interval = 1500, 750   # the pilots' length (the base trains 900)
out_dir = 'out/laptop/pilots/p02_bb'
dataset = 'bb_shakespeare'
