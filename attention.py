"""Causal attention for every variant of model.py, fused where the formula allows, eager where it must be.

    from attention import attention, attention_probs
    y = attention(q, k, v, config, dropout_p, sink)      # training path; q, k, v (B, H, T, d)
    p = attention_probs(q, k, config, sink)              # analysis and KV-cache path: (B, H, T, S) fp32 probabilities

Variants (GPTConfig.attn, GPTConfig.attn_bias):
  softmax    F.scaled_dot_product_attention (flash, memory-efficient or cuDNN on CUDA; flash on CPU).
  softmax1   exp(s_i) / (1 + sum_j exp(s_j)) (the paper): softmax over the real keys plus one more key of
             logit 0 and value 0, seen by every query. CUDA: kernels/flash_sink.py's Triton kernel, where the sink is
             the starting point of the online softmax (one fused kernel, forward and backward); CPU, and CUDA
             where that kernel cannot run (one warning line): the sink route below.
  attn_bias  a learnt key k' and value v' per head, seen by every query (Sun et al., 2024): one more key of
             logit c = q.k' / sqrt(d) and value v' -> the same two routes. Softmax-1 is k' = 0, v' = 0.
  gated      softmax attention; the model multiplies each head's output by its gate (model.py).
  clipped    clip((zeta - gamma) softmax(s) + gamma, 0, 1) (Bondarenko et al., 2023): eager, T x T.
  sigmoid    sigmoid(s + b) without normalisation (Ramapuram et al., 2024): eager, T x T.
  softpick   ReLU(exp(s_i) - 1) / (sum_j |exp(s_j) - 1| + eps) (Zuhri et al., 2025): eager, T x T (softpick()).
  relu       ReLU(s_ij) / i, i the query's 1-based position (Guo et al., 2024): not normalised, a row may sum to
             anything >= 0; eager, T x T.
Every variant is causal; the first `causal_free_prefix` tokens also see each other.

The sink route. Softmax over the real keys plus one key of logit c (per query) and value u equals
    y = w o + (1 - w) u,   w = sigmoid(L - c),   L = logsumexp_j s_j,
with o = softmax(s) v and L taken from the fused kernel SDPA would run (torch._fused_sdp_choice, so
sdpa_kernel() contexts apply): no extra position, no T x T matrix. Backward: dL/ds_ij = P_ij and
y - u = w (o - u), so dL = (1 - w) dy.(y - u), dc = -dL, du = (1 - w) dy and
    ds_ij = P_ij (w dy.v_j - w^2 o.dy - w (1 - w) u.dy),   dV = P^T (w dy).
The kernel's own backward called with out = y and grad = w dy computes P from L, its row term
rowsum(y * w dy) = w^2 o.dy + w (1 - w) u.dy and hence exactly this ds and dV. Forward and backward may even
run different kernels (an sdpa_kernel context left between them): L is kept in one layout and handed to each
in its own. When no fused kernel applies, an eager fp32 version of the same formulas runs. With dropout the
kernels' random state would have to cross the op, so dropout > 0 takes the extra-key route: the sink key and
value and a dummy query prepended inside SDPA, T + 1 positions (extra_key_attention).
"""
import math
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend


def attention_mask(T, prefix, device, S=None):
    """Boolean (T, S) mask, True = may attend: causal, except the first `prefix` tokens see each other. The T
    queries are the last T of the S positions (S = T by default; S > T when decoding with a KV cache)."""
    S = T if S is None else S
    i, j = torch.arange(S - T, S, device=device), torch.arange(S, device=device)
    mask = j[None, :] <= i[:, None]
    if prefix:
        mask |= (i[:, None] < prefix) & (j[None, :] < prefix)
    return mask


# The variants no fused kernel computes: their training path builds the T x T probabilities (attention_probs), which
# costs more time and memory (reproduce.py's time estimate reads this). Every other variant is fused.
EAGER = ('clipped', 'sigmoid', 'softpick', 'relu')


def sigmoid_bias(config):
    return -math.log(config.block_size) if config.sigmoid_bias is None else config.sigmoid_bias


