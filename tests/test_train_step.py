"""Every choice trains and resumes: each value of model.CHOICES (and the attention bias and the sink token), each
optimizer (optimizers.OPTIMIZERS) and each OrthoAdam rotation and axis policy (orthoadam.ROTATIONS, AXES), built as
train.py builds them (GPTConfig from the config keys, optimizers.configure_optimizer): steps on one batch lower its
loss, and a model and optimizer saved after one step and loaded into fresh ones take the next step bit for bit as the
uninterrupted pair does (what train.py's resume relies on). A value added to one of these lists is checked here
without a new test; what each computes is checked against references in test_attention.py, test_model.py and
test_orthoadam.py."""
import io

import pytest
import torch

import orthoadam
from harness import optimizers, train_config
from model import CHOICES, GPT, GPTConfig

pytestmark = pytest.mark.usefixtures('one_thread')

CASES = ([(field, value) for field, values in CHOICES.items() for value in values]
         + [('attn_bias', True), ('sink_token', True)]
         + [('optimizer', name) for name in optimizers.OPTIMIZERS]
         + [('orthoadam_rotation', r) for r in orthoadam.ROTATIONS] + [('orthoadam_axes', a) for a in orthoadam.AXES])


def build(cfg):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{k: cfg[k] for k in train_config.MODEL_KEYS}))
    return model, optimizers.configure_optimizer(model, cfg, 'cpu')


def step(model, opt, batch):
    loss = model(*batch)[1]
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


@pytest.mark.parametrize('field,value', CASES, ids=[f'{f}={v}' for f, v in CASES])
def test_every_choice_takes_steps_and_resumes_exactly(field, value):
    cfg = dict(train_config.DEFAULTS, n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=64, bias=True,
               learning_rate=3e-3, weight_decay=0.1, **{field: value})
    if field.startswith('orthoadam_'):
        cfg['optimizer'] = 'orthoadam'
    g = torch.Generator().manual_seed(1)
    batch = [torch.randint(0, 64, (4, 8), generator=g) for _ in range(2)]
    model, opt = build(cfg)
    losses = [step(model, opt, batch) for _ in range(3)]
    with torch.no_grad():
        after = model(*batch)[1].item()
    assert after < losses[0], f"{field}={value!r}: three steps on one batch did not lower its loss ({losses}, {after})"
    assert all(torch.isfinite(p).all() for p in model.parameters())

    model, opt = build(cfg)
    step(model, opt, batch)
    saved = io.BytesIO()
    torch.save({'model': model.state_dict(), 'optimizer': opt.state_dict()}, saved)
    step(model, opt, batch)
    saved.seek(0)
    ckpt = torch.load(saved, weights_only=False)
    resumed, resumed_opt = build(cfg)
    resumed.load_state_dict(ckpt['model'])
    resumed_opt.load_state_dict(ckpt['optimizer'])
    optimizers.set_hyperparameters(resumed_opt, cfg)   # as train.py does after loading
    step(resumed, resumed_opt, batch)
    for (name, a), b in zip(model.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), f"{field}={value!r}: {name} differs after a resume"
