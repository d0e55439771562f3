# The run-to-run spread of softmax-1 + OrthoAdam at the laptop scale: s1oa.py with another seed (other initial
# weights, another order of windows; OrthoAdam's rotation is orthoadam_seed's, the same in both runs).
include('s1oa.py')
out_dir = 'out/laptop/seeds/s1oa_seed2'
seed = 2
