# A/B pilot (not part of the project, not imported by it): Guo et al.'s released model and data classes
# (github.com/GuoTianYu2000/Active-Dormant-Attention at 16b3593: BBM/model.py, BBM/data.py, BBM/data/bos1_d0/meta.pickle),
# their optimiser and batch of 512, trained here in bf16 autocast on one core, `<s>` attention from non-trigger
# queries on 128 fixed sequences and `<s>`'s value norm every 25 steps.
#   OMP_NUM_THREADS=1 python guo_ab.py SEED STEPS GUO_REPO > seedSEED.log     (their BBM/ must be importable)
import sys, pickle, time, json, os
import numpy as np, torch, torch.nn.functional as F
seed = int(sys.argv[1]) if len(sys.argv) > 1 else 42
repo = sys.argv[3] if len(sys.argv) > 3 else 'Active-Dormant-Attention'
sys.path.insert(0, os.path.join(repo, 'BBM'))
from model import Transformer, ModelArgs
from data import bbm, DataArgs
torch.manual_seed(seed)
meta = pickle.load(open(os.path.join(repo, 'BBM/data/bos1_d0/meta.pickle'), 'rb'))
ds = bbm(DataArgs(k=3, fixed_special_toks=True, bos_num=1, delimiter_p=0, delim_num=1), meta)
model = Transformer(ModelArgs(vocab_size=67, n_layers=1, dim=256, n_heads=1, max_length=256))
opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=1e-4, betas=(0.9, 0.99), eps=1e-8)
probe = torch.from_numpy(ds.gen_batch(np.random.default_rng([42, 27]), 128))[:, :-1]
trig = torch.from_numpy(np.isin(probe.numpy(), ds.idxs))
N = probe.shape[1]
mask = torch.triu(torch.full((1, 1, N, N), float('-inf')), diagonal=1)
def bos_attn():
    with torch.no_grad():
        h = model.tok_embeddings(probe) + model.pos_embeddings(torch.arange(N).view(1, N))
        layer = model.layers[0]
        _, scores = layer.attention(layer.attention_norm(h), mask)
        a = scores[:, 0, :, 0][~trig]
        v = layer.attention.wv(layer.attention_norm(h))[0, 0].norm().item()
    return a.mean().item(), v
rng = np.random.default_rng([seed, 0])
out = []
t0 = time.time()
for step in range(int(sys.argv[2]) if len(sys.argv) > 2 else 301):
    if step % 25 == 0:
        a, v = bos_attn(); out.append((step, round(a, 4), round(v, 2)))
        print(step, round(a, 4), round(v, 2), f'{time.time() - t0:.0f}s', flush=True)
    x = torch.from_numpy(ds.gen_batch(rng, 512))
    for i in range(8):
        xb = x[i * 64:(i + 1) * 64]
        with torch.autocast('cpu', torch.bfloat16):
            pred = model(xb[:, :-1])
        loss = F.cross_entropy(pred.flatten(0, 1), xb[:, 1:].flatten(0, 1)) / 8
        loss.backward()
    opt.step(); opt.zero_grad()
json.dump(out, open(f'curve_s{seed}.json', 'w'))
