"""GPT-2 / Llama-2 style decoder whose fields are the paper's toggles.

    from model import GPT, GPTConfig
    model = GPT(GPTConfig(attn='softmax1', norm='rmsnorm_single', bias=False))
    logits, loss = model(idx, targets)                     # training path (fused kernels)
    logits, loss, trace = model(idx, analysis=True)        # + per-layer hidden states, attention
    logits, cache = model.forward_cached(idx)              # decoding: new tokens after a KV cache (KVCache)
    logits, cache = model.forward_cached(next_idx, cache)

Attention (attention.py) is softmax or the paper's softmax-1, exp(x_i) / (1 + sum_j exp(x_j)), and, to
compare them with other published fixes on equal terms: clipped softmax and gated attention (Bondarenko
et al., 2023), sigmoid attention (Ramapuram et al., 2024), softpick (Zuhri et al., 2025), ReLU attention (Guo et
al., 2024), a learnt attention bias key/value per head (attn_bias, Sun et al., 2024) and a learnt sink token
prepended to every window (sink_token). The training path runs fused kernels wherever the formula allows (softmax-1 and attn_bias
included: the kernel's output and log-sum-exp give them exactly, see attention.py); attention.EAGER are eager.

The analysis path (analysis=True) recomputes attention eagerly and returns, per layer, the hidden
state after the block's residual additions, the attention probabilities and each head's value vectors over the
real tokens (for softmax-1 and attn_bias each row sums to < 1; the remainder went to the sink). With sink_token,
the sink position is left out of 'hidden', 'attn' and 'value' and reported in trace['sink'].

An intervention (intervene.py): CausalSelfAttention.hide_first_key = True hides the first token's key (the first
real token with sink_token) from every other query, through the eager probabilities, in either path.
"""
import importlib.util
import math
import os
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F

from attention import attention, attention_probs

