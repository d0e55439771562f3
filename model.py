"""GPT-2 / Llama-2 style decoder whose fields are the paper's toggles.

    from model import GPT, GPTConfig
    model = GPT(GPTConfig(attn='softmax1', norm='rmsnorm_single', bias=False))
    logits, loss = model(idx, targets)                     # training path (fused kernels)
    logits, loss, trace = model(idx, analysis=True)        # + per-layer hidden states, attention

Attention is softmax or softmax-1, exp(x_i) / (1 + sum_j exp(x_j)). With L = logsumexp_j x_j,
softmax-1 is softmax times sigmoid(L): the training path takes the output o and L from the fused
attention kernel SDPA would run (CPU flash; CUDA flash, memory-efficient or cuDNN) and returns
y = o * sigmoid(L), with no extra key and no T x T matrix (`softmax1_attention`, a custom op that
torch.compile keeps whole). Its backward is that kernel's backward called with the output y and the
output gradient sigmoid(L) * dy, which is exact (see `softmax1_attention_backward`). With dropout the
kernels' random state would have to cross the op, so dropout > 0 takes the route of an extra key:
a zero key/value and a dummy query prepended inside SDPA (`softmax1_extra_key`).

The analysis path (analysis=True) recomputes attention eagerly and returns, per layer, the hidden
state after the block's residual additions and the attention probabilities (for softmax-1 each row
sums to < 1; the remainder is the mass that went nowhere).
"""
import math
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

CHOICES = {
    'attn': ('softmax', 'softmax1'),
    'norm': ('layernorm', 'rmsnorm', 'rmsnorm_single'),
    'pos_emb': ('absolute', 'rotary', 'none'),
    'mlp': ('gelu', 'swiglu'),
}


