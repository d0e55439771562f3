# The main job's vanilla model: config/main.py with softmax and AdamW, everything else the same
# (python reproduce.py main --jobs 2 trains both side by side and compares their first token).
include('main.py')
out_dir = 'out/main_vanilla'
attn, optimizer = 'softmax', 'adamw'
