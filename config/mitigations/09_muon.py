# Mitigations, row 9: Muon on the blocks' weight matrices (lr 0.02, momentum 0.95), AdamW on the rest.
include('base.py')
out_dir = 'out/mitigations/09_muon'
optimizer, muon_lr, muon_momentum = 'muon', 0.02, 0.95
