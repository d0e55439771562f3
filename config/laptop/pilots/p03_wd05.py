# Laptop pilot 3: weight decay 0.5 on matrices instead of 0.1 (Gu et al., ICLR 2025: 0.5 gave the most sink heads).
include('base.py')
out_dir = 'out/laptop/pilots/p03_wd05'
weight_decay = 0.5
