"""GPT-2 / Llama-2 style decoder whose fields are the paper's toggles.

    from model import GPT, GPTConfig
    model = GPT(GPTConfig(attn='softmax1', norm='rmsnorm_single', bias=False))
    logits, loss = model(idx, targets)                     # training path (fused kernels)
    logits, loss, trace = model(idx, analysis=True)        # + per-layer hidden states, attention

Attention (attention.py) is softmax or the paper's softmax-1, exp(x_i) / (1 + sum_j exp(x_j)), and, to
compare them with other published fixes on equal terms: clipped softmax and gated attention (Bondarenko
et al., 2023), sigmoid attention (Ramapuram et al., 2024), a learnt attention bias key/value per head
(attn_bias, Sun et al., 2024) and a learnt sink token prepended to every window (sink_token). The
training path runs fused kernels wherever the formula allows (softmax-1 and attn_bias included: the
kernel's output and log-sum-exp give them exactly, see attention.py); clipped and sigmoid are eager.

The analysis path (analysis=True) recomputes attention eagerly and returns, per layer, the hidden
state after the block's residual additions and the attention probabilities over the real tokens (for
softmax-1 and attn_bias each row sums to < 1; the remainder went to the sink). With sink_token, the
sink position is left out of 'hidden' and 'attn' and reported in trace['sink'].
"""
import math
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F

from attention import attention, attention_probs

CHOICES = {
    'attn': ('softmax', 'softmax1', 'clipped', 'gated', 'sigmoid'),
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
    attn: str = 'softmax'         # 'softmax' | 'softmax1' | 'clipped' | 'gated' | 'sigmoid' (attention.py)
    norm: str = 'layernorm'       # 'layernorm' | 'rmsnorm' (RMSNorm-M) | 'rmsnorm_single' (RMSNorm-S)
    pos_emb: str = 'absolute'     # 'absolute' | 'rotary' | 'none'
    mlp: str = 'gelu'             # 'gelu' (GPT-2) | 'swiglu' (Llama-2)
    causal_free_prefix: int = 0   # first k tokens attend to each other without causal masking
    clip_gamma: float = -0.025    # attn='clipped': clip((zeta - gamma) softmax + gamma, 0, 1), gamma <= 0
    clip_zeta: float = 1.0        #   and zeta >= 1 (Bondarenko et al.'s BERT values; OPT: gamma = -12/T)
    sigmoid_bias: float | None = None   # attn='sigmoid': sigmoid(s + b); None: b = -log(block_size)
    attn_bias: bool = False       # a learnt key and value per head and layer seen by every query
    sink_token: bool = False      # a learnt embedding prepended at position 0 of every window

    def __post_init__(self):
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"GPTConfig.{name}={getattr(self, name)!r} is invalid; allowed: {', '.join(allowed)}")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ('int', int) and (not isinstance(value, int) or isinstance(value, bool)):
                raise ValueError(f"GPTConfig.{f.name} must be an int, got {value!r}")
            if f.type in ('bool', bool) and not isinstance(value, bool):
                raise ValueError(f"GPTConfig.{f.name} must be True or False, got {value!r}")
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
        for name in ('clip_gamma', 'clip_zeta', 'sigmoid_bias'):
            value = getattr(self, name)
            if not (value is None and name == 'sigmoid_bias') and (
                    not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)):
                raise ValueError(f"GPTConfig.{name} must be a finite number, got {value!r}")
        if self.clip_gamma > 0 or self.clip_zeta < 1:
            raise ValueError(f"GPTConfig.clip_gamma must be <= 0 and clip_zeta >= 1 (clipped softmax), got "
                             f"{self.clip_gamma} and {self.clip_zeta}")
        if self.attn_bias and self.attn not in ('softmax', 'gated'):
            raise ValueError(f"GPTConfig.attn_bias adds a key to softmax attention; attn={self.attn!r} is not softmax "
                             f"(softmax-1 is already attn_bias with a fixed zero key and value): use attn='softmax'")
        if self.sink_token and self.causal_free_prefix:
            raise ValueError("GPTConfig.sink_token and causal_free_prefix cannot be combined; set one of them")

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