# The values of GPTConfig's choice fields, listed once: train.py's validation and --help, the tests (which ask each
# value for its reference formula) and the docs' checks read them. A new variant is its name here and its code.
CHOICES = {
    'attn': ('softmax', 'softmax1', 'clipped', 'gated', 'sigmoid', 'softpick', 'relu'),   # attention.py (EAGER: eager)
    'norm': ('layernorm', 'rmsnorm', 'rmsnorm_single'),               # RMSNorm-M, RMSNorm-S (one scalar scale)
    'pos_emb': ('absolute', 'rotary', 'none'),                        # a learnt table, rotary, none
    'mlp': ('gelu', 'gelu_tanh', 'swiglu', 'relu'),                   # exact, GPT-2's tanh approximation, Llama-2's, ReLU
    'init': ('gpt2', 'torch'),                                        # GPT-2's N(0, 0.02) scheme, PyTorch's layer defaults
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
    norm_bias: bool | None = None  # LayerNorm's bias alone: None = as bias (Guo et al.'s models: True, with bias=False)
    attn: str = 'softmax'         # each of these five: one of CHOICES[its name]
    norm: str = 'layernorm'
    pos_emb: str = 'absolute'
    mlp: str = 'gelu'
    init: str = 'gpt2'            # the initial weights (GPT.__init__)
    causal_free_prefix: int = 0   # first k tokens attend to each other without causal masking
    clip_gamma: float = -0.025    # attn='clipped': clip((zeta - gamma) softmax + gamma, 0, 1), gamma <= 0
    clip_zeta: float = 1.0        #   and zeta >= 1 (Bondarenko et al.'s BERT values; OPT: gamma = -12/T)
    sigmoid_bias: float | None = None   # attn='sigmoid': sigmoid(s + b); None: b = -log(block_size)
    attn_bias: bool = False       # a learnt key and value per head and layer seen by every query
    sink_token: bool = False      # a learnt embedding prepended at position 0 of every window
    # fields a public model may need (GPT.from_hf); the defaults are this codebase's own models
    n_kv_head: int = 0            # key/value heads (grouped-query attention); 0 = n_head
    mlp_hidden: int = 0           # MLP hidden size; 0 = 4 * n_embd (gelu, relu), 8/3 * n_embd rounded up to 64 (swiglu)
    rope_base: float = 10000.0    # rotary base (theta)
    norm_eps: float = 1e-5        # epsilon of LayerNorm / RMSNorm
    tie_embeddings: bool = True   # LM head shares the token embedding matrix

    def __post_init__(self):
        for name, allowed in CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"GPTConfig.{name}={getattr(self, name)!r} is invalid; allowed: {', '.join(allowed)}")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type in ('int', int) and (not isinstance(value, int) or isinstance(value, bool)):
                raise ValueError(f"GPTConfig.{f.name} must be an int, got {value!r}")
            if f.type in ('float', float) and (not isinstance(value, (int, float)) or isinstance(value, bool)):
                raise ValueError(f"GPTConfig.{f.name} must be a number, got {value!r}")
            if f.type in ('bool', bool) and not isinstance(value, bool):
                raise ValueError(f"GPTConfig.{f.name} must be True or False, got {value!r}")
        if self.norm_bias is not None and not isinstance(self.norm_bias, bool):
            raise ValueError(f"GPTConfig.norm_bias must be None (as bias), True or False, got {self.norm_bias!r}")
        for name in ('n_layer', 'n_head', 'n_embd', 'block_size', 'vocab_size'):
            if getattr(self, name) < 1:
                raise ValueError(f"GPTConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig.n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        if self.n_kv_head < 0 or (self.n_kv_head and self.n_head % self.n_kv_head):
            raise ValueError(f"GPTConfig.n_kv_head={self.n_kv_head} must be 0 (= n_head) or divide n_head={self.n_head}")
        if self.mlp_hidden < 0:
            raise ValueError(f"GPTConfig.mlp_hidden must be >= 0 (0 = the default size), got {self.mlp_hidden}")
        if not self.rope_base > 0 or not 0 < self.norm_eps < 1:
            raise ValueError(f"GPTConfig.rope_base must be > 0 and norm_eps in (0, 1), got {self.rope_base}, {self.norm_eps}")
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

    @property
    def kv_heads(self):
        return self.n_kv_head or self.n_head

    @property
    def hidden_size(self):
        """MLP hidden size: mlp_hidden, else 4 C (GELU, ReLU) or 8/3 C rounded up to 64 (SwiGLU, the same parameters)."""
        if self.mlp_hidden:
            return self.mlp_hidden
        return -(-(8 * self.n_embd // 3) // 64) * 64 if self.mlp == 'swiglu' else 4 * self.n_embd


class RMSNorm(nn.Module):
    """RMSNorm with a per-channel scale ('rmsnorm', RMSNorm-M) or one scalar scale ('rmsnorm_single')."""

    def __init__(self, dim, single, eps=1e-5):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.ones(1 if single else dim))

    def forward(self, x):
        return F.rms_norm(x, (self.dim,), eps=self.eps) * self.weight


def make_norm(config):
    if config.norm == 'layernorm':
        return nn.LayerNorm(config.n_embd, eps=config.norm_eps,
                            bias=config.bias if config.norm_bias is None else config.norm_bias)
    return RMSNorm(config.n_embd, single=config.norm == 'rmsnorm_single', eps=config.norm_eps)


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
    """c_attn projects to q (n_head heads) and k, v (n_kv_head heads each, grouped-query attention when fewer);
    every group of n_head / n_kv_head query heads shares one key/value head."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.n_head, self.n_kv_head = config.n_head, config.kv_heads
        self.head_dim = config.n_embd // config.n_head
        kv_dim = self.n_kv_head * self.head_dim
        self.c_attn = nn.Linear(config.n_embd, config.n_embd + 2 * kv_dim, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        if config.attn == 'gated':    # one gate per head and token, from the block's normalised input
            self.c_gate = nn.Linear(config.n_embd, config.n_head, bias=True)
        if config.attn_bias:          # the key and value every query also sees, per head
            head = config.n_embd // config.n_head
            self.bias_k = nn.Parameter(torch.zeros(1, config.n_head, 1, head))
            self.bias_v = nn.Parameter(torch.zeros(1, config.n_head, 1, head))
        self.hide_first_key = False   # intervene.py: no later query sees the first token (eager path)

    def forward(self, x, rotary, trace, kv=None):
        """kv (decoding, GPT.forward_cached): this layer's [keys, values] of the earlier tokens (None, None when
        there are none), which x's tokens follow; replaced by the keys and values of all of them."""
        B, T, C = x.shape
        kv_dim = self.n_kv_head * self.head_dim
        q, k, v = self.c_attn(x).split((C, kv_dim, kv_dim), dim=2)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k, v = (t.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2) for t in (k, v))
        if kv is not None:    # keys are cached before rotary, so that a cache's positions can be reassigned
            if kv[0] is not None:
                k, v = torch.cat((kv[0], k), dim=2), torch.cat((kv[1], v), dim=2)
            kv[:] = k, v
        if rotary is not None:    # the T queries hold the last T of the S = k.size(2) positions
            S, (cos, sin) = k.size(2), rotary
            q, k = apply_rotary(q, cos[S - T:S], sin[S - T:S]), apply_rotary(k, cos, sin)
        if self.n_kv_head != self.n_head:   # key/value head j serves query heads j*g .. j*g + g-1
            k, v = (t.repeat_interleave(self.n_head // self.n_kv_head, dim=1) for t in (k, v))
        sink = (self.bias_k, self.bias_v) if self.config.attn_bias else None
        if trace is None and kv is None and not self.hide_first_key:
            y = attention(q, k, v, self.config, self.config.dropout if self.training else 0.0, sink)
        else:    # analysis, decoding and interventions: eager probabilities, (B, H, T, S)
            probs = attention_probs(q, k, self.config, sink, int(self.config.sink_token) if self.hide_first_key else None)
            if trace is not None:
                trace['attn'].append(probs)
                trace['value'].append(v)   # per query head (a key/value head repeated for its group)
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
        self.swiglu, self.relu = config.mlp == 'swiglu', config.mlp == 'relu'
        self.gelu_approximate = 'tanh' if config.mlp == 'gelu_tanh' else 'none'
        hidden = config.hidden_size
        if self.swiglu:   # Llama-2: c_proj(silu(c_gate(x)) * c_fc(x))
            self.c_gate = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.c_fc = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.c_proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        if self.swiglu:
            h = F.silu(self.c_gate(x)) * self.c_fc(x)
        elif self.relu:   # Guo et al. (2024)'s MLP: c_proj(ReLU(c_fc(x))), no gate
            h = F.relu(self.c_fc(x))
        else:
            h = F.gelu(self.c_fc(x), approximate=self.gelu_approximate)
        return self.dropout(self.c_proj(h))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = make_norm(config)
        self.mlp = MLP(config)

    def forward(self, x, rotary, trace=None, kv=None):
        x = x + self.attn(self.ln_1(x), rotary, trace, kv)
        x = x + self.mlp(self.ln_2(x))
        return x


class KVCache:
    """The keys and values of every token a model has seen, per layer, for decoding (GPT.forward_cached): layers[m] =
    [keys, values], each (B, n_kv_head, S, head_dim), keys before rotary. A token's position is its index in the
    cache (a model's learnt sink token is index 0): append-only decoding gives every token its place in the sequence,
    and after keep() the rest move up. With rotary the cached keys are rotated again at every call, so the kept
    tokens take their new positions; absolute position embeddings enter at the input, so a cached token keeps the
    position it was computed at; pos_emb='none' has no positions."""

    def __init__(self, n_layer):
        self.layers = [[None, None] for _ in range(n_layer)]

    def __len__(self):
        return 0 if self.layers[0][0] is None else self.layers[0][0].size(2)

    def keep(self, index):
        """Keep only the cached tokens at these indices (a list or 1-d tensor), in that order (eviction)."""
        index = torch.as_tensor(index, dtype=torch.long, device=self.layers[0][0].device)
        for kv in self.layers:
            kv[:] = kv[0].index_select(2, index), kv[1].index_select(2, index)


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
        if config.tie_embeddings:
            self.transformer.wte.weight = self.lm_head.weight    # weight tying
        if config.sink_token:
            self.sink = nn.Parameter(torch.zeros(1, 1, config.n_embd))
        if config.pos_emb == 'rotary':
            cos, sin = rotary_tables(config.n_embd // config.n_head, positions, config.rope_base)
            self.register_buffer('rope_cos', cos, persistent=False)
            self.register_buffer('rope_sin', sin, persistent=False)
        self.apply(self._init_torch if config.init == 'torch' else self._init_weights)
        std = 1.0 if config.init == 'torch' else 0.02   # the embeddings' (and so the sink's)
        for name, p in self.named_parameters():
            if name.endswith('c_proj.weight') and config.init == 'gpt2':   # residual projections / sqrt(2 n_layer)
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
            elif name.endswith('c_gate.bias'):    # gates start at GATE_INIT
                nn.init.constant_(p, math.log(GATE_INIT / (1 - GATE_INIT)))
            elif name == 'sink':                  # like a token embedding; attn_bias's key and value start at 0
                nn.init.normal_(p, mean=0.0, std=std)

    @staticmethod
    def _init_weights(module):
        """init='gpt2': GPT-2's scheme, every Linear weight and embedding N(0, 0.02), biases 0 (the residual
        projections are scaled after), norms weight 1 and bias 0 (as constructed)."""
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def _init_torch(self, module):
        """init='torch': PyTorch's layer defaults, which Guo et al. (2024) train with: a Linear's weight and bias
        U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (nn.Linear.reset_parameters), an embedding (token, position) N(0, 1), norms
        weight 1 and bias 0. With tie_embeddings the shared matrix is the token embedding's, N(0, 1): the LM head is
        left as the embedding made it (self.apply visits the embeddings first, the head last)."""
        if isinstance(module, nn.Linear) and not (module is self.lm_head and self.config.tie_embeddings):
            module.reset_parameters()
        elif isinstance(module, nn.Embedding):
            module.reset_parameters()   # N(0, 1)

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

    @classmethod
    def from_hf(cls, source, block_size=None):
        """GPT holding the weights of a GPT-2- or Llama-family causal LM, in eval mode. source: a transformers
        model, a Hugging Face name or folder (local files only) or a .gguf file (see load_hf). block_size: the
        longest sequence it will see (default: the model's maximum). GPT-2's Conv1D weights are transposed,
        q/k/v become one c_attn; the padded vocabulary rows are zero. Raises ValueError (one line) for other
        architectures and for options this model does not implement (rope scaling, attention biases, ...)."""
        hf = load_hf(source) if isinstance(source, (str, os.PathLike)) else source
        config = hf_config(hf.config, block_size)
        model = cls(config)
        base, L = hf.base_model, config.n_layer
        linear = lambda m: m.weight.t() if type(m).__name__ == 'Conv1D' else m.weight   # as (out, in)
        pairs = []    # (our tensor, the public one)
        if hf.config.model_type == 'gpt2':
            pairs += [(model.transformer.wpe.weight, base.wpe.weight[:config.block_size])]
            for ours, theirs in zip(model.transformer.h, base.h):
                pairs += [(ours.ln_1.weight, theirs.ln_1.weight), (ours.ln_1.bias, theirs.ln_1.bias),
                          (ours.attn.c_attn.weight, linear(theirs.attn.c_attn)), (ours.attn.c_attn.bias, theirs.attn.c_attn.bias),
                          (ours.attn.c_proj.weight, linear(theirs.attn.c_proj)), (ours.attn.c_proj.bias, theirs.attn.c_proj.bias),
                          (ours.ln_2.weight, theirs.ln_2.weight), (ours.ln_2.bias, theirs.ln_2.bias),
                          (ours.mlp.c_fc.weight, linear(theirs.mlp.c_fc)), (ours.mlp.c_fc.bias, theirs.mlp.c_fc.bias),
                          (ours.mlp.c_proj.weight, linear(theirs.mlp.c_proj)), (ours.mlp.c_proj.bias, theirs.mlp.c_proj.bias)]
            pairs += [(model.transformer.ln_f.weight, base.ln_f.weight), (model.transformer.ln_f.bias, base.ln_f.bias)]
        else:   # Llama
            for ours, theirs in zip(model.transformer.h, base.layers):
                a, m = theirs.self_attn, theirs.mlp
                pairs += [(ours.ln_1.weight, theirs.input_layernorm.weight),
                          (ours.attn.c_attn.weight, torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])),
                          (ours.attn.c_proj.weight, a.o_proj.weight), (ours.ln_2.weight, theirs.post_attention_layernorm.weight),
                          (ours.mlp.c_gate.weight, m.gate_proj.weight), (ours.mlp.c_fc.weight, m.up_proj.weight),
                          (ours.mlp.c_proj.weight, m.down_proj.weight)]
            pairs += [(model.transformer.ln_f.weight, base.norm.weight)]
        V = config.vocab_size
        pairs += [(model.transformer.wte.weight[:V], hf.get_input_embeddings().weight[:V])]
        if not config.tie_embeddings:
            pairs += [(model.lm_head.weight[:V], hf.get_output_embeddings().weight[:V])]
        with torch.no_grad():
            model.transformer.wte.weight[V:] = 0
            model.lm_head.weight[V:] = 0
            for ours, theirs in pairs:
                if ours.shape != theirs.shape:
                    raise ValueError(f"GPT.from_hf: a weight of shape {tuple(theirs.shape)} does not fit {tuple(ours.shape)}")
                ours.copy_(theirs.detach().float())
        return model.eval()

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
        'hidden' (per layer (B, T, C) after the block), 'attn' (per layer (B, H, T, T) probabilities) and
        'value' (per layer (B, H, T, d): each head's value vectors, W_v applied to the block's normalised input), all
        over the real tokens; with sink_token also 'sink': {'hidden': per layer (B, C) at the sink,
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
        trace = {'hidden': [], 'attn': [], 'value': []} if analysis else None
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
                trace['value'].append(trace['value'].pop()[:, :, 1:])
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

    def forward_cached(self, idx, cache=None):
        """Decoding with a KV cache: (logits (B, T, vocab) of the tokens idx (B, T), the cache) where idx follows the
        tokens already in `cache` (a KVCache; None starts one, with the sink token first when the model has one), which
        gets idx's keys and values appended. Token i of idx takes position len(cache) + i, its index in the cache (see
        KVCache). Attention is eager (attention_probs, every variant), so an uninterrupted cache gives forward()'s
        logits of the same positions up to rounding. Inference only: no dropout. ValueError (one line) when the cache
        would exceed the model's positions (block_size, plus the sink token), or when a causal_free_prefix model's
        first call holds fewer tokens than its prefix (they attend to each other)."""
        cfg = self.config
        cache = KVCache(cfg.n_layer) if cache is None else cache
        start, T = len(cache), idx.size(1)
        if start == 0 and T < cfg.causal_free_prefix:
            raise ValueError(f"the first {cfg.causal_free_prefix} tokens attend to each other (causal_free_prefix): "
                             f"the first forward_cached call needs them all, got {T}")
        x = self.transformer.wte(idx)
        if cfg.sink_token and start == 0:
            x = torch.cat((self.sink.expand(idx.size(0), 1, -1).to(x.dtype), x), dim=1)
        end = start + x.size(1)
        if end > cfg.block_size + cfg.sink_token:
            raise ValueError(f"a KV cache of {end - cfg.sink_token} tokens exceeds block_size {cfg.block_size}, the "
                             f"positions this model has")
        if cfg.pos_emb == 'absolute':
            x = x + self.transformer.wpe(torch.arange(start, end, device=idx.device))
        rotary = (self.rope_cos[:end], self.rope_sin[:end]) if cfg.pos_emb == 'rotary' else None
        for block, kv in zip(self.transformer.h, cache.layers):
            x = block(x, rotary, None, kv)
        if cfg.sink_token and start == 0:
            x = x[:, 1:]
        return self.lm_head(self.transformer.ln_f(x))[..., :cfg.vocab_size], cache


# ----------------------------------------------------------------------------- public models
def load_hf(spec):
    """A transformers causal LM in fp32 with eager attention, in eval mode, from a Hugging Face name or folder
    (local files only: the Hugging Face cache or a folder) or a .gguf file (transformers dequantises it; that
    needs the gguf and accelerate packages). Raises ValueError with a one-line message."""
    spec = str(spec)
    try:
        import transformers
    except ImportError:
        raise ValueError(f"{spec}: Hugging Face models need transformers: pip install transformers") from None
    where, kw = spec, dict(attn_implementation='eager', dtype=torch.float32, local_files_only=True)
    if spec.endswith('.gguf'):
        if not os.path.isfile(spec):
            raise ValueError(f"GGUF file {spec} not found")
        missing = [m for m in ('gguf', 'accelerate') if importlib.util.find_spec(m) is None]
        if missing:
            raise ValueError(f"{spec}: transformers reads GGUF files only with the {' and '.join(missing)} "
                             f"package{'s' if len(missing) > 1 else ''}: pip install {' '.join(missing)}")
        where, kw['gguf_file'] = os.path.dirname(os.path.abspath(spec)), os.path.basename(spec)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(where, **kw)
    except (OSError, ValueError) as e:
        if spec.endswith('.gguf'):
            raise ValueError(f"{spec}: transformers cannot load this GGUF file ({type(e).__name__}: "
                             f"{str(e).strip().splitlines()[0] if str(e).strip() else ''})") from None
        raise ValueError(f"{spec}: no such checkpoint, and no Hugging Face weights for it on this machine (they must "
                         f"be in the Hugging Face cache or a local folder; download once with network: python -c "
                         f"\"import transformers; transformers.AutoModelForCausalLM.from_pretrained('{spec}')\") "
                         f"[{type(e).__name__}]") from None
    if 'gguf_file' in kw:   # a GGUF-loaded model counts as quantised (no save_pretrained, .float(), .double()):
        config = model.config                       # its dequantised weights go into a plain model of the same config
        if hasattr(config, 'quantization_config'):
            del config.quantization_config
        plain = type(model)(config)
        plain.load_state_dict(model.state_dict())
        plain.set_attn_implementation('eager')
        model = plain
    return model.eval()


GPT2_ACTIVATIONS = {'gelu_new': 'gelu_tanh', 'gelu_pytorch_tanh': 'gelu_tanh', 'gelu': 'gelu'}


def hf_config(c, block_size=None):
    """GPTConfig of a transformers GPT-2 or Llama config (ValueError for what GPT cannot represent)."""
    def unsupported(what):
        return ValueError(f"GPT.from_hf: {what} is not implemented here; measure this model through transformers "
                          f"(analyze.py / eval_quant.py --init_from)")
    if c.model_type == 'gpt2':
        if c.activation_function not in GPT2_ACTIVATIONS:
            raise unsupported(f"activation {c.activation_function!r}")
        if getattr(c, 'scale_attn_by_inverse_layer_idx', False) or not getattr(c, 'scale_attn_weights', True):
            raise unsupported("GPT-2 attention scaling other than 1/sqrt(head size)")
        args = dict(n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd, bias=True, norm='layernorm',
                    pos_emb='absolute', mlp=GPT2_ACTIVATIONS[c.activation_function], norm_eps=c.layer_norm_epsilon,
                    mlp_hidden=c.n_inner or 0)
        max_len = c.n_positions
    elif c.model_type == 'llama':
        rope = dict(getattr(c, 'rope_parameters', None) or getattr(c, 'rope_scaling', None) or {})
        theta = rope.get('rope_theta', getattr(c, 'rope_theta', 10000.0))
        if rope.get('rope_type', rope.get('type', 'default')) != 'default':
            raise unsupported(f"rope scaling {rope.get('rope_type', rope.get('type'))!r}")
        if getattr(c, 'attention_bias', False) or getattr(c, 'mlp_bias', False):
            raise unsupported("a Llama model with attention or MLP biases")
        if c.hidden_act != 'silu':
            raise unsupported(f"activation {c.hidden_act!r}")
        head_dim = getattr(c, 'head_dim', None) or c.hidden_size // c.num_attention_heads
        if head_dim * c.num_attention_heads != c.hidden_size or getattr(c, 'partial_rotary_factor', 1.0) != 1.0:
            raise unsupported("a head size other than hidden_size / num_attention_heads, or partial rotary")
        args = dict(n_layer=c.num_hidden_layers, n_head=c.num_attention_heads, n_embd=c.hidden_size, bias=False,
                    norm='rmsnorm', pos_emb='rotary', mlp='swiglu', norm_eps=float(c.rms_norm_eps),
                    mlp_hidden=c.intermediate_size, rope_base=float(theta),
                    n_kv_head=0 if c.num_key_value_heads == c.num_attention_heads else c.num_key_value_heads)
        max_len = c.max_position_embeddings
    else:
        raise ValueError(f"GPT.from_hf reads GPT-2 and Llama models, not model_type {c.model_type!r}; "
                         f"measure it through transformers (analyze.py / eval_quant.py --init_from)")
    if block_size is not None and not 1 <= block_size <= max_len:
        raise ValueError(f"block_size {block_size} is outside [1, {max_len}], the positions this model supports")
    return GPTConfig(**args, vocab_size=c.vocab_size, block_size=block_size or max_len, dropout=0.0,
                     tie_embeddings=bool(getattr(c, 'tie_word_embeddings', True)))
