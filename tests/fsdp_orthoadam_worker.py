"""Run by tests/test_fsdp.py under torchrun (2 CPU ranks, gloo): OrthoAdam on DTensor shards, every way a parameter
can be cut, against Algorithm 1 written densely (Q = the Kronecker product of the optimizer's own per-axis factors,
float64). Rank 0 prints one line per case: 'case <name> <max abs difference>'."""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness import devices  # noqa: E402
from orthoadam import OrthoAdam  # noqa: E402

# (name, shape, shard axis, group options): axes Q rotates under each option are in the comments
CASES = [
    ('residual_rows', (12, 6), 0, dict(axes='residual', residual_dim=6)),    # axis 1 rotated: local rotation
    ('residual_uneven', (5, 6), 0, dict(axes='residual', residual_dim=6)),   # 3 + 2 rows
    ('residual_cols', (6, 24), 1, dict(axes='residual', residual_dim=6)),    # axis 0 rotated, cut along 1
    ('residual_cut_rotated', (12, 6), 1, dict(axes='residual', residual_dim=6)),   # gathered step
    ('square_all', (6, 6), 0, dict(axes='residual', residual_dim=6)),        # both axes rotated: gathered
    ('all_axes', (8, 12), 1, dict(axes='all')),                              # gathered
    ('vector', (6,), 0, dict(axes='residual', residual_dim=6)),              # a norm's scale: gathered
    ('haar_rows', (10, 6), 0, dict(axes='residual', residual_dim=6, rotation='haar')),
]
LR, WD, BETAS, EPS, STEPS = 0.05, 0.1, (0.9, 0.99), 1e-8, 3


def dense_algorithm1(p, grads, qs):
    """Algorithm 1 of the paper, float64, the whole vectorised parameter at once."""
    q = torch.ones(1, 1, dtype=torch.float64)
    for f in qs:
        q = torch.kron(q, f)
    p = p.double().flatten()
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    for t, g in enumerate(grads, 1):
        g_bar = q @ g.double().flatten()
        m = BETAS[0] * m + (1 - BETAS[0]) * g_bar
        v = BETAS[1] * v + (1 - BETAS[1]) * g_bar ** 2
        s = (m / (1 - BETAS[0] ** t)) / ((v / (1 - BETAS[1] ** t)).sqrt() + EPS)
        p = p * (1 - LR * WD) - LR * (q.T @ s)
    return p


def main():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    dist.init_process_group('gloo')
    mesh = init_device_mesh('cpu', (dist.get_world_size(),))
    for name, shape, axis, options in CASES:
        gen = torch.Generator().manual_seed(len(name))
        full = torch.randn(shape, generator=gen)
        grads = [torch.randn(shape, generator=gen) for _ in range(STEPS)]
        param = torch.nn.Parameter(distribute_tensor(full.clone(), mesh, [Shard(axis)]))
        opt = OrthoAdam([{'params': [param], 'param_names': [name], **options}], lr=LR, betas=BETAS, eps=EPS,
                        weight_decay=WD, seed=3)
        for g in grads:
            param.grad = distribute_tensor(g, mesh, [Shard(axis)])
            opt.step()
        result = param.full_tensor()
        plain = torch.nn.Parameter(full.clone())   # the same Q (seed, name, global shape) on one process
        ref_opt = OrthoAdam([{'params': [plain], 'param_names': [name], **options}], lr=LR, betas=BETAS, eps=EPS,
                            weight_decay=WD, seed=3)
        expected = dense_algorithm1(full, grads, ref_opt.dense_factors(plain)).view(shape)
        if dist.get_rank() == 0:
            print(f"case {name} {(result.double() - expected).abs().max().item():.3e}", flush=True)
    del param, opt   # the DTensors hold the mesh, the mesh its gloo group: teardown joins its threads before exit
    devices.teardown()


if __name__ == '__main__':
    main()