@dataclass
class GPTConfig:
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    block_size: int = 256
    vocab_size: int = 50257       # real vocabulary; the embedding is padded to a multiple of 64
    dropout: float = 0.0
    bias: bool = True             # biases in every Linear layer and in LayerNorm
    attn: str = 'softmax'         # 'softmax' | 'softmax1'
    norm: str = 'layernorm'       # 'layernorm' | 'rmsnorm' (RMSNorm-M) | 'rmsnorm_single' (RMSNorm-S)
    pos_emb: str = 'absolute'     # 'absolute' | 'rotary' | 'none'
    mlp: str = 'gelu'             # 'gelu' (GPT-2) | 'swiglu' (Llama-2)
    causal_free_prefix: int = 0   # first k tokens attend to each other without causal masking

    def __post_init__(self):
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"GPTConfig.{name}={getattr(self, name)!r} is invalid; allowed: {', '.join(allowed)}")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ('int', int) and (not isinstance(value, int) or isinstance(value, bool)):
                raise ValueError(f"GPTConfig.{f.name} must be an int, got {value!r}")
        for name in ('n_layer', 'n_head', 'n_embd', 'block_size', 'vocab_size'):
            if getattr(self, name) < 1:
                raise ValueError(f"GPTConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig.n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        if self.pos_emb == 'rotary' and (self.n_embd // self.n_head) % 2:
            raise ValueError("GPTConfig.pos_emb='rotary' needs an even head size (n_embd / n_head)")
        if not 0 <= self.causal_free_prefix <= self.block_size:
            raise ValueError(f"GPTConfig.causal_free_prefix must be in [0, block_size], got {self.causal_free_prefix}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"GPTConfig.dropout must be in [0, 1), got {self.dropout}")

    @property
    def padded_vocab_size(self):
        return -(-self.vocab_size // 64) * 64


class RMSNorm(nn.Module):
    """RMSNorm with a per-channel scale ('rmsnorm', RMSNorm-M) or one scalar scale ('rmsnorm_single')."""

    def __init__(self, dim, single):
        super().__init__()
        self.dim = dim
        self.weight = nn.Parameter(torch.ones(1 if single else dim))

    def forward(self, x):
        return F.rms_norm(x, (self.dim,), eps=1e-5) * self.weight


def make_norm(config):
    if config.norm == 'layernorm':
        return nn.LayerNorm(config.n_embd, bias=config.bias)
    return RMSNorm(config.n_embd, single=config.norm == 'rmsnorm_single')


def rotary_tables(head_dim, block_size, base=10000.0):
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(block_size, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rotary(x, cos, sin):
    """Rotate channel pairs (first half, second half) of x (B, H, T, d) by position-dependent angles."""
    T = x.size(-2)
    cos, sin = cos[:T].to(x.dtype), sin[:T].to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def attention_mask(T, prefix, device):
    """Boolean (T, T) mask, True = may attend: causal, except the first `prefix` tokens see each other."""
    i = torch.arange(T, device=device)
    mask = i[None, :] <= i[:, None]
    if prefix:
        mask[:prefix, :prefix] = True
    return mask


def attention(q, k, v, config, dropout_p=0.0):
    """Fused attention for the training path: softmax or exact softmax-1, causal (+ free prefix)."""
    prefix = config.causal_free_prefix
    if config.attn == 'softmax1':
        if dropout_p == 0.0 and q.device.type in ('cpu', 'cuda'):
            if torch.compiler.is_compiling():   # the custom op: one opaque node in the compiled graph
                return softmax1_attention(q, k, v, prefix)[0]
            return Softmax1Attention.apply(q, k, v, prefix)   # eager: the same computation, less dispatch
        return softmax1_extra_key(q, k, v, prefix, dropout_p)
    if prefix:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask(q.size(2), prefix, q.device),
                                              dropout_p=dropout_p)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)


def softmax1_extra_key(q, k, v, prefix=0, dropout_p=0.0):
    """Softmax-1 as softmax over one more key whose logit is 0 and whose value is 0: a zero key/value and a
    dummy query are prepended, so the square (T+1) x (T+1) causal mask lets real query i see that key plus
    real keys 0..i; the dummy query's output row is dropped. Exact, one position more than softmax."""
    pad = q.new_zeros(q.shape[:2] + (1, q.size(-1)))
    q, k, v = (torch.cat((pad, t), dim=2) for t in (q, k, v))
    if prefix:   # the extra key joins the free prefix
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask(q.size(2), prefix + 1, q.device),
                                           dropout_p=dropout_p)
    else:
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
    return y[:, :, 1:]


# ----------------------------------------------------------------------------- softmax-1 from the log-sum-exp
# The fused kernels return, besides o = softmax(s) v, each query's L = logsumexp_j s_j; softmax-1 is then
# y = o * sigmoid(L). Backward, with S = sigmoid(L): dL/ds_ij = P_ij, so
#   ds_ij = P_ij (S dy.v_j - S (o.dy)) + P_ij (o.dy) S (1 - S) = P_ij (S dy.v_j - S^2 (o.dy)),   dV = P^T (S dy).
# A kernel's backward called with out = y and grad = S dy computes P from L, its row term rowsum(y * S dy)
# = S^2 (o.dy), ds = P (S dy.v_j - that) and dV = P^T (S dy): exactly the above. The kernel is the one SDPA
# would choose for the same call (torch._fused_sdp_choice, so sdpa_kernel() contexts apply); forward and
# backward may even use different ones, since L is kept in one layout and handed to each in its own.
# When no fused kernel applies, an eager fp32 version of the same formulas runs (_math_forward/_backward).
_FLASH, _EFFICIENT, _CUDNN = (int(b) for b in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                                                SDPBackend.CUDNN_ATTENTION))


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
    aten = torch.ops.aten
    if backend == _FLASH and q.device.type == 'cpu':
        o, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=bias)
    elif backend == _FLASH:
        o, lse = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)[:2]
    elif backend == _EFFICIENT:   # L is padded to a multiple of 32 queries
        o, lse = aten._scaled_dot_product_efficient_attention(q, k, v, _expand(bias, q), True, 0.0, causal)[:2]
        lse = lse[..., :T]
    elif backend == _CUDNN:       # L is (B, H, T, 1)
        o, lse = aten._scaled_dot_product_cudnn_attention(q, k, v, _expand(bias, q), True, 0.0, causal)[:2]
        lse = lse.reshape(lse.shape[:3])
    else:
        return _math_forward(q, k, v, bias)
    return o, lse.contiguous()


