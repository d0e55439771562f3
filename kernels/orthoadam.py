"""OrthoAdam's whole step for one parameter in one Triton kernel: rotate, moments, rotate back, update.

    from kernels.orthoadam import plan, step
    how = plan(p, rotated_axes, factor)          # None when the kernel cannot take this parameter
    step(how, p, grad, exp_avg, exp_avg_sq, signs, mats, lr=..., betas=..., eps=..., weight_decay=..., t=...)

orthoadam.py calls it on CUDA for every parameter with exactly one rotated axis whose factor is at most two
matrices (the default: rotation 'hadamard', axes 'residual'; an axis of 768 = 32 x 24 is H_32 (x) R_24, 1024 is
H_32 (x) H_32); other parameters take orthoadam.py's stacked-matmul path. The arithmetic is Algorithm 1 as
orthoadam.py does it, with the same Q (its factors are passed in) and the moments stored in the same layout,
so the two paths can alternate within one run and share checkpoints.

The rotated axis, of size n = d1 d2, is viewed as (d1, d2): Q g = diag(signs) first, then A on d1 and B on d2,
i.e. A X B^T for the (d1, d2) matrix X of each fibre; Q^T s = A^T S B, then diag(signs). A program holds BL
whole fibres (rows of the parameter when the axis is the last, columns when it is the first), so every fibre is
rotated in registers: the step reads g, p, m, v and writes p, m, v once, as fused AdamW does. Dots are IEEE
fp32 (as orthoadam.py's matmuls, TF32 off); padding to powers of two is masked. If the kernel fails to compile
on a GPU, orthoadam.py says so in one line and keeps to its stacked path.
"""
import math

import triton
import triton.language as tl

MAX_TILE = 8192   # elements of one (BL, D1, D2) tile: four of them live in registers at once


def _pow2(n):
    return max(16, triton.next_power_of_2(n))


def plan(p, rotated, factor):
    """(axis, d1, d2) for the kernel, or None when it cannot run p's step (then orthoadam.py's path does). The factor's
    matrices must cover the rotated axis (d1 d2 = its size): ValueError otherwise."""
    if len(rotated) != 1 or p.dim() > 2 or not p.is_contiguous():
        return None
    axis = rotated[0]
    if p.dim() == 2 and axis not in (0, 1):
        return None
    mats = factor[1]
    covered = math.prod(m.shape[-1] for m in mats)
    if covered != p.shape[axis]:   # rotate() would read this as mats (x) I; the kernel rotates whole fibres only
        raise ValueError(f"orthoadam_kernel.plan: the rotation's factors cover {covered} coordinates of axis {axis}, "
                         f"which has {p.shape[axis]}; the kernel needs factors that cover the whole axis")
    if len(mats) not in (1, 2) or any(m.shape[-1] > 128 for m in mats):
        return None
    d1 = mats[0].shape[-1]
    d2 = mats[1].shape[-1] if len(mats) == 2 else 1
    if len(mats) == 2 and triton.next_power_of_2(d1) != d1:
        return None
    if _pow2(d1) * (_pow2(d2) if d2 > 1 else 16) > MAX_TILE // 2:   # at least two fibres (16 rows for one factor)
        return None
    return axis, d1, d2


@triton.jit
def _rotate(x, A, B, d1, d2, offs_a, offs_b, BL: tl.constexpr, D1: tl.constexpr, D2: tl.constexpr,
            TWO: tl.constexpr, TRANSPOSE: tl.constexpr, PRECISION: tl.constexpr):
    """A X B^T (TRANSPOSE: A^T X B) for every fibre X (D1, D2) of the tile x (BL, D1, D2); one factor: x A^T."""
    # mat^T for x @ mat^T is mat read with its indices swapped; TRANSPOSE reads mat as it is
    if TRANSPOSE:
        at = tl.load(A + offs_a[:, None] * d1 + offs_a[None, :],
                     mask=(offs_a[:, None] < d1) & (offs_a[None, :] < d1), other=0.0)
    else:
        at = tl.load(A + offs_a[None, :] * d1 + offs_a[:, None],
                     mask=(offs_a[:, None] < d1) & (offs_a[None, :] < d1), other=0.0)
    if TWO:
        if TRANSPOSE:
            bt = tl.load(B + offs_b[:, None] * d2 + offs_b[None, :],
                         mask=(offs_b[:, None] < d2) & (offs_b[None, :] < d2), other=0.0)
        else:
            bt = tl.load(B + offs_b[None, :] * d2 + offs_b[:, None],
                         mask=(offs_b[:, None] < d2) & (offs_b[None, :] < d2), other=0.0)
        x = tl.reshape(tl.dot(tl.reshape(x, (BL * D1, D2)), bt, input_precision=PRECISION), (BL, D1, D2))
        x = tl.reshape(tl.permute(x, (0, 2, 1)), (BL * D2, D1))
        x = tl.reshape(tl.dot(x, at, input_precision=PRECISION), (BL, D2, D1))
        return tl.permute(x, (0, 2, 1))
    else:
        return tl.dot(x, at, input_precision=PRECISION)


