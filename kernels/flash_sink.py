"""Causal flash attention with a sink, in Triton: softmax-1 and the attention bias in one fused kernel.

    from kernels.flash_sink import flash_sink_attention
    y = flash_sink_attention(q, k, v, prefix)                  # softmax-1: exp(s_i) / (1 + sum_j exp(s_j))
    y = flash_sink_attention(q, k, v, prefix, bias_k, bias_v)  # attention bias: a learnt key k' and value v'

q, k, v are (B, H, T, d) CUDA tensors (any strides with a contiguous last axis, as the model's views of c_attn's
output), d a power of two from 16 to 128, bf16 / fp16 / fp32; y is (B, H, T, d) laid out as (B, T, H, d), the
layout the model's transpose-and-view needs. The first `prefix` tokens see each other, the rest is causal.

The sink is one more key that every query sees, of logit c and value u: c = 0 and u = 0 for softmax-1,
c_i = q_i.k' / sqrt(d) and u = v' for the attention bias. In the online softmax of a flash kernel it is the
starting point of every row: running max m = c, running sum l = exp(c - m) = 1, accumulator u, instead of
m = -inf, l = 0, 0. The stored log-sum-exp L then includes the sink, and the standard backward is exact:
    P_ij = exp(s_ij - L_i),  D_i = dy_i.y_i,  ds_ij = P_ij (dy_i.v_j - D_i),  dV = P^T dy,
because y (the output, sink term included) is what D is computed from. The sink's own gradients, with
p_i = exp(c_i - L_i) its probability: dc_i = p_i (dy_i.u - D_i), du = sum_i p_i dy_i, and through
c_i = q_i.k' / sqrt(d): dq_i += dc_i k' / sqrt(d), dk' = sum_i dc_i q_i / sqrt(d). They are computed in the
same pass as D (per block partial sums, added up afterwards: deterministic, no atomics).

Three kernels, each one launch: the forward; _bwd_rows (D, and the sink's terms); _bwd (dK, dV for one key block
and dQ for one query block per program). Scores are kept in base 2 (exp2), the log-sum-exp too (L2 = L / ln 2).

The same kernels run on the CPU under Triton's interpreter (TRITON_INTERPRET=1 set before this module is
imported), which is how the tests check their arithmetic without a GPU. `torch.compile` sees them through
torch.library.triton_op, so Inductor schedules them like its own kernels.
"""
import math
from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

LOG2E = 1.4426950408889634
HEAD_DIMS = (16, 32, 64, 128)


def supported(q, k, v):
    """None when the kernels can run this call, else the reason they cannot (one line)."""
    if q.size(-1) not in HEAD_DIMS or k.size(-1) != q.size(-1) or v.size(-1) != q.size(-1):
        return f"head size {q.size(-1)} (the Triton kernel takes {', '.join(map(str, HEAD_DIMS))})"
    if q.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"dtype {q.dtype}"
    if not (q.dtype == k.dtype == v.dtype):
        return "q, k and v of different dtypes"
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        return "a last axis that is not contiguous"
    if k.shape[:3] != q.shape[:3] or v.shape[:3] != q.shape[:3]:
        return "keys and queries of different shapes (cross attention)"
    return None


# Tile shapes: the forward's (BLOCK_M, BLOCK_N, warps, stages) and the backward's (BLOCK_M1, BLOCK_N1, BLOCK_M2,
# BLOCK_N2, warps, stages), with BLOCK_N | BLOCK_M, BLOCK_M1 | BLOCK_N1 and BLOCK_N2 | BLOCK_M2. CANDIDATES are
# what `python bench.py --sections tune` times on a GPU (and tests/test_flash_sink.py checks in the interpreter);
# blocks() returns the winners for 16-bit inputs, smaller tiles for fp32 (twice the bytes per element) and d = 128.
FWD_CANDIDATES = [(64, 64, 4, 3), (64, 32, 4, 3), (64, 64, 4, 2), (64, 64, 4, 4), (128, 64, 8, 3), (64, 32, 2, 3),
                  (32, 32, 2, 3), (128, 64, 4, 3)]