def attention(q, k, v, config, dropout_p=0.0, sink=None):
    """Attention output (B, H, T, d) of the training path. sink: attn_bias's learnt (key, value), each
    (1, H, 1, d); None otherwise."""
    prefix = config.causal_free_prefix
    if config.attn in EAGER:
        p = attention_probs(q, k, config)
        return F.dropout(p, dropout_p, training=dropout_p > 0).to(v.dtype) @ v
    if config.attn == 'softmax1' or sink is not None:
        if dropout_p == 0.0 and q.is_cuda:
            kernel, reason = flash_sink_kernel(q, k, v)
            if kernel is not None:
                return kernel.flash_sink_attention(q, k, v, prefix, *(sink or (None, None)))
            warn_once(f"softmax-1 / attn_bias on CUDA: the Triton kernel cannot run ({reason}); using the slower "
                      f"SDPA log-sum-exp route")
        if dropout_p == 0.0 and q.device.type in ('cpu', 'cuda'):
            return sink_route(q, k, v, prefix, sink)
        return extra_key_attention(q, k, v, prefix, dropout_p, sink)
    if prefix:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask(q.size(2), prefix, q.device),
                                              dropout_p=dropout_p)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)


def sink_route(q, k, v, prefix=0, sink=None):
    """Softmax-1 (sink None) or the attention bias (sink = (k', v')) by the log-sum-exp route below: the CPU's
    path, and CUDA's where the Triton kernel cannot run."""
    compiling = torch.compiler.is_compiling()
    if sink is None and compiling:   # softmax-1: logit 0, value 0
        c, u = q.new_zeros((), dtype=torch.float32), q.new_zeros(())
    elif sink is None:   # eager: 0-d zeros made once per device and dtype
        c, u = _zero(q.device, torch.float32), _zero(q.device, q.dtype)
    else:
        c, u = sink_logit(q, sink[0]), sink[1]
    if compiling:   # the custom op: one opaque node in the compiled graph
        return sink_attention(q, k, v, c, u, prefix)[0]
    return SinkAttention.apply(q, k, v, c, u, prefix)   # eager: the same functions, less dispatch


_ZEROS = {}


def _zero(device, dtype):
    """A 0-d zero of that device and dtype, shared by every call (never written; no grad)."""
    if (device, dtype) not in _ZEROS:
        _ZEROS[(device, dtype)] = torch.zeros((), device=device, dtype=dtype)
    return _ZEROS[(device, dtype)]


def flash_sink_kernel(q, k, v):
    """(flash_sink module, None) when its Triton kernel can run this CUDA call, else (None, the reason). Imported
    on first use: Triton takes about a second to import, which CPU runs need not pay."""
    try:
        from kernels import flash_sink
    except ImportError as e:   # a CUDA build of torch ships Triton; a custom build may not
        return None, f"cannot import Triton: {e}"
    reason = flash_sink.supported(q, k, v)
    return (None, reason) if reason else (flash_sink, None)


_WARNED = set()


@torch.compiler.disable
def warn_once(message):
    if message not in _WARNED:
        _WARNED.add(message)
        print(f"warning: {message}", file=sys.stderr, flush=True)


def sink_logit(q, key):
    """attn_bias's logit q.k' / sqrt(d) of every query (B, H, T), fp32."""
    return (q.float() * key.float()).sum(-1) / math.sqrt(q.size(-1))


def attention_probs(q, k, config, sink=None, hide_first=None):
    """Eager attention probabilities (B, H, T, S) over the real keys, fp32; S = T, or S > T for the last T queries
    of S positions (decoding with a KV cache). Softmax-1 and attn_bias (sink = its (key, value)) rows sum to < 1,
    the rest going to the sink; sigmoid, clipped, softpick and relu rows need not sum to 1. hide_first: the position
    of the first token, whose key no other query may see (intervene.py), or None."""
    T, S = q.size(2), k.size(2)
    visible = attention_mask(T, config.causal_free_prefix, q.device, S)
    if hide_first is not None and hide_first < S:
        visible[:, hide_first] = False
        if 0 <= hide_first - (S - T) < T:           # the first token itself still sees its own key
            visible[hide_first - (S - T), hide_first] = True
    scores = ((q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))).float()
    if config.attn == 'sigmoid':
        return torch.sigmoid(scores + sigmoid_bias(config)).masked_fill(~visible, 0.0)
    if config.attn == 'relu':   # Guo et al.: row i divided by i, the query's 1-based position (a cache's included)
        position = torch.arange(S - T + 1, S + 1, device=q.device, dtype=torch.float32)[:, None]
        return torch.relu(scores).masked_fill(~visible, 0.0) / position
    scores = scores.masked_fill(~visible, float('-inf'))
    if config.attn == 'clipped':
        zeta, gamma = config.clip_zeta, config.clip_gamma
        return ((zeta - gamma) * torch.softmax(scores, dim=-1) + gamma).clamp(0.0, 1.0)
    if config.attn == 'softpick':
        return softpick(scores, visible)
    if config.attn != 'softmax1' and sink is None:
        return torch.softmax(scores, dim=-1)
    # exp(s_i) / (exp(c) + sum_j exp(s_j)), stabilised by m = max(row max, c) so that neither term overflows
    c = torch.zeros((), device=q.device) if sink is None else sink_logit(q, sink[0])[..., None]
    m = torch.maximum(scores.amax(dim=-1, keepdim=True), c)
    e = torch.exp(scores - m)
    return e / (torch.exp(c - m) + e.sum(dim=-1, keepdim=True))


