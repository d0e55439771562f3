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


def choice_config(field, value, n_embd, block_size):
    """A small model with one choice set (an OrthoAdam key selects OrthoAdam), as train.py resolves a config."""
    cfg = dict(train_config.DEFAULTS, n_layer=2, n_head=2, n_embd=n_embd, block_size=block_size, vocab_size=64,
               bias=True, learning_rate=3e-3, weight_decay=0.1, **{field: value})
    if field.startswith('orthoadam_'):
        cfg['optimizer'] = 'orthoadam'
    return cfg


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
    cfg = choice_config(field, value, n_embd=16, block_size=8)
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


# bf16 on the CPU (train.py's dtype='bfloat16': autocast, master weights and optimizer state in fp32): for every
# choice, the losses of steps in bf16 stay within BF16_TOLERANCE (relative) of the same steps in fp32 from the same
# initialisation, and the weights, their gradients and the optimizer's state stay fp32.
BF16_STEPS, BF16_TOLERANCE = 12, 0.02


def steps_in(cfg, dtype, batches):
    model, opt = build(cfg)
    losses, autocast = [], torch.autocast('cpu', dtype=torch.bfloat16, enabled=dtype == torch.bfloat16)
    seen = set()   # the dtype the blocks' first matrix computes in: bf16 under autocast, else the test compares fp32
    model.transformer.h[0].attn.c_attn.register_forward_hook(lambda m, i, out: seen.add(out.dtype))
    for x, y in batches:
        with autocast:
            loss = model(x, y)[1]
        loss.backward()
        assert all(p.grad is None or p.grad.dtype == torch.float32 for p in model.parameters())
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert seen == {dtype}
    return losses, model, opt


@pytest.mark.parametrize('field,value', CASES, ids=[f'{f}={v}' for f, v in CASES])
def test_every_choice_trains_in_bf16_as_in_fp32(field, value):
    cfg = choice_config(field, value, n_embd=32, block_size=16)
    g = torch.Generator().manual_seed(2)
    batches = [[torch.randint(0, 64, (8, 16), generator=g) for _ in range(2)]] * BF16_STEPS   # one batch, learnt
    fp32, _, _ = steps_in(cfg, torch.float32, batches)
    bf16, model, opt = steps_in(cfg, torch.bfloat16, batches)
    gaps = [abs(a - b) / a for a, b in zip(fp32, bf16)]
    assert max(gaps) <= BF16_TOLERANCE, f"{field}={value!r}: bf16 losses {bf16} against fp32 {fp32}"
    assert fp32[-1] < fp32[0] and bf16[-1] < bf16[0]   # the steps learn: the comparison is not of two flat lines
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(t.dtype in (torch.float32, torch.int64) or t.dim() == 0 for s in opt.state.values() for t in s.values()
               if isinstance(t, torch.Tensor))


def test_a_cpu_without_native_bf16_is_named(monkeypatch, capsys):
    """cpu_bf16 follows the CPU's flags and oneDNN's cap on them: ONEDNN_MAX_CPU_ISA=AVX512_CORE hides AMX and
    AVX512-BF16 from oneDNN, and a bf16 run then says that it runs emulated."""
    from harness import devices
    monkeypatch.setattr(torch.cpu, '_is_amx_tile_supported', lambda: True)
    monkeypatch.setattr(torch.cpu, '_is_avx512_bf16_supported', lambda: False)
    monkeypatch.delenv('ONEDNN_MAX_CPU_ISA', raising=False)
    assert devices.cpu_bf16()
    monkeypatch.setenv('ONEDNN_MAX_CPU_ISA', 'avx512_core')
    assert not devices.cpu_bf16()
    monkeypatch.setenv('ONEDNN_MAX_CPU_ISA', 'AVX512_CORE_AMX')
    assert devices.cpu_bf16()
    monkeypatch.setenv('ONEDNN_MAX_CPU_ISA', 'AVX2')
    devices.setup_distributed({'device': 'cpu', 'dtype': 'bfloat16'})
    assert 'runs emulated' in capsys.readouterr().err
