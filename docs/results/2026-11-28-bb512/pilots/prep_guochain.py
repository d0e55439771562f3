# one-off pilot data: Guo et al.'s own chain (their BBM/data/bos1_d0/meta.pickle, tiny-shakespeare, 67 tokens) through
# this project's generator and prepared format, to tell whether the text behind the chain changes the sink's speed
import os, pickle, sys
from itertools import islice
import numpy as np
# run from the repository root: python docs/results/2026-11-28-bb512/pilots/prep_guochain.py GUO_REPO
sys.path.insert(0, '.')
from harness.dataset import prepare
from harness.sources import backcopy_documents
from harness.tokenizer import Tokenizer
m = pickle.load(open(os.path.join(sys.argv[1], 'BBM/data/bos1_d0/meta.pickle'), 'rb'))
cond, marg = np.array(m['cond']), np.array(m['marginal'])
trig = [int(i) for i in np.argsort(marg)[-3:]]
first = marg.copy(); first[trig] = 0; first /= first.sum()
tok = Tokenizer('bb_shakespeare', 67, 65, lambda ids: ids)
docs = backcopy_documents(60_500, 256, cond, first, trig, 0)
prepare('data/bb_guo_chain', tok, {'source': 'bb_guo_chain', 'seed': 0}, 'bb_guo_chain',
        "Guo et al.'s chain (their meta.pickle) through this project's Bigram-Backcopy generator (a pilot)", True,
        lambda split: islice(docs, 500 if split == 'val' else 60_000),
        {'train': (None, 60_000), 'val': (None, 500)}, 1, False, extra={'triggers': trig})
