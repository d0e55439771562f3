# Sink pilot (reproduce.py pilots): vanilla 60M (Table 2's row), windows='document' (an end-of-text token, a BOS, at position 0 of every window), weight decay 0.1
# on matrices. reproduce.py pilots --scale gpu keeps these two keys and adds the rest of the recipe (harness/recipe.py).
include('../table2/gpt2_60m_vanilla.py')
out_dir = 'out/pilots/bos1_wd01'
windows = 'document'
weight_decay = 0.1
probe_docs = 32   # the sink metrics at every evaluation (log.jsonl 'probe'): the trajectories are the pilot's result
