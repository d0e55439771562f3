"""OrthoAdam against a dense float64 implementation of Algorithm 1, and against torch.optim.AdamW. Every rotation and
axis policy (orthoadam.ROTATIONS, AXES) is checked: Q orthogonal, and the steps Algorithm 1's with that Q."""
import copy
import functools
import io
import math
import os

import pytest
import torch

from orthoadam import AXES, ROTATIONS, OrthoAdam

HP = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
SHAPES = {'w': (6, 12), 'b': (24,), 't': (3, 4, 8), 'r': (12, 5), 'one': (1, 12)}


def make_params(shapes=SHAPES, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {n: torch.nn.Parameter(torch.randn(s, generator=g).to(dtype)) for n, s in shapes.items()}


def make_grads(params, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [{n: torch.randn(p.shape, generator=g).to(p.dtype) for n, p in params.items()} for _ in range(steps)]


def run(opt, params, grads):
    for step in grads:
        for n, p in params.items():
            p.grad = step[n].to(p.device, copy=True)
        opt.step()


def reference_algorithm1(theta, grads, q, lr, betas, eps, weight_decay):
    """Algorithm 1 with an explicit n×n Q on the row-major flattened parameter, float64 throughout."""
    theta, q = theta.double().flatten(), q.double()
    m = torch.zeros_like(theta)
    v = torch.zeros_like(theta)
    for t, g in enumerate(grads, 1):
        g_bar = q @ g.double().flatten()
        m = betas[0] * m + (1 - betas[0]) * g_bar
        v = betas[1] * v + (1 - betas[1]) * g_bar * g_bar
        m_hat, v_hat = m / (1 - betas[0] ** t), v / (1 - betas[1] ** t)
        s = q.T @ (m_hat / (v_hat.sqrt() + eps))
        theta = theta * (1 - lr * weight_decay) - lr * s
    return theta


def dense_q(opt, p):
    return functools.reduce(torch.kron, opt.dense_factors(p), torch.ones(1, 1, dtype=torch.float64))


def sylvester(n):
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def signed_permutation(n, generator):
    signs = torch.randint(0, 2, (n,), generator=generator).double() * 2 - 1
    return torch.eye(n, dtype=torch.float64)[torch.randperm(n, generator=generator)] * signs


@pytest.mark.parametrize('options', [dict(rotation=r, axes=a, residual_dim=12) for r in ROTATIONS for a in AXES])
def test_matches_dense_reference(options):
    params = make_params()
    grads = make_grads(params, 6)
    theta0 = {n: p.detach().clone() for n, p in params.items()}
    groups = [{'params': [(n, params[n]) for n in ('w', 'b', 't', 'one')]},
              {'params': [('r', params['r'])], 'skip_axes': (1,)}]
    opt = OrthoAdam(groups, **HP, **options)
    qs = {n: dense_q(opt, p) for n, p in params.items()}
    run(opt, params, grads)
    for n, p in params.items():
        want = reference_algorithm1(theta0[n], [g[n] for g in grads], qs[n], **HP)
        torch.testing.assert_close(p.detach().double().flatten(), want, atol=1e-5, rtol=0)
    if options['rotation'] != 'identity' and options['axes'] != 'none':   # non-trivial Q
        assert sum(not torch.equal(q, torch.eye(len(q), dtype=q.dtype)) for q in qs.values()) >= 2


@pytest.mark.parametrize('rotation', ROTATIONS)
def test_every_rotation_is_orthogonal(rotation):
    """Q Qᵀ = I for every rotated axis, power-of-two, odd and mixed sizes alike (what makes Algorithm 1 Adam in a
    rotated basis)."""
    p = torch.nn.Parameter(torch.zeros(6, 24, 7))
    for q in OrthoAdam([p], rotation=rotation).dense_factors(p):
        torch.testing.assert_close(q @ q.T, torch.eye(len(q), dtype=torch.float64), atol=1e-6, rtol=0)


@pytest.mark.parametrize('bucket', [1 << 24, 100])   # one stack per shape / stacks of one, rows in blocks of 4
@pytest.mark.parametrize('fused', [True, False])     # torch._fused_adam_ / the foreach fallback for other devices
def test_stacks_row_blocks_and_fallback_match_dense_reference(monkeypatch, bucket, fused):
    """Same-shaped parameters are rotated as one stack (each with its own Q), a big parameter whose axis 0 is
    unrotated goes in blocks of rows; every parameter still follows Algorithm 1 with its own dense Q."""
    import orthoadam
    monkeypatch.setattr(orthoadam, 'BUCKET_NUMEL', bucket)
    if not fused:
        monkeypatch.setattr(orthoadam, 'FUSED_ADAM_DEVICES', ())
    shapes = {'w0': (6, 12), 'w1': (6, 12), 'w2': (6, 12), 'v0': (40,), 'v1': (40,), 's': (), 'big': (384, 2),
              'wide': (2, 384), 'emb': (50, 24), 'emb2': (50, 24)}
    params = make_params(shapes)
    grads = make_grads(params, 5)
    theta0 = {n: p.detach().clone() for n, p in params.items()}
    groups = [{'params': [(n, params[n]) for n in ('w0', 'v0', 'w1', 's', 'big', 'w2', 'v1', 'wide')]},
              {'params': [(n, params[n]) for n in ('emb', 'emb2')], 'skip_axes': (0,), 'weight_decay': 0.0}]
    opt = OrthoAdam(groups, **HP)
    qs = {n: dense_q(opt, p) for n, p in params.items()}
    run(opt, params, grads)
    for n, p in params.items():
        wd = 0.0 if n.startswith('emb') else HP['weight_decay']
        want = reference_algorithm1(theta0[n], [g[n] for g in grads], qs[n], **{**HP, 'weight_decay': wd})
        torch.testing.assert_close(p.detach().double().flatten(), want, atol=1e-5, rtol=0, msg=n)
    assert not torch.equal(qs['w0'], qs['w1']) and not torch.equal(qs['emb'], qs['emb2'])   # one Q per parameter


@pytest.mark.slow   # dense Kronecker products of every stack member
def test_rotate_on_a_stack_is_each_members_kronecker_q():
    """rotate() on a stack [P, 24, 384] (both axes rotated: one dense 24 block; H_16 shared plus a dense 24
    block per member) equals each member's Q = Q_0 ⊗ Q_1 built with torch.kron, and Qᵀ for transpose."""
    from orthoadam import axis_factor, rotate, sylvester_hadamard
    g = torch.Generator().manual_seed(0)
    members = [[axis_factor(n, 'hadamard', g) for n in (24, 384)] for _ in range(3)]
    dense = []
    for axes in members:
        qs = []
        for signs, mats in axes:
            q = functools.reduce(torch.kron, [sylvester_hadamard(m) if isinstance(m, int) else m for m in mats])
            qs.append(q * signs)
        dense.append(torch.kron(*qs))
    factors = [(torch.stack([m[a][0] for m in members]).float(),
                [sylvester_hadamard(m).float() if isinstance(m, int) else torch.stack([x[a][1][j] for x in members]).float()
                 for j, m in enumerate(members[0][a][1])]) for a in range(2)]
    assert [len(f[1]) for f in factors] == [1, 2] and factors[1][1][0].dim() == 2   # the shared Sylvester block
    x = torch.randn(3, 24, 384, generator=g)
    for transpose in (False, True):
        got, _ = rotate(x.clone(), factors, transpose)
        for i, q in enumerate(dense):
            want = (q.T if transpose else q) @ x[i].double().flatten()
            torch.testing.assert_close(got[i].double().flatten(), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize('n, blocks', [(768, ([32], 3)), (3072, ([64], 4)), (1024, ([32, 32], 0)),
                                       (96, ([], 5)), (50304, ([8, 16], 0)), (8192, ([16, 16, 32], 0)), (7, ([], 0)),
                                       (2, ([2], 0))])
def test_axis_blocks_fewest_passes_then_fewest_flops(n, blocks):
    """Hand-worked splits: 768 = 32 · (8·3) in two passes (not 16 · 48: 2·(16+48) FLOPs > 2·(32+24)); an odd
    factor too big to merge (393 > MERGE_LIMIT) stands alone."""
    from orthoadam import HADAMARD_BLOCK, MERGE_LIMIT, axis_blocks
    k = (n & -n).bit_length() - 1
    sizes, j = axis_blocks(k, n >> k)
    assert (sizes, j) == blocks
    assert math.prod(sizes) * 2 ** j * (n >> k) == n and max(sizes, default=1) <= HADAMARD_BLOCK
    assert j == 0 or 2 ** j * (n >> k) <= MERGE_LIMIT


def test_residual_axes_policy():
    params = make_params()
    opt = OrthoAdam(params.items(), axes='residual', residual_dim=12)
    rotated = {n: [not torch.equal(q, torch.eye(len(q), dtype=q.dtype)) for q in opt.dense_factors(p)]
               for n, p in params.items()}
    assert rotated == {'w': [False, True], 'b': [False], 't': [False, False, False], 'r': [True, False],
                       'one': [False, True]}


@pytest.mark.parametrize('n', [2, 8, 64, 256, pytest.param(2048, marks=pytest.mark.slow), 6, 24, 40, 7])
def test_hadamard_factors_are_orthogonal_and_mix(n):
    p = torch.nn.Parameter(torch.zeros(n))
    q = OrthoAdam([p]).dense_factors(p)[0]
    torch.testing.assert_close(q @ q.T, torch.eye(n, dtype=torch.float64), atol=1e-5, rtol=0)
    k = (n & -n).bit_length() - 1
    two, m = 2 ** k, n >> k
    mag = q.abs().reshape(two, m, two, m)   # |Q| = |H_{2^k}|/sqrt(2^k) ⊗ |R_m|: flat over the Hadamard indices
    torch.testing.assert_close(mag, mag[:1, :, :1, :].expand_as(mag), atol=1e-12, rtol=0)
    if m == 1:   # a one-hot vector spreads evenly, and Q is the Sylvester matrix times diag(signs)
        torch.testing.assert_close(q.abs(), torch.full((n, n), n ** -0.5, dtype=torch.float64), atol=1e-12, rtol=0)
        signs = q[0] * math.sqrt(n)
        torch.testing.assert_close(q, sylvester(n) / math.sqrt(n) * signs, atol=1e-12, rtol=0)


def test_haar_factors_are_orthogonal():
    p = torch.nn.Parameter(torch.zeros(5, 24))
    for q in OrthoAdam([p], rotation='haar').dense_factors(p):
        torch.testing.assert_close(q @ q.T, torch.eye(len(q), dtype=torch.float64), atol=1e-5, rtol=0)
        assert (q.abs() > 1e-3).float().mean() > 0.9   # dense, not a permutation


@pytest.mark.parametrize('options, equal', [
    (dict(rotation='identity'), True),
    (dict(axes='none'), True),
    (dict(rotation=signed_permutation), True),   # Adam is equivariant under signed permutations
    (dict(rotation='hadamard'), False),
    (dict(rotation='haar'), False),
])
def test_adamw_equivalence(options, equal):
    params, ref = make_params(), make_params()
    grads = make_grads(params, 5)
    run(OrthoAdam(params.values(), **HP, **options), params, grads)
    run(torch.optim.AdamW(ref.values(), **HP), ref, grads)
    diff = max((params[n] - ref[n]).abs().max().item() for n in params)
    assert diff < 1e-6 if equal else diff > 1e-3


@pytest.mark.parametrize('options', [dict(axes='none'), dict(rotation='identity'),
                                     dict(axes='residual', residual_dim=12)])   # b (24,), t (3, 4, 8): no 12 axis
def test_unrotated_parameters_step_exactly_as_fused_adamw(options):
    """A parameter with no rotated axis (Q = I) takes torch's fused AdamW step, bit for bit, beside rotated ones."""
    params, ref = make_params(), make_params()
    grads = make_grads(params, 5)
    opt = OrthoAdam(params.items(), **HP, **options)
    run(opt, params, grads)
    adamw = torch.optim.AdamW(ref.values(), **HP, fused=True)
    run(adamw, ref, grads)
    unrotated = [n for n, p in params.items() if not opt.state[p]['rotated_axes']]
    assert unrotated == (['b', 't'] if 'residual_dim' in options else list(params))
    for n in unrotated:
        assert torch.equal(params[n], ref[n]), n
        assert all(torch.equal(opt.state[params[n]][k], adamw.state[ref[n]][k]) for k in ('exp_avg', 'exp_avg_sq')), n


def test_q_is_fixed_by_seed_and_name_not_global_rng():
    def factors(names, seed, rng):
        torch.manual_seed(rng)
        params = [torch.nn.Parameter(torch.zeros(s)) for s in ((6, 24), (40,))]
        opt = OrthoAdam(list(zip(names, params)), seed=seed)
        return [q for p in params for q in opt.dense_factors(p)]

    def same(a, b):
        return all(torch.equal(x, y) for x, y in zip(a, b))

    base = factors(['a', 'b'], 0, rng=1)
    assert same(base, factors(['a', 'b'], 0, rng=2))
    assert same(base, factors(['module._orig_mod.a', '_orig_mod.b'], 0, rng=3))   # DDP / compile wrappers
    assert not same(base[:2], factors(['c', 'b'], 0, rng=1)[:2]) and same(base[2:], factors(['c', 'b'], 0, 1)[2:])
    assert not same(base, factors(['a', 'b'], 1, rng=1))
    for rotation in ('hadamard', 'haar'):   # unnamed parameters: identity is "group.index"
        p = [torch.nn.Parameter(torch.zeros(12)) for _ in range(2)]
        a, b = OrthoAdam(p, rotation=rotation), OrthoAdam(p, rotation=rotation)
        torch.manual_seed(0)
        qa = a.dense_factors(p[0])[0]
        torch.manual_seed(1)
        assert torch.equal(qa, b.dense_factors(p[0])[0])
        assert not torch.equal(qa, a.dense_factors(p[1])[0])


@pytest.mark.parametrize('rotation, dtype', [('hadamard', torch.float32), ('haar', torch.float32),
                                             ('hadamard', torch.bfloat16)])
def test_state_dict_round_trip_keeps_q(rotation, dtype):
    params = make_params(dtype=dtype)
    grads = make_grads(params, 6)
    groups = [{'params': [(n, params[n]) for n in ('w', 'b', 't')]},
              {'params': [('r', params['r']), ('one', params['one'])], 'skip_axes': (0,), 'weight_decay': 0.0}]
    opt = OrthoAdam(groups, **HP, rotation=rotation, seed=0)
    run(opt, params, grads[:3])
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf)
    assert all({'step', 'exp_avg', 'exp_avg_sq', 'q_seed', 'rotated_axes'} <= set(s) for s in state['state'].values())

    resumed_params = copy.deepcopy(params)
    resumed_groups = [{'params': [(n, resumed_params[n]) for n in ('w', 'b', 't')]},
                      {'params': [('r', resumed_params['r']), ('one', resumed_params['one'])]}]
    resumed = OrthoAdam(resumed_groups, lr=1.0, rotation=rotation, seed=12345)
    resumed.load_state_dict(state)
    run(opt, params, grads[3:])
    run(resumed, resumed_params, grads[3:])
    for n in params:
        assert torch.equal(params[n], resumed_params[n]), n
        assert resumed.state[resumed_params[n]]['exp_avg'].dtype == torch.float32
        assert all(torch.equal(a, b) for a, b in zip(opt.dense_factors(params[n]),
                                                      resumed.dense_factors(resumed_params[n])))


def test_bf16_params():
    params = make_params(dtype=torch.bfloat16)
    ref = {n: torch.nn.Parameter(p.detach().float()) for n, p in params.items()}
    grads = make_grads(params, 4)
    opt = OrthoAdam(params.items(), **HP)
    run(opt, params, grads)
    run(OrthoAdam(ref.items(), **HP), ref, [{n: g.float() for n, g in step.items()} for step in grads])
    for n, p in params.items():
        assert p.dtype == torch.bfloat16 and opt.state[p]['exp_avg'].dtype == torch.float32
        assert opt.state[p]['exp_avg_sq'].dtype == torch.float32
        torch.testing.assert_close(p.float(), ref[n].detach(), atol=2e-2, rtol=2e-2)


def test_skip_axes_leaves_axis_unrotated():
    emb, other = torch.nn.Parameter(torch.zeros(10, 12)), torch.nn.Parameter(torch.zeros(10, 12))
    opt = OrthoAdam([{'params': [emb], 'skip_axes': (0,)}, {'params': [other]}])
    q0, q1 = opt.dense_factors(emb)
    assert torch.equal(q0, torch.eye(10, dtype=torch.float64)) and not torch.equal(q1, torch.eye(12, dtype=q1.dtype))
    assert not any(torch.equal(q, torch.eye(len(q), dtype=q.dtype)) for q in opt.dense_factors(other))


@pytest.mark.parametrize('options, match', [
    (dict(rotation='hadamrd'), 'rotation'),
    (dict(axes='resid'), 'axes'),
    (dict(axes='residual'), 'residual_dim'),
    (dict(skip_axes=('vocab',)), 'skip_axes'),
    (dict(betas=(0.9, 1.0)), 'betas'),
])
def test_invalid_options(options, match):
    with pytest.raises(ValueError, match=match):
        OrthoAdam([torch.nn.Parameter(torch.zeros(4))], **options)


# ----------------------------------------------------------------------------- the fused Triton step (CUDA's path)
@pytest.mark.slow   # the Triton kernel in Triton's interpreter
@pytest.mark.gpu   # on a GPU, gpu_suite.py runs it on CUDA
@pytest.mark.parametrize('residual_dim,shapes', [
    (48, {'rows': (6, 48), 'cols': (48, 5), 'vec': (48,), 'both': (48, 48), 'none': (40, 3)}),   # 48 = R_48
    (768, {'rows': (3, 768), 'cols': (768, 2), 'vec': (768,)}),                                 # H_32 (x) R_24
    (512, {'rows': (3, 512), 'cols': (512, 3)}),                                                # H_16 (x) H_32
    (64, {'rows': (20, 64), 'cols': (64, 17)}),                                                 # H_64
])
def test_fused_kernel_matches_dense_reference(residual_dim, shapes, monkeypatch):
    """kernels/orthoadam.py's one-kernel step (CUDA's path for a parameter with one rotated axis), here in Triton's
    interpreter on the CPU, against the dense float64 Algorithm 1: 4 steps, max abs difference <= 1e-5. A
    parameter with both axes rotated ('both') or none ('none') takes the stacked path in the same step."""
    pytest.importorskip('triton')
    if os.environ.get('TRITON_INTERPRET') != '1' and not torch.cuda.is_available():
        pytest.skip('needs CUDA or TRITON_INTERPRET=1')
    import orthoadam
    from kernels import orthoadam as orthoadam_kernel
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    monkeypatch.setattr(orthoadam, 'KERNEL_DEVICES', (device,))
    plans = []
    real_step = orthoadam_kernel.step
    monkeypatch.setattr(orthoadam_kernel, 'step', lambda how, *a, **k: plans.append(how) or real_step(how, *a, **k))
    params = {n: torch.nn.Parameter(p.detach().to(device)) for n, p in make_params(shapes).items()}
    grads = make_grads(params, 4)
    theta0 = {n: p.detach().cpu().clone() for n, p in params.items()}
    opt = OrthoAdam(list(params.items()), **HP, axes='residual', residual_dim=residual_dim)
    qs = {n: dense_q(opt, p) for n, p in params.items()}
    run(opt, params, grads)
    for n, p in params.items():
        want = reference_algorithm1(theta0[n], [g[n].cpu() for g in grads], qs[n], **HP)
        torch.testing.assert_close(p.detach().cpu().double().flatten(), want, atol=1e-5, rtol=0, msg=n)
    kernel_params = sum(1 for n in shapes if n not in ('both', 'none'))
    assert len(plans) == 4 * kernel_params   # every single-axis parameter, every step, took the kernel


def test_fused_kernel_that_cannot_compile_falls_back_with_one_line(monkeypatch, capsys):
    """A Triton compile error at the first launch: one warning line, then the stacked path, still Algorithm 1."""
    pytest.importorskip('triton')
    import orthoadam
    from kernels import orthoadam as orthoadam_kernel
    monkeypatch.setattr(orthoadam, 'KERNEL_DEVICES', ('cpu',))

    def broken(*a, **k):
        raise RuntimeError('PTX assembly failed\nmore detail')
    monkeypatch.setattr(orthoadam_kernel, 'step', broken)
    params = make_params({'rows': (6, 48), 'vec': (48,)})
    grads = make_grads(params, 3)
    theta0 = {n: p.detach().clone() for n, p in params.items()}
    opt = OrthoAdam(list(params.items()), **HP, axes='residual', residual_dim=48)
    qs = {n: dense_q(opt, p) for n, p in params.items()}
    run(opt, params, grads)
    err = capsys.readouterr().err
    assert err.count('warning:') == 1 and 'PTX assembly failed' in err and 'more detail' not in err
    for n, p in params.items():
        want = reference_algorithm1(theta0[n], [g[n] for g in grads], qs[n], **HP)
        torch.testing.assert_close(p.detach().double().flatten(), want, atol=1e-5, rtol=0, msg=n)


def test_kernel_plan_refuses_factors_that_do_not_cover_the_axis():
    """rotate() reads factors covering part of an axis as mats ⊗ I; the fused kernel rotates whole fibres, so its plan
    says in one line that it cannot take them, instead of rotating the wrong coordinates."""
    pytest.importorskip('triton')
    from kernels import orthoadam as orthoadam_kernel
    p = torch.zeros(6, 48)
    assert orthoadam_kernel.plan(p, (1,), (None, [torch.eye(48)])) == (1, 48, 1)
    assert orthoadam_kernel.plan(p, (1,), (None, [torch.eye(16), torch.eye(3)])) == (1, 16, 3)
    for mats, covered in (([torch.eye(16)], 16), ([torch.eye(16), torch.eye(2)], 32)):
        with pytest.raises(ValueError, match=rf"^orthoadam_kernel.plan: the rotation's factors cover {covered} "
                                             rf"coordinates of axis 1, which has 48; [^\n]*$"):
            orthoadam_kernel.plan(p, (1,), (None, mats))