def _lse_backward(do, q, k, v, out, lse, prefix):
    """Gradients of q, k, v of the kernel's attention, given its output `out`, L and the output gradient."""
    T = q.size(2)
    bias = _prefix_bias(T, prefix, q)
    causal, backend = bias is None, _sdpa_backend(q, k, v, bias)
    aten = torch.ops.aten
    if backend == _FLASH and q.device.type == 'cpu':
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(do, q, k, v, out, lse, 0.0, causal,
                                                                         attn_mask=bias)
    # dropout is 0, so the kernels never read their random state: placeholders of the forward's dtypes
    seed = torch.empty(2, dtype=torch.uint64, device=q.device)
    offset = torch.empty((), dtype=torch.uint64, device=q.device)
    if backend == _FLASH:
        return aten._scaled_dot_product_flash_attention_backward(do, q, k, v, out, lse, None, None, T, T, 0.0,
                                                                 causal, seed, offset)
    if backend == _EFFICIENT:
        padded = lse.new_zeros(lse.shape[:2] + (-(-T // 32) * 32,))
        padded[..., :T] = lse
        return aten._scaled_dot_product_efficient_attention_backward(
            do, q, k, v, _expand(bias, q), out, padded, seed, offset, 0.0, [True, True, True, False], causal)[:3]
    if backend == _CUDNN:
        return aten._scaled_dot_product_cudnn_attention_backward(
            do, q, k, v, out, lse.unsqueeze(-1), seed, offset, _expand(bias, q), None, None, T, T, 0.0, causal)
    return _math_backward(do, q, k, v, out, lse, bias)


def _scores(q, k, bias):
    s = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.size(-1))
    if bias is None:
        return s.masked_fill(~attention_mask(q.size(2), 0, q.device), float('-inf'))
    return s + bias.float()


def _math_forward(q, k, v, bias):
    s = _scores(q, k, bias)
    lse = torch.logsumexp(s, dim=-1)
    return (torch.exp(s - lse[..., None]) @ v.float()).to(v.dtype), lse


def _math_backward(do, q, k, v, out, lse, bias):
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


def _as_bthd(t):
    """t itself when laid out as _bthd promises (the fake implementations' layout), else a copy that is."""
    B, H, T, d = t.shape
    return t if t.stride() == (T * H * d, d, H * d, 1) else _bthd(t).copy_(t)


def _softmax1_forward(q, k, v, prefix):
    o, lse = _lse_forward(q, k, v, prefix)
    y = _bthd(q, v.size(-1))
    torch.mul(o, torch.sigmoid(lse).unsqueeze(-1), out=y)
    return y, lse


def _softmax1_backward(dy, q, k, v, y, lse, prefix):
    do = torch.empty_like(y)
    torch.mul(dy, torch.sigmoid(lse).unsqueeze(-1), out=do)
    return tuple(_as_bthd(g) for g in _lse_backward(do, q, k, v, y, lse, prefix))


# Two wrappers of the same two functions: a custom op, which torch.compile keeps as one node (its fake
# implementations give the output shapes and layouts without running it), and an autograd.Function for
# eager mode, which skips the custom op's dispatch (about 0.1 ms per call on CPU).
@torch.library.custom_op('softmax1::attention', mutates_args=())
def softmax1_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal softmax-1 attention of q, k, v (B, H, T, d) with the first `prefix` tokens free of the causal
    mask. Returns (y, L): y (B, H, T, d) and the log-sum-exp L (B, H, T) fp32 of each query's scores."""
    return _softmax1_forward(q, k, v, prefix)


@softmax1_attention.register_fake
def _(q, k, v, prefix):
    return _bthd(q, v.size(-1)), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op('softmax1::attention_backward', mutates_args=())
def softmax1_attention_backward(dy: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, y: torch.Tensor,
                                lse: torch.Tensor, prefix: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of softmax1_attention: the kernel's backward with out = y and grad = sigmoid(L) * dy."""
    return _softmax1_backward(dy, q, k, v, y, lse, prefix)


@softmax1_attention_backward.register_fake
def _(dy, q, k, v, y, lse, prefix):
    return _bthd(q), _bthd(k), _bthd(v)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:3], *output)
    ctx.prefix = inputs[3]


def _backward(ctx, dy, _dlse):
    return *softmax1_attention_backward(dy, *ctx.saved_tensors, ctx.prefix), None


softmax1_attention.register_autograd(_backward, setup_context=_setup_context)


class Softmax1Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, prefix):
        y, lse = _softmax1_forward(q, k, v, prefix)
        ctx.save_for_backward(q, k, v, y, lse)
        ctx.prefix = prefix
        return y

    @staticmethod
    def backward(ctx, dy):
        return *_softmax1_backward(dy, *ctx.saved_tensors, ctx.prefix), None