@triton.jit
def _step(P, G, M, V, S, A, B, L, stride_l, stride_n, d1, d2, lr, decay, beta1, beta2, eps, bc1, bc2_sqrt,
          BL: tl.constexpr, D1: tl.constexpr, D2: tl.constexpr, TWO: tl.constexpr, SIGNS: tl.constexpr,
          PRECISION: tl.constexpr):
    offs_l = tl.program_id(0) * BL + tl.arange(0, BL)
    offs_a = tl.arange(0, D1)
    offs_b = tl.arange(0, D2)
    if TWO:   # element (l, a, b) of the tile is coordinate a d2 + b of fibre l
        coord = offs_a[:, None] * d2 + offs_b[None, :]
        inside = (offs_a[:, None] < d1) & (offs_b[None, :] < d2)
        at = offs_l[:, None, None] * stride_l + coord[None, :, :] * stride_n
        mask = (offs_l < L)[:, None, None] & inside[None, :, :]
    else:
        coord = offs_a
        inside = offs_a < d1
        at = offs_l[:, None] * stride_l + coord[None, :] * stride_n
        mask = (offs_l < L)[:, None] & inside[None, :]
    g = tl.load(G + at, mask=mask, other=0.0).to(tl.float32)
    if SIGNS:
        signs = tl.load(S + coord, mask=inside, other=0.0)[None]
        g = g * signs
    g = _rotate(g, A, B, d1, d2, offs_a, offs_b, BL, D1, D2, TWO, False, PRECISION)
    m = tl.load(M + at, mask=mask, other=0.0)
    v = tl.load(V + at, mask=mask, other=0.0)
    m = m + (1 - beta1) * (g - m)          # torch's lerp form, as its fused Adam
    v = beta2 * v + (1 - beta2) * g * g
    tl.store(M + at, m, mask=mask)
    tl.store(V + at, v, mask=mask)
    u = (m / bc1) / (tl.sqrt(v) / bc2_sqrt + eps)
    u = _rotate(u, A, B, d1, d2, offs_a, offs_b, BL, D1, D2, TWO, True, PRECISION)
    if SIGNS:
        u = u * signs
    p = tl.load(P + at, mask=mask, other=0.0)
    tl.store(P + at, (p.to(tl.float32) * decay - lr * u).to(P.dtype.element_ty), mask=mask)


def step(how, p, grad, exp_avg, exp_avg_sq, signs, mats, lr, betas, eps, weight_decay, t, precision='ieee'):
    """One OrthoAdam step of p in place (and of its moments), Q given by signs ([n] or None) and mats (the
    axis factor's one or two matrices, fp32 on p's device)."""
    axis, d1, d2 = how
    two = len(mats) == 2
    n = d1 * d2
    if p.dim() == 1:
        L, stride_l, stride_n = 1, n, 1
    elif axis == 1:
        L, stride_l, stride_n = p.shape[0], p.shape[1], 1
    else:
        L, stride_l, stride_n = p.shape[1], 1, p.shape[1]
    D1, D2 = _pow2(d1), (_pow2(d2) if two else 1)
    BL = min(16, MAX_TILE // (D1 * D2)) if two else 16   # a dot takes 16 rows at least
    beta1, beta2 = betas
    _step[(triton.cdiv(L, BL),)](
        p, grad.contiguous(), exp_avg, exp_avg_sq, signs if signs is not None else p, mats[0],
        mats[1] if two else mats[0], L, stride_l, stride_n, d1, d2, float(lr), 1.0 - lr * weight_decay,
        beta1, beta2, eps, 1.0 - beta1 ** t, (1.0 - beta2 ** t) ** 0.5, BL=BL, D1=D1, D2=D2, TWO=two,
        SIGNS=signs is not None, PRECISION=precision, num_warps=8 if BL * D1 * D2 >= 4096 else 4)