BWD_CANDIDATES = [(16, 64, 64, 16, 4, 3), (16, 64, 64, 16, 4, 2), (16, 64, 64, 16, 4, 4), (16, 64, 64, 16, 2, 3),
                  (16, 128, 128, 16, 4, 3), (16, 128, 128, 16, 8, 3), (32, 64, 64, 32, 4, 3), (16, 32, 32, 16, 2, 3),
                  (32, 128, 128, 32, 8, 3), (64, 64, 64, 64, 4, 3)]
FORCE = None   # (fwd, bwd) tiles used instead of blocks()'s choice: set by the tuner


def blocks(T, d, dtype):
    """(forward tiles, backward tiles) for sequence length T, head size d and the inputs' dtype."""
    if FORCE is not None:
        return FORCE
    if dtype == torch.float32 or d > 64:
        return (64, 32, 4, 2), (32, 64, 64, 32, 4, 2)
    return (64, 64, 4, 3), (16, 64, 64, 16, 4, 3)


# ----------------------------------------------------------------------------- kernels
@triton.jit
def _visible(offs_m, offs_n, T, PREFIX):
    """Causal, the first PREFIX tokens free among themselves, keys inside the sequence."""
    return ((offs_n[None, :] <= offs_m[:, None]) | ((offs_m[:, None] < PREFIX) & (offs_n[None, :] < PREFIX))) \
        & (offs_n[None, :] < T)


@triton.jit
def _fwd_block(acc, l_i, m_i, q, k_ptrs, v_ptrs, offs_m, start_n, T, PREFIX, qk_scale, stride_kt, stride_vt,
               offs_n, MASKED: tl.constexpr, PRECISION: tl.constexpr):
    """One key block of the online softmax: s = q k^T, running max, rescaled sum and accumulator."""
    if MASKED:
        in_seq = (start_n + offs_n) < T
        kT = tl.load(k_ptrs + start_n * stride_kt, mask=in_seq[None, :], other=0.0)
        v = tl.load(v_ptrs + start_n * stride_vt, mask=in_seq[:, None], other=0.0)
    else:
        kT = tl.load(k_ptrs + start_n * stride_kt)
        v = tl.load(v_ptrs + start_n * stride_vt)
    s = tl.dot(q, kT, input_precision=PRECISION) * qk_scale
    if MASKED:
        s = tl.where(_visible(offs_m, start_n + offs_n, T, PREFIX), s, float('-inf'))
    m_new = tl.maximum(m_i, tl.max(s, 1))          # finite: m_i starts at the sink's logit
    p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
    return acc, l_i, m_new


@triton.jit
def _fwd(Q, K, V, KS, VS, O, L2, stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt, stride_vb,
         stride_vh, stride_vt, stride_ob, stride_oh, stride_ot, H, T, PREFIX, qk_scale: tl.constexpr,
         HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SINK_KV: tl.constexpr,
         PRECISION: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m < T
    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :],
                mask=rows[:, None], other=0.0)
    if SINK_KV:   # attention bias: logit c = q.k' / sqrt(d) (here in base 2), value v'
        ks = tl.load(KS + h * HEAD_DIM + offs_d)
        m_i = tl.sum(q.to(tl.float32) * ks[None, :], 1) * qk_scale
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32) + tl.load(VS + h * HEAD_DIM + offs_d)[None, :]
    else:         # softmax-1: logit 0, value 0
        m_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32) + 1.0   # exp(c - m) with m = c
    k_ptrs = K + b * stride_kb + h * stride_kh + offs_n[None, :] * stride_kt + offs_d[:, None]
    v_ptrs = V + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vt + offs_d[None, :]
    for start_n in range(0, start_m, BLOCK_N):    # keys before the block's first query: all visible
        acc, l_i, m_i = _fwd_block(acc, l_i, m_i, q, k_ptrs, v_ptrs, offs_m, start_n, T, PREFIX, qk_scale,
                                   stride_kt, stride_vt, offs_n, False, PRECISION)
    hi = tl.minimum(T, tl.maximum(start_m + BLOCK_M, PREFIX))
    for start_n in range(start_m, hi, BLOCK_N):   # the diagonal, and the free prefix beyond it
        acc, l_i, m_i = _fwd_block(acc, l_i, m_i, q, k_ptrs, v_ptrs, offs_m, start_n, T, PREFIX, qk_scale,
                                   stride_kt, stride_vt, offs_n, True, PRECISION)
    o = acc / l_i[:, None]
    tl.store(O + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :],
             o.to(O.dtype.element_ty), mask=rows[:, None])
    tl.store(L2 + bh * T + offs_m, m_i + tl.math.log2(l_i), mask=rows)


