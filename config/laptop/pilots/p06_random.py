# Laptop pilot 6: windows cut anywhere in train.bin instead of at a document's start (windows='document' draws from
# the 4,724 document starts only, so 900 steps of 16 read each document's first 256 bytes about three times and
# nothing after them; random windows read the whole corpus once at most, with an arbitrary byte at position 0).
include('base.py')
out_dir = 'out/laptop/pilots/p06_random'
windows = 'random'