SOFTPICK_EPS = 1e-8   # softpick's eps (Zuhri et al.'s code)


def softpick(scores, visible):
    """ReLU(e^s_i - 1) / (sum_j |e^s_j - 1| + eps) over the visible keys j, exact for any logits. With m = max(0, the
    row's largest visible logit), e^s - 1 = e^m t(s), t(s) = e^(s - m) - e^(-m), so that
        p_i = ReLU(t_i) / (sum_j |t_j| + eps e^(-m)),
    the same numbers with every term in [-1, 1] (no overflow; e^m cancels, eps scaled with it). Near s = 0,
    e^(s - m) - e^(-m) would cancel to a few correct digits, so t is taken as a product of factors known to full
    relative precision: e^(-m) expm1(s) for s <= 0 and -e^(s - m) expm1(-s) for s > 0 (each branch is fed the
    other's values clamped to 0, so that neither makes an inf or a NaN for autograd). A row whose visible logits
    are all <= 0 is all zeros: the query attends nowhere. scores: fp32, -inf where not visible."""
    m = scores.amax(dim=-1, keepdim=True).clamp_min(0).detach()   # p does not depend on m: no gradient through it
    below, above = scores.clamp_max(0), scores.clamp_min(0)
    t = torch.where(scores > 0, -torch.exp(above - m) * torch.expm1(-above), torch.exp(-m) * torch.expm1(below))
    t = t.masked_fill(~visible, 0.0)
    return torch.relu(t) / (t.abs().sum(dim=-1, keepdim=True) + SOFTPICK_EPS * torch.exp(-m))


def extra_key_attention(q, k, v, prefix=0, dropout_p=0.0, sink=None):
    """The sink as a real key: its key (zero for softmax-1, k' for attn_bias) and value are prepended with a
    dummy query, so the square (T+1) x (T+1) causal mask lets real query i see the sink plus real keys
    0..i; the dummy query's output row is dropped. Exact; one position more than softmax."""
    B, H, _, d = q.shape
    zero = q.new_zeros(B, H, 1, d)
    key, value = (zero, zero) if sink is None else (sink[0].expand(B, H, 1, d).to(q.dtype),
                                                    sink[1].expand(B, H, 1, d).to(v.dtype))
    q, k, v = torch.cat((zero, q), dim=2), torch.cat((key, k), dim=2), torch.cat((value, v), dim=2)
    if prefix:   # the sink joins the free prefix
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask(q.size(2), prefix + 1, q.device),
                                           dropout_p=dropout_p)
    else:
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
    return y[:, :, 1:]


