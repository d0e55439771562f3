# Mitigations, row 8: OrthoAdam (the paper).
include('base.py')
out_dir = 'out/mitigations/08_orthoadam'
optimizer = 'orthoadam'