@triton.jit
def _bwd_rows(O, DO, Q, KS, VS, L2, D, DC, DKS, DVS, stride_ob, stride_oh, stride_ot, stride_qb, stride_qh,
              stride_qt, H, T, qk_scale: tl.constexpr, sm_scale: tl.constexpr, HEAD_DIM: tl.constexpr,
              BLOCK: tl.constexpr, SINK_KV: tl.constexpr):
    """D_i = dy_i.y_i; with a sink key and value also dc_i and this block's partial sums of dk' and dv'."""
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    offs_m = pid * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m < T
    at = b * stride_ob + h * stride_oh + offs_m[:, None] * stride_ot + offs_d[None, :]   # y and dy share a layout
    o = tl.load(O + at, mask=rows[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + at, mask=rows[:, None], other=0.0).to(tl.float32)
    delta = tl.sum(o * do, 1)
    tl.store(D + bh * T + offs_m, delta, mask=rows)
    if SINK_KV:
        q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None] * stride_qt + offs_d[None, :],
                    mask=rows[:, None], other=0.0).to(tl.float32)
        ks = tl.load(KS + h * HEAD_DIM + offs_d)
        vs = tl.load(VS + h * HEAD_DIM + offs_d)
        l2 = tl.load(L2 + bh * T + offs_m, mask=rows, other=0.0)
        p_sink = tl.where(rows, tl.math.exp2(tl.sum(q * ks[None, :], 1) * qk_scale - l2), 0.0)
        dc = p_sink * (tl.sum(do * vs[None, :], 1) - delta)
        tl.store(DC + bh * T + offs_m, dc, mask=rows)
        part = ((h * tl.num_programs(1) // H + b) * tl.num_programs(0) + pid) * HEAD_DIM + offs_d   # (h, b, pid)
        tl.store(DKS + part, tl.sum(dc[:, None] * q, 0) * sm_scale)
        tl.store(DVS + part, tl.sum(p_sink[:, None] * do, 0))


@triton.jit
def _bwd_dkdv_block(dk, dv, k, v, Q, DO, L2, D, qT_ptrs, do_ptrs, offs_n, start_m, T, PREFIX, qk_scale,
                    stride_qt, stride_ot, offs_mb, MASKED: tl.constexpr, EVEN: tl.constexpr, PRECISION: tl.constexpr):
    """dK, dV of one key block from one query block, in the transposed form s^T = k q^T. EVEN: the query block
    lies inside the sequence (no row masks)."""
    offs_m = start_m + offs_mb
    if EVEN:
        qT = tl.load(qT_ptrs + start_m * stride_qt)
        do = tl.load(do_ptrs + start_m * stride_ot)
        l2 = tl.load(L2 + offs_m)
        delta = tl.load(D + offs_m)
    else:
        rows = offs_m < T
        qT = tl.load(qT_ptrs + start_m * stride_qt, mask=rows[None, :], other=0.0)
        do = tl.load(do_ptrs + start_m * stride_ot, mask=rows[:, None], other=0.0)
        l2 = tl.load(L2 + offs_m, mask=rows, other=0.0)
        delta = tl.load(D + offs_m, mask=rows, other=0.0)
    sT = tl.dot(k, qT, input_precision=PRECISION) * qk_scale - l2[None, :]
    if MASKED:   # masked before exp2: a hidden key's score may exceed the row's log-sum-exp (exp2 would overflow)
        sT = tl.where(tl.trans(_visible(offs_m, offs_n, T, PREFIX)), sT, float('-inf'))
    pT = tl.math.exp2(sT)
    if not MASKED and not EVEN:
        pT = tl.where(rows[None, :], pT, 0.0)
    dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=PRECISION)
    dpT = tl.dot(v, tl.trans(do), input_precision=PRECISION)
    dsT = pT * (dpT - delta[None, :])
    dk = tl.dot(dsT.to(qT.dtype), tl.trans(qT), dk, input_precision=PRECISION)
    return dk, dv


@triton.jit
def _bwd_dq_block(dq, q, do, l2, delta, kT_ptrs, vT_ptrs, offs_m, start_n, T, PREFIX, qk_scale, stride_kt,
                  stride_vt, offs_nb, MASKED: tl.constexpr, PRECISION: tl.constexpr):
    """dQ of one query block from one key block."""
    offs_n = start_n + offs_nb
    if MASKED:
        cols = offs_n < T
        kT = tl.load(kT_ptrs + start_n * stride_kt, mask=cols[None, :], other=0.0)
        vT = tl.load(vT_ptrs + start_n * stride_vt, mask=cols[None, :], other=0.0)
    else:
        kT = tl.load(kT_ptrs + start_n * stride_kt)
        vT = tl.load(vT_ptrs + start_n * stride_vt)
    s = tl.dot(q, kT, input_precision=PRECISION) * qk_scale - l2[:, None]
    if MASKED:   # masked before exp2, as in the forward (a hidden key's score may exceed the log-sum-exp)
        s = tl.where(_visible(offs_m, offs_n, T, PREFIX), s, float('-inf'))
    p = tl.math.exp2(s)
    dp = tl.dot(do, vT, input_precision=PRECISION)
    ds = p * (dp - delta[:, None])
    return tl.dot(ds.to(kT.dtype), tl.trans(kT), dq, input_precision=PRECISION)


@triton.jit
def _bwd(Q, K, V, DO, L2, D, DC, KS, DQ, DK, DV, stride_qb, stride_qh, stride_qt, stride_kb, stride_kh,
         stride_kt, stride_vb, stride_vh, stride_vt, stride_ob, stride_oh, stride_ot, stride_gb, stride_gh,
         stride_gt, H, T, PREFIX, qk_scale: tl.constexpr, sm_scale: tl.constexpr, HEAD_DIM: tl.constexpr,
         BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr, BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr,
         SINK_KV: tl.constexpr, EVEN: tl.constexpr, PRECISION: tl.constexpr):
    """Program (j, bh): dK and dV of key block j, then dQ of query block j (dY is laid out like Y, and dQ, dK,
    dV share one layout, stride_g*)."""
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    offs_d = tl.arange(0, HEAD_DIM)
    Q += b * stride_qb + h * stride_qh
    K += b * stride_kb + h * stride_kh
    V += b * stride_vb + h * stride_vh
    DO += b * stride_ob + h * stride_oh
    L2 += bh * T
    D += bh * T
    g = b * stride_gb + h * stride_gh

    # dK, dV of keys [start_n, start_n + BLOCK_N1): the queries that see them are those from start_n on, and
    # with a free prefix every query before PREFIX too
    start_n = pid * BLOCK_N1
    if start_n < T:
        offs_n = start_n + tl.arange(0, BLOCK_N1)
        offs_mb = tl.arange(0, BLOCK_M1)
        cols = offs_n < T
        k = tl.load(K + offs_n[:, None] * stride_kt + offs_d[None, :], mask=cols[:, None], other=0.0)
        v = tl.load(V + offs_n[:, None] * stride_vt + offs_d[None, :], mask=cols[:, None], other=0.0)
        dk = tl.zeros([BLOCK_N1, HEAD_DIM], tl.float32)
        dv = tl.zeros([BLOCK_N1, HEAD_DIM], tl.float32)
        qT_ptrs = Q + offs_mb[None, :] * stride_qt + offs_d[:, None]
        do_ptrs = DO + offs_mb[:, None] * stride_ot + offs_d[None, :]
        lo = tl.where(start_n < PREFIX, 0, start_n)
        diagonal_end = tl.minimum(start_n + BLOCK_N1, T)
        for start_m in range(lo, diagonal_end, BLOCK_M1):
            dk, dv = _bwd_dkdv_block(dk, dv, k, v, Q, DO, L2, D, qT_ptrs, do_ptrs, offs_n, start_m, T, PREFIX,
                                     qk_scale, stride_qt, stride_ot, offs_mb, True, False, PRECISION)
        for start_m in range(diagonal_end, T, BLOCK_M1):   # queries after the block see all of it
            dk, dv = _bwd_dkdv_block(dk, dv, k, v, Q, DO, L2, D, qT_ptrs, do_ptrs, offs_n, start_m, T, PREFIX,
                                     qk_scale, stride_qt, stride_ot, offs_mb, False, EVEN, PRECISION)
        at = g + offs_n[:, None] * stride_gt + offs_d[None, :]
        tl.store(DK + at, (dk * sm_scale).to(DK.dtype.element_ty), mask=cols[:, None])
        tl.store(DV + at, dv.to(DV.dtype.element_ty), mask=cols[:, None])

    # dQ of queries [start_m, start_m + BLOCK_M2)
    start_m = pid * BLOCK_M2
    if start_m < T:
        offs_m = start_m + tl.arange(0, BLOCK_M2)
        offs_nb = tl.arange(0, BLOCK_N2)
        rows = offs_m < T
        q = tl.load(Q + offs_m[:, None] * stride_qt + offs_d[None, :], mask=rows[:, None], other=0.0)
        do = tl.load(DO + offs_m[:, None] * stride_ot + offs_d[None, :], mask=rows[:, None], other=0.0)
        l2 = tl.load(L2 + offs_m, mask=rows, other=0.0)
        delta = tl.load(D + offs_m, mask=rows, other=0.0)
        dq = tl.zeros([BLOCK_M2, HEAD_DIM], tl.float32)
        kT_ptrs = K + offs_nb[None, :] * stride_kt + offs_d[:, None]
        vT_ptrs = V + offs_nb[None, :] * stride_vt + offs_d[:, None]
        for start_n in range(0, start_m, BLOCK_N2):
            dq = _bwd_dq_block(dq, q, do, l2, delta, kT_ptrs, vT_ptrs, offs_m, start_n, T, PREFIX, qk_scale,
                               stride_kt, stride_vt, offs_nb, False, PRECISION)
        hi = tl.minimum(T, tl.maximum(start_m + BLOCK_M2, PREFIX))
        for start_n in range(start_m, hi, BLOCK_N2):
            dq = _bwd_dq_block(dq, q, do, l2, delta, kT_ptrs, vT_ptrs, offs_m, start_n, T, PREFIX, qk_scale,
                               stride_kt, stride_vt, offs_nb, True, PRECISION)
        dq = dq * sm_scale
        if SINK_KV:   # c_i = q_i.k' / sqrt(d)
            dc = tl.load(DC + bh * T + offs_m, mask=rows, other=0.0)
            dq += dc[:, None] * tl.load(KS + h * HEAD_DIM + offs_d)[None, :] * sm_scale
        tl.store(DQ + g + offs_m[:, None] * stride_gt + offs_d[None, :], dq.to(DQ.dtype.element_ty),
                 mask=rows[:, None])


# ----------------------------------------------------------------------------- launchers
def _direct(kernel):
    """Eager launches: the kernel itself (wrap_triton, which torch.compile needs, adds a dispatch per call)."""
    return kernel


def _bthd(B, H, T, d, like):
    """An empty (B, H, T, d) tensor laid out as (B, T, H, d)."""
    return torch.empty(B, T, H, d, dtype=like.dtype, device=like.device).transpose(1, 2)


def _strides(t):
    return t.stride(0), t.stride(1), t.stride(2)


def _precision(q):
    return 'ieee' if q.dtype == torch.float32 else 'tf32'


def _sink_args(q, ks, vs):
    """The sink's key and value as (H, d) fp32, or q itself as a placeholder the kernels never read."""
    if ks is None:
        return q, q
    H, d = q.size(1), q.size(-1)
    return ks.reshape(H, d).float().contiguous(), vs.reshape(H, d).float().contiguous()


def _forward(q, k, v, ks, vs, prefix, launch=wrap_triton):
    B, H, T, d = q.shape
    o = _bthd(B, H, T, d, q)
    l2 = torch.empty(B, H, T, dtype=torch.float32, device=q.device)
    (bm, bn, warps, stages), _ = blocks(T, d, q.dtype)
    kst, vst = _sink_args(q, ks, vs)
    launch(_fwd)[(triton.cdiv(T, bm), B * H)](
        q, k, v, kst, vst, o, l2, *_strides(q), *_strides(k), *_strides(v), *_strides(o), H, T, prefix,
        LOG2E / math.sqrt(d), HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, SINK_KV=ks is not None,
        PRECISION=_precision(q), num_warps=warps, num_stages=stages)
    return o, l2


def _backward(do, q, k, v, o, l2, ks, vs, prefix, launch=wrap_triton):
    B, H, T, d = q.shape
    if do.stride() != o.stride():   # _bwd_rows and _bwd read dY with Y's strides
        do = _bthd(B, H, T, d, do).copy_(do)
    sm_scale = 1 / math.sqrt(d)
    sink = ks is not None
    kst, vst = _sink_args(q, ks, vs)
    rows_block = 64
    n_rows = triton.cdiv(T, rows_block)
    delta = torch.empty(B, H, T, dtype=torch.float32, device=q.device)
    dc = torch.empty_like(delta) if sink else delta
    parts = torch.empty(2, B * H * n_rows, d, dtype=torch.float32, device=q.device) if sink else delta
    launch(_bwd_rows)[(n_rows, B * H)](
        o, do, q, kst, vst, l2, delta, dc, parts[0] if sink else delta, parts[1] if sink else delta,
        *_strides(o), *_strides(q), H, T, LOG2E * sm_scale, sm_scale, HEAD_DIM=d, BLOCK=rows_block,
        SINK_KV=sink)
    dq, dk, dv = (_bthd(B, H, T, d, q) for _ in range(3))
    _, (bm1, bn1, bm2, bn2, warps, stages) = blocks(T, d, q.dtype)
    launch(_bwd)[(triton.cdiv(T, min(bn1, bm2)), B * H)](
        q, k, v, do, l2, delta, dc, kst, dq, dk, dv, *_strides(q), *_strides(k), *_strides(v), *_strides(do),
        *_strides(dq), H, T, prefix, LOG2E * sm_scale, sm_scale, HEAD_DIM=d, BLOCK_M1=bm1, BLOCK_N1=bn1,
        BLOCK_M2=bm2, BLOCK_N2=bn2, SINK_KV=sink, EVEN=T % bm1 == 0, PRECISION=_precision(q), num_warps=warps,
        num_stages=stages)
    if not sink:
        return dq, dk, dv, None, None
    dks, dvs = parts.view(2, H, B * n_rows, d).sum(2).to(ks.dtype).unbind(0)   # one reduction for both
    return dq, dk, dv, dks.view(1, H, 1, d), dvs.view(1, H, 1, d)


# ----------------------------------------------------------------------------- autograd, eager and compiled
@triton_op('softmax1::flash_sink_forward', mutates_args=())
def flash_sink_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ks: Optional[torch.Tensor],
                       vs: Optional[torch.Tensor], prefix: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, L2): the attention output and each query's base-2 log-sum-exp, the sink included."""
    return _forward(q, k, v, ks, vs, prefix)


