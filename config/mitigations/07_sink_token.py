# Mitigations, row 7: a learnt sink token prepended to every window.
include('base.py')
out_dir = 'out/mitigations/07_sink_token'
sink_token = True
