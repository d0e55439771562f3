# Sink pilot (reproduce.py pilots): vanilla 60M (Table 2's row), windows='random' (windows start anywhere: no fixed first token), weight decay 0.5
# on matrices. reproduce.py pilots --scale gpu keeps these two keys and adds the rest of the recipe (harness/recipe.py).
include('../table2/gpt2_60m_vanilla.py')
out_dir = 'out/pilots/bos0_wd05'
windows = 'random'
weight_decay = 0.5
probe_docs = 32   # the sink metrics at every evaluation (log.jsonl 'probe'): the trajectories are the pilot's result