# ----------------------------------------------------------------------------- the sink route
_FLASH, _EFFICIENT, _CUDNN = (int(b) for b in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                                                SDPBackend.CUDNN_ATTENTION))
_aten = torch.ops.aten   # the kernels' overloads, looked up once (each lookup costs microseconds per call)
_CPU_FLASH = _aten._scaled_dot_product_flash_attention_for_cpu.default
_CPU_FLASH_BACKWARD = _aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def _prefix_bias(T, prefix, like):
    """Additive (T, T) mask of the free prefix (0 = visible, -inf = hidden) in like's dtype, rows padded to a
    multiple of 16 elements as the CUDA kernels require; None for plain causal attention."""
    if not prefix:
        return None
    bias = torch.full((T, -(-T // 16) * 16), float('-inf'), dtype=like.dtype, device=like.device)
    return bias[:, :T].masked_fill_(attention_mask(T, prefix, like.device), 0.0)


def _sdpa_backend(q, k, v, bias):
    return torch._fused_sdp_choice(q, k, v, bias, 0.0, bias is None)


def _expand(bias, q):
    return None if bias is None else bias.expand(q.size(0), q.size(1), -1, -1)


def _lse_forward(q, k, v, prefix):
    """(o, L): softmax attention output and each query's log-sum-exp, (B, H, T) fp32 contiguous."""
    T = q.size(2)
    bias = _prefix_bias(T, prefix, q)
    causal, backend = bias is None, _sdpa_backend(q, k, v, bias)
    if backend == _FLASH and q.device.type == 'cpu':
        o, lse = _CPU_FLASH(q, k, v, 0.0, causal, attn_mask=bias)
    elif backend == _FLASH:
        o, lse = _aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)[:2]
    elif backend == _EFFICIENT:   # L is padded to a multiple of 32 queries
        o, lse = _aten._scaled_dot_product_efficient_attention(q, k, v, _expand(bias, q), True, 0.0, causal)[:2]
        lse = lse[..., :T]
    elif backend == _CUDNN:       # L is (B, H, T, 1)
        o, lse = _aten._scaled_dot_product_cudnn_attention(q, k, v, _expand(bias, q), True, 0.0, causal)[:2]
        lse = lse.reshape(lse.shape[:3])
    else:
        return _math_forward(q, k, v, bias)
    return o, lse.contiguous()


def _lse_backward(do, q, k, v, out, lse, prefix):
    """Gradients of q, k, v of the kernel's attention, given its output `out`, L and the output gradient."""
    T = q.size(2)
    bias = _prefix_bias(T, prefix, q)
    causal, backend = bias is None, _sdpa_backend(q, k, v, bias)
    if backend == _FLASH and q.device.type == 'cpu':
        return _CPU_FLASH_BACKWARD(do, q, k, v, out, lse, 0.0, causal, attn_mask=bias)
    # dropout is 0, so the kernels never read their random state: placeholders of the forward's dtypes
    seed = torch.empty(2, dtype=torch.uint64, device=q.device)
    offset = torch.empty((), dtype=torch.uint64, device=q.device)
    if backend == _FLASH:
        return _aten._scaled_dot_product_flash_attention_backward(do, q, k, v, out, lse, None, None, T, T, 0.0,
                                                                  causal, seed, offset)
    if backend == _EFFICIENT:
        padded = lse.new_zeros(lse.shape[:2] + (-(-T // 32) * 32,))
        padded[..., :T] = lse
        return _aten._scaled_dot_product_efficient_attention_backward(
            do, q, k, v, _expand(bias, q), out, padded, seed, offset, 0.0, [True, True, True, False], causal)[:3]
    if backend == _CUDNN:
        return _aten._scaled_dot_product_cudnn_attention_backward(
            do, q, k, v, out, lse.unsqueeze(-1), seed, offset, _expand(bias, q), None, None, T, T, 0.0, causal)
    return _math_backward(do, q, k, v, out, lse, bias)


def _scores(q, k, bias):
    s = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.size(-1))
    if bias is None:
        return s.masked_fill(~attention_mask(q.size(2), 0, q.device), float('-inf'))
    return s + bias.float()


def _math_forward(q, k, v, bias):
    with torch.autocast(q.device.type, enabled=False):
        s = _scores(q, k, bias)
        lse = torch.logsumexp(s, dim=-1)
        return (torch.exp(s - lse[..., None]) @ v.float()).to(v.dtype), lse


def _math_backward(do, q, k, v, out, lse, bias):
    with torch.autocast(q.device.type, enabled=False):
        p = torch.exp(_scores(q, k, bias) - lse[..., None])
        do = do.float()
        ds = p * (do @ v.float().transpose(-2, -1) - (do * out.float()).sum(-1, keepdim=True)) / math.sqrt(q.size(-1))
        return ((ds @ k.float()).to(q.dtype), (ds.transpose(-2, -1) @ q.float()).to(k.dtype),
                (p.transpose(-2, -1) @ do).to(v.dtype))


def _bthd(t, last=None):
    """An empty tensor shaped like t (B, H, T, d) but laid out as (B, T, H, d), the layout that the model's
    next transpose-and-view needs (and the CPU kernels produce)."""
    B, H, T, d = t.shape
    return torch.empty(B, T, H, last or d, dtype=t.dtype, device=t.device).transpose(1, 2)


def _bthd_strides(shape):
    B, H, T, d = shape
    return (T * H * d, d, H * d, 1)


def _as_bthd(t):
    """t itself when laid out as _bthd promises (the fake implementations' layout), else a copy that is."""
    return t if t.stride() == _bthd_strides(t.shape) else _bthd(t).copy_(t)


def _sink_forward(q, k, v, c, u, prefix):
    """(y, L, w): the output, the real keys' log-sum-exp and their share w of each row."""
    o, lse = _lse_forward(q, k, v, prefix)
    w = _weight(lse, c)
    # y = w o + (1 - w) u, computed in fp32 and rounded once; in o's own memory when it has y's layout (the
    # kernels give it that layout: no fresh buffer, which on CPU would cost page faults at every call)
    y = o if o.stride() == _bthd_strides(o.shape) else _bthd(q, v.size(-1)).copy_(o)
    if u.dim():
        y.copy_(torch.addcmul((1 - w) * u, o, w))
    else:         # u = 0 (softmax-1)
        y.mul_(w)
    return y, lse, w


def _weight(lse, c):
    """w = sigmoid(L - c), (B, H, T, 1): the real keys' share of each row (softmax-1: c = 0, a 0-d tensor)."""
    return torch.sigmoid(lse if c.dim() == 0 else lse - c).unsqueeze(-1)


def _sink_backward(dy, q, k, v, c, u, y, lse, prefix, sink_grads, w=None):
    """(dq, dk, dv, dc, du) in the kernel's layouts; dc, du None unless sink_grads. w: the forward's, or None."""
    w = _weight(lse, c) if w is None else w
    do = (dy * w).to(dy.dtype)
    dq, dk, dv = _lse_backward(do, q, k, v, y, lse, prefix)
    if not sink_grads:
        return dq, dk, dv, None, None
    dyf, rest = dy.float(), 1 - w   # c is (B, H, T) and u (1, H, 1, d) here (attn_bias)
    dc = -(rest.squeeze(-1) * (dyf * (y.float() - u.float())).sum(-1))
    return dq, dk, dv, dc.to(c.dtype), (rest * dyf).sum((0, 2), keepdim=True).to(u.dtype)


# Two wrappers of the same two functions: a custom op, which torch.compile keeps as one node (its fake
# implementations give the output shapes and layouts without running it), and an autograd.Function for
# eager mode, which skips the custom op's dispatch (about 0.1 ms per call on CPU).
@torch.library.custom_op('softmax1::sink_attention', mutates_args=())
def sink_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: torch.Tensor, u: torch.Tensor,
                   prefix: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal softmax attention of q, k, v (B, H, T, d) plus a sink key of logit c (fp32, (B, H, T) or a 0-d
    tensor) and value u ((1, H, 1, d) or a 0-d tensor), the first `prefix` tokens free of the causal mask.
    Returns (y, L): y (B, H, T, d) and the log-sum-exp L (B, H, T) fp32 of each query's real scores."""
    return _sink_forward(q, k, v, c, u, prefix)[:2]


@sink_attention.register_fake
def _(q, k, v, c, u, prefix):
    return _bthd(q, v.size(-1)), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op('softmax1::sink_attention_backward', mutates_args=())
def sink_attention_backward(dy: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, c: torch.Tensor,
                            u: torch.Tensor, y: torch.Tensor, lse: torch.Tensor, prefix: int,
                            sink_grads: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                       torch.Tensor]:
    """(dq, dk, dv, dc, du) of sink_attention (dc, du zero unless sink_grads): the kernel's backward with
    out = y and grad = w dy, plus the sink's own terms."""
    dq, dk, dv, dc, du = _sink_backward(dy, q, k, v, c, u, y, lse, prefix, sink_grads)
    return (*(_as_bthd(g) for g in (dq, dk, dv)), torch.zeros_like(c) if dc is None else dc,
            torch.zeros_like(u) if du is None else du)   # the fake implementation's layouts, no None


@sink_attention_backward.register_fake
def _(dy, q, k, v, c, u, y, lse, prefix, sink_grads):
    return _bthd(q), _bthd(k), _bthd(v), torch.empty_like(c), torch.empty_like(u)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:5], *output)
    ctx.prefix = inputs[5]
    ctx.sink_grads = inputs[3].requires_grad or inputs[4].requires_grad


def _backward(ctx, dy, _dlse):
    q, k, v, c, u, y, lse = ctx.saved_tensors
    return *sink_attention_backward(dy, q, k, v, c, u, y, lse, ctx.prefix, ctx.sink_grads), None


sink_attention.register_autograd(_backward, setup_context=_setup_context)


class SinkAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, c, u, prefix):
        y, lse, w = _sink_forward(q, k, v, c, u, prefix)
        ctx.save_for_backward(q, k, v, c, u, y, lse, w)
        ctx.prefix = prefix
        return y

    @staticmethod
    def backward(ctx, dy):   # autograd takes the kernel's gradient layouts and None for a sink without grad
        *saved, w = ctx.saved_tensors
        sink_grads = ctx.needs_input_grad[3] or ctx.needs_input_grad[4]
        return *_sink_backward(dy, *saved, ctx.prefix, sink_grads, w), None