GATE_INIT = 0.25   # attn='gated': initial gate value (Bondarenko et al.'s attn_gate_init for OPT)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        if config.attn == 'gated':    # one gate per head and token, from the block's normalised input
            self.c_gate = nn.Linear(config.n_embd, config.n_head, bias=True)
        if config.attn_bias:          # the key and value every query also sees, per head
            head = config.n_embd // config.n_head
            self.bias_k = nn.Parameter(torch.zeros(1, config.n_head, 1, head))
            self.bias_v = nn.Parameter(torch.zeros(1, config.n_head, 1, head))

    def forward(self, x, rotary, trace):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if rotary is not None:
            q, k = apply_rotary(q, *rotary), apply_rotary(k, *rotary)
        sink = (self.bias_k, self.bias_v) if self.config.attn_bias else None
        if trace is None:
            y = attention(q, k, v, self.config, self.config.dropout if self.training else 0.0, sink)
        else:
            probs = attention_probs(q, k, self.config, sink)
            trace['attn'].append(probs)
            y = probs @ v.float()
            if sink is not None:   # the rest of each row's mass went to the bias value
                y = y + (1 - probs.sum(-1, keepdim=True)) * self.bias_v.float()
            y = y.to(v.dtype)
        if self.config.attn == 'gated':
            y = y * torch.sigmoid(self.c_gate(x)).transpose(1, 2).unsqueeze(-1).to(y.dtype)
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
        positions = config.block_size + config.sink_token   # the sink token takes position 0
        if config.pos_emb == 'absolute':
            modules['wpe'] = nn.Embedding(positions, config.n_embd)
        self.transformer = nn.ModuleDict(modules)
        self.lm_head = nn.Linear(config.n_embd, config.padded_vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight    # weight tying
        if config.sink_token:
            self.sink = nn.Parameter(torch.zeros(1, 1, config.n_embd))
        if config.pos_emb == 'rotary':
            cos, sin = rotary_tables(config.n_embd // config.n_head, positions)
            self.register_buffer('rope_cos', cos, persistent=False)
            self.register_buffer('rope_sin', sin, persistent=False)
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith('c_proj.weight'):    # GPT-2: residual projections scaled by 1/sqrt(2 n_layer)
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
            elif name.endswith('c_gate.bias'):    # gates start at GATE_INIT
                nn.init.constant_(p, math.log(GATE_INIT / (1 - GATE_INIT)))
            elif name == 'sink':                  # like a token embedding; attn_bias's key and value start at 0
                nn.init.normal_(p, mean=0.0, std=0.02)

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
        'hidden' (per layer (B, T, C) after the block) and 'attn' (per layer (B, H, T, T) probabilities),
        both over the real tokens; with sink_token also 'sink': {'hidden': per layer (B, C) at the sink,
        'attn': per layer (B, H, T) the probability each real query puts on the sink}."""
        B, T = idx.shape
        cfg = self.config
        if T > cfg.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {cfg.block_size}")
        x = self.transformer.wte(idx)
        if cfg.sink_token:
            x = torch.cat((self.sink.expand(B, 1, -1).to(x.dtype), x), dim=1)
        if cfg.pos_emb == 'absolute':
            x = x + self.transformer.wpe(torch.arange(x.size(1), device=idx.device))
        x = self.transformer.drop(x)
        rotary = (self.rope_cos, self.rope_sin) if cfg.pos_emb == 'rotary' else None
        trace = {'hidden': [], 'attn': []} if analysis else None
        if analysis and cfg.sink_token:
            trace['sink'] = {'hidden': [], 'attn': []}
        for block in self.transformer.h:
            x = block(x, rotary, trace)
            if analysis and cfg.sink_token:
                probs = trace['attn'].pop()
                trace['attn'].append(probs[:, :, 1:, 1:])
                trace['sink']['attn'].append(probs[:, :, 1:, 0])
                trace['sink']['hidden'].append(x[:, 0])
                trace['hidden'].append(x[:, 1:])
            elif analysis:
                trace['hidden'].append(x)
        if cfg.sink_token:
            x = x[:, 1:]
        logits = self.lm_head(self.transformer.ln_f(x))[..., :cfg.vocab_size]
        loss = None
        if targets is not None:
            if cfg.causal_free_prefix > 1:   # positions < k-1 can see their target: exclude them
                targets = targets.clone()
                targets[:, :cfg.causal_free_prefix - 1] = -1
            loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        return (logits, loss, trace) if analysis else (logits, loss)
