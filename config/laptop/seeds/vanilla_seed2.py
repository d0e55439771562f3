# The run-to-run spread at the laptop scale: the laptop base (Table 2's vanilla 60M row at the laptop setting,
# seed 1337) trained again with another seed, which draws other initial weights and another order of windows
# (python reproduce.py spread --scale laptop; reproduce.py table5 --scale laptop trains it too).
include('../base.py')
out_dir = 'out/laptop/seeds/vanilla_seed2'
seed = 2