@triton_op('softmax1::flash_sink_backward', mutates_args=())
def flash_sink_backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                        l2: torch.Tensor, ks: Optional[torch.Tensor], vs: Optional[torch.Tensor],
                        prefix: int) -> list[torch.Tensor]:
    """[dq, dk, dv], and [dk', dv'] after them when the sink has a key and value."""
    return [g for g in _backward(do, q, k, v, o, l2, ks, vs, prefix) if g is not None]


def _setup_context(ctx, inputs, output):
    q, k, v, ks, vs, prefix = inputs
    ctx.save_for_backward(q, k, v, ks, vs, *output)
    ctx.prefix = prefix


def _op_backward(ctx, do, _dl2):
    q, k, v, ks, vs, o, l2 = ctx.saved_tensors
    grads = flash_sink_backward(do, q, k, v, o, l2, ks, vs, ctx.prefix)
    return *grads, *[None] * (6 - len(grads))


flash_sink_forward.register_autograd(_op_backward, setup_context=_setup_context)


class _FlashSink(torch.autograd.Function):
    """Eager mode: the launchers without the custom op's dispatch."""
    @staticmethod
    def forward(ctx, q, k, v, ks, vs, prefix):
        o, l2 = _forward(q, k, v, ks, vs, prefix, _direct)
        ctx.save_for_backward(q, k, v, ks, vs, o, l2)
        ctx.prefix = prefix
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, ks, vs, o, l2 = ctx.saved_tensors
        return *_backward(do, q, k, v, o, l2, ks, vs, ctx.prefix, _direct), None


def flash_sink_attention(q, k, v, prefix=0, bias_k=None, bias_v=None):
    """Causal attention of q, k, v (B, H, T, d) with a sink key: softmax-1 when bias_k / bias_v are None,
    else the attention bias (k', v' each (1, H, 1, d)). See the module docstring."""
    if torch.compiler.is_compiling():
        return flash_sink_forward(q, k, v, bias_k, bias_v, prefix)[0]
    return _FlashSink.apply(q, k, v, bias_k, bias_v, prefix)
