# Laptop pilot 8: pilot 7 (the archive subset's document starts, none read twice) for 1,800 steps instead of 900,
# the cosine stretched to match: more steps of the base's schedule on text that does not repeat.
include('p07_archive.py')
out_dir = 'out/laptop/pilots/p08_archive1800'
max_iters = 1800