def attention_probs(q, k, config):
    """Eager attention probabilities (B, H, T, T) for the analysis path; softmax-1 rows sum to < 1."""
    T = q.size(2)
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.size(-1))
    scores = scores.float().masked_fill(~attention_mask(T, config.causal_free_prefix, q.device), float('-inf'))
    if config.attn == 'softmax':
        return torch.softmax(scores, dim=-1)
    # exp(s_i) / (1 + sum_j exp(s_j)), stabilised by the row max m (clamped at 0 so the "1" cannot overflow)
    m = scores.amax(dim=-1, keepdim=True).clamp_min(0)
    e = torch.exp(scores - m)
    return e / (torch.exp(-m) + e.sum(dim=-1, keepdim=True))


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x, rotary, trace):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if rotary is not None:
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        if trace is None:
            y = attention(q, k, v, self.config, self.config.dropout if self.training else 0.0)
        else:
            probs = attention_probs(q, k, self.config)
            trace['attn'].append(probs)
            y = (probs @ v.float()).to(v.dtype)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.swiglu = config.mlp == 'swiglu'
        if self.swiglu:   # Llama-2: hidden = 8/3 * n_embd rounded up to 64, same parameters as 4 * n_embd GELU
            hidden = -(-(8 * config.n_embd // 3) // 64) * 64
            self.c_gate = nn.Linear(config.n_embd, hidden, bias=config.bias)
        else:
            hidden = 4 * config.n_embd
        self.c_fc = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        h = F.silu(self.c_gate(x)) * self.c_fc(x) if self.swiglu else F.gelu(self.c_fc(x))
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = make_norm(config)
        self.mlp = MLP(config)

    def forward(self, x, rotary, trace=None):
        x = x + self.attn(self.ln_1(x), rotary, trace)
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        modules = dict(
            wte=nn.Embedding(config.padded_vocab_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=make_norm(config),
        )
        if config.pos_emb == 'absolute':
            modules['wpe'] = nn.Embedding(config.block_size, config.n_embd)
        self.transformer = nn.ModuleDict(modules)
        self.lm_head = nn.Linear(config.n_embd, config.padded_vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight    # weight tying
        if config.pos_emb == 'rotary':
            cos, sin = rotary_tables(config.n_embd // config.n_head, config.block_size)
            self.register_buffer('rope_cos', cos, persistent=False)
            self.register_buffer('rope_sin', sin, persistent=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():   # GPT-2: residual projections scaled by 1/sqrt(2 n_layer)
            if name.endswith('c_proj.weight'):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @classmethod
    def from_checkpoint(cls, path, device='cpu'):
        """(model in eval mode, checkpoint dict without the weights) from a train.py checkpoint.
        Raises ValueError with a one-line message when the file is missing or not a checkpoint."""
        try:
            ckpt = torch.load(path, map_location='cpu', weights_only=False)
            model = cls(GPTConfig(**ckpt['model_args']))
            model.load_state_dict(ckpt.pop('model'))
        except FileNotFoundError:
            raise ValueError(f"checkpoint {path} not found") from None
        except Exception as e:   # unreadable file, missing keys, shapes from another config
            raise ValueError(f"{path} is not a readable train.py checkpoint ({type(e).__name__}: {e})") from None
        return model.to(device).eval(), ckpt

    def num_params(self, exclude_embeddings=False):
        """Number of parameters (tied weights once). exclude_embeddings drops token/position tables."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            n -= self.transformer.wte.weight.numel()
            if 'wpe' in self.transformer:
                n -= self.transformer.wpe.weight.numel()
        return n

    def flops_per_token(self, seq_len=None):
        """Training FLOPs per token (forward + backward): 6 N + 12 L T C (PaLM appendix B convention),
        N counting every matmul weight including the tied LM head, excluding the position table."""
        cfg, T = self.config, seq_len or self.config.block_size
        n = self.num_params() - (self.transformer.wpe.weight.numel() if 'wpe' in self.transformer else 0)
        return 6 * n + 12 * cfg.n_layer * cfg.n_embd * T

    def forward(self, idx, targets=None, analysis=False):
        """idx, targets: (B, T) int64; targets == -1 are ignored. Returns logits over the real vocabulary,
        the mean cross-entropy (None without targets) and, with analysis=True, a trace dict with
        'hidden' (per layer (B, T, C) after the block) and 'attn' (per layer (B, H, T, T) probabilities)."""
        B, T = idx.shape
        cfg = self.config
        if T > cfg.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {cfg.block_size}")
        x = self.transformer.wte(idx)
        if cfg.pos_emb == 'absolute':
            x = x + self.transformer.wpe(torch.arange(T, device=idx.device))
        x = self.transformer.drop(x)
        rotary = (self.rope_cos, self.rope_sin) if cfg.pos_emb == 'rotary' else None
        trace = {'hidden': [], 'attn': []} if analysis else None
        for block in self.transformer.h:
            x = block(x, rotary, trace)
            if analysis:
                trace['hidden'].append(x)
        logits = self.lm_head(self.transformer.ln_f(x))[..., :cfg.vocab_size]
        loss = None
        if targets is not None:
            if cfg.causal_free_prefix > 1:   # positions < k-1 can see their target: exclude them
                targets = targets.clone()
                targets[:, :cfg.causal_free_prefix - 1] = -1
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        return (logits, loss, trace) if analysis else (logits, loss)
