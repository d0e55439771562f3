"""OrthoAdam (Algorithm 1 of the paper): Adam whose moments live in a fixed random orthogonal basis.

For every parameter p with gradient g and a fixed orthogonal Q unique to p:
    ḡ = Q g;  m̄ = β1 m̄ + (1-β1) ḡ;  v̄ = β2 v̄ + (1-β2) ḡ²;  m̂ = m̄/(1-β1^t);  v̂ = v̄/(1-β2^t)
    s̄ = m̂ / (sqrt(v̂) + eps);  s = Qᵀ s̄;  p ← p·(1 - lr·weight_decay) - lr·s
Weight decay is decoupled and applied in the parameter basis, exactly as torch.optim.AdamW does.
Q is never materialised: it is the Kronecker product of one small factor per rotated axis
(for a matrix G: Ḡ = Q0 G Q1ᵀ), applied by `rotate`, the one place rotations happen.

Options (per param group, like lr):
  rotation  'hadamard' (default): per axis of size n = 2^k·m (m odd), Q_axis = (H_{2^k}/sqrt(2^k) ⊗ R_m)·diag(s)
            with random signs s and a Haar-random R_m. H_{2^k} is applied as Sylvester blocks of at most
            HADAMARD_BLOCK, shared by all parameters. Extra memory: n signs + m² floats per axis
            (a large odd m, e.g. a prime vocabulary size, makes R_m big: skip that axis).
            'haar': a dense Haar-random n×n factor per axis. Extra memory n² floats per axis
            (a 3072 axis: 36 MiB) and an O(n³) QR at the first step; fine for small models only.
            'identity': Q = I (plain AdamW). Or a callable (n, generator) -> orthogonal [n, n] tensor.
  axes      'all': rotate every axis; 'residual': only axes of size residual_dim; 'none': plain AdamW.
  skip_axes axis indices never rotated, e.g. (0,) for the vocabulary axis of the token embedding.
Size-1 axes are never rotated. Q comes from sha256(seed, parameter name or "group.index", shape), never
from the global RNG, so every machine and DDP rank gets the same Q. Its integer seed `q_seed` and the
rotated axes are kept in the optimizer state, so a resumed run keeps its Q whatever seed it passes.
Moments and rotations are fp32 (bf16 grads are upcast; TF32 is off for CUDA matmuls inside step()),
so the state is AdamW's (step, exp_avg, exp_avg_sq) plus q_seed and rotated_axes, and the factors.

Usage:
    opt = OrthoAdam(model.named_parameters(), lr=1e-3, weight_decay=0.1)
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
"""
import hashlib
import math
import re

import torch

HADAMARD_BLOCK = 64  # largest Sylvester block applied in one matmul: smaller blocks, fewer FLOPs per pass
CPU_SLICE = 1 << 20  # CPU: multi-pass rotations of a tensor whose axis 0 is unrotated go in slices this big
ROTATIONS = ("hadamard", "haar", "identity")
AXES = ("all", "residual", "none")


def rotate(x, factors, transpose=False):
    """Return Q x (or Qᵀ x) for Q = ⊗_axis Q_axis. factors[axis] is None (identity) or (signs, mats):
    Q_axis = (mats[0] ⊗ mats[1] ⊗ ...) · diag(signs), each mat acting on one sub-axis of the axis."""
    rows = CPU_SLICE // max(1, math.prod(x.shape[1:]))
    passes = sum(len(f[1]) for f in factors if f is not None)
    if x.device.type == "cpu" and passes > 1 and factors[0] is None and 0 < rows < x.size(0):
        # rows are rotated independently: several passes over a cache-sized slice beat several passes over
        # the whole tensor (~2x for the 50k x 768 embedding); one dense pass is faster unsliced
        return torch.cat([rotate(part, factors, transpose) for part in x.split(rows)])
    shape = x.shape
    for axis, factor in enumerate(factors):
        if factor is None:
            continue
        signs, mats = factor
        bcast = (-1,) + (1,) * (x.dim() - axis - 1)
        if signs is not None and not transpose:
            x = x * signs.view(bcast)
        outer, inner = math.prod(shape[:axis]), math.prod(shape[axis:])
        for mat in mats:  # view the axis as (..., d, ...) sub-axes; each mat acts on one d
            inner //= mat.shape[0]
            x = torch.einsum("ji,ojr->oir" if transpose else "ij,ojr->oir", mat, x.reshape(outer, mat.shape[0], inner))
            outer *= mat.shape[0]
        x = x.reshape(shape)
        if signs is not None and transpose:
            x = x * signs.view(bcast)
    return x


def sylvester_hadamard(n):
    """Normalised Sylvester Hadamard matrix H_n / sqrt(n), n a power of two, float64."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(n)


def haar_orthogonal(n, generator):
    """Haar-random n×n orthogonal matrix (QR of a Gaussian, column signs fixed as in Mezzadri 2007)."""
    q, r = torch.linalg.qr(torch.randn(n, n, generator=generator, dtype=torch.float64, device="cpu"))
    return (q * torch.sign(torch.diagonal(r))).contiguous()


def axis_factor(n, rotation, generator):
    """(signs, mats) for one axis of size n, float64 on CPU; Hadamard blocks appear as their int size."""
    if rotation == "haar":
        return None, [haar_orthogonal(n, generator)]
    if callable(rotation):
        q = torch.as_tensor(rotation(n, generator), dtype=torch.float64).contiguous()
        if q.shape != (n, n):
            raise ValueError(f"rotation callable returned shape {tuple(q.shape)} for an axis of size {n}")
        return None, [q]
    k = (n & -n).bit_length() - 1  # n = 2^k * m, m odd
    m = n >> k
    signs = torch.randint(0, 2, (n,), generator=generator, device="cpu").to(torch.float64) * 2 - 1
    blocks = math.ceil(k / math.log2(HADAMARD_BLOCK))
    mats = [2 ** (k // blocks + (i < k % blocks)) for i in range(blocks)]  # balanced Sylvester split
    return signs, mats + ([haar_orthogonal(m, generator)] if m > 1 else [])


class OrthoAdam(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *,
                 rotation="hadamard", axes="all", residual_dim=None, skip_axes=(), seed=0):
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"need lr, eps, weight_decay >= 0 and betas in [0, 1), got "
                             f"lr={lr}, eps={eps}, weight_decay={weight_decay}, betas={betas}")
        self.seed = seed
        self._factors = {}  # param -> (key, per-axis factors on its device); rebuilt lazily, never saved
        self._hadamards = {}  # (size, device) -> Sylvester block shared by all parameters
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, rotation=rotation,
                        axes=axes, residual_dim=residual_dim, skip_axes=skip_axes)
        super().__init__(params, defaults)

    def add_param_group(self, param_group):
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        if not (group["rotation"] in ROTATIONS or callable(group["rotation"])):
            raise ValueError(f"rotation={group['rotation']!r}: allowed {ROTATIONS} or a callable (n, generator)")
        if group["axes"] not in AXES:
            raise ValueError(f"axes={group['axes']!r}: allowed {AXES}")
        if group["axes"] == "residual" and not isinstance(group["residual_dim"], int):
            raise ValueError("axes='residual' needs residual_dim=<model width> (an int)")
        if not all(isinstance(a, int) for a in tuple(group["skip_axes"])):
            raise ValueError(f"skip_axes={group['skip_axes']!r}: allowed a tuple of axis indices")
        group["skip_axes"] = tuple(group["skip_axes"])

    def __getstate__(self):
        return {**super().__getstate__(), "seed": self.seed}

    def __setstate__(self, state):
        super().__setstate__(state)  # also runs in load_state_dict: factors follow the loaded q_seed
        self._factors, self._hadamards = {}, {}

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)  # this casts every state tensor to its param's dtype...
        saved = [state_dict["state"].get(i, {}) for g in state_dict["param_groups"] for i in g["params"]]
        for p, s in zip([p for g in self.param_groups for p in g["params"]], saved):
            for key in ("exp_avg", "exp_avg_sq"):  # ...but the moments stay fp32 for bf16/fp16 params
                if key in s:
                    self.state[p][key] = s[key].to(p.device, torch.float32)

    def _rotation_of(self, p, group, gi, pi):
        """(q_seed, rotated axes) of p: from its state, else from seed, identity and shape (then stored)."""
        state = self.state[p]
        if "q_seed" not in state:
            names = group.get("param_names")
            identity = re.sub(r"^(module\.|_orig_mod\.)+", "", names[pi]) if names else f"{gi}.{pi}"  # DDP/compile
            digest = hashlib.sha256(f"{self.seed}/{identity}/{tuple(p.shape)}".encode()).digest()
            state["q_seed"] = int.from_bytes(digest[:8], "big") >> 1
            skip = {a % max(p.dim(), 1) for a in group["skip_axes"]}
            rotates = group["rotation"] != "identity" and group["axes"] != "none"
            state["rotated_axes"] = tuple(a for a, n in enumerate(p.shape) if rotates and n > 1 and a not in skip
                                          and (group["axes"] == "all" or n == group["residual_dim"]))
        return state["q_seed"], state["rotated_axes"]

    def _axis_factors(self, p, group, q_seed, rotated):
        """Per-axis (signs, mats) in float64 on CPU, generated from q_seed alone."""
        generator = torch.Generator().manual_seed(q_seed)
        return [axis_factor(n, group["rotation"], generator) if a in rotated else None for a, n in enumerate(p.shape)]

    def _device_factors(self, p, group, q_seed, rotated):
        key = (q_seed, rotated, group["rotation"], p.device)
        if p not in self._factors or self._factors[p][0] != key:
            factors = []
            for f in self._axis_factors(p, group, q_seed, rotated):
                if f is not None:
                    signs = None if f[0] is None else f[0].to(p.device, torch.float32)
                    f = signs, [self._hadamard(m, p.device) if isinstance(m, int) else m.to(p.device, torch.float32)
                                for m in f[1]]
                factors.append(f)
            self._factors[p] = (key, factors)
        return self._factors[p][1]

    def _hadamard(self, n, device):
        if (n, device) not in self._hadamards:
            self._hadamards[(n, device)] = sylvester_hadamard(n).to(device, torch.float32)
        return self._hadamards[(n, device)]

    def dense_factors(self, p):
        """Dense float64 per-axis factors Q_axis of parameter p (identity where unrotated); Q = ⊗ Q_axis."""
        where = [(gi, pi) for gi, g in enumerate(self.param_groups) for pi, q in enumerate(g["params"]) if q is p]
        if not where:
            raise ValueError("dense_factors: the parameter is not in this optimizer")
        (gi, pi), group = where[0], self.param_groups[where[0][0]]
        dense = []
        for n, f in zip(p.shape, self._axis_factors(p, group, *self._rotation_of(p, group, gi, pi))):
            q = torch.eye(n, dtype=torch.float64)
            if f is not None:
                q = torch.ones(1, 1, dtype=torch.float64)
                for m in f[1]:
                    q = torch.kron(q, sylvester_hadamard(m) if isinstance(m, int) else m)
                q = q if f[0] is None else q * f[0]  # right-multiplying by diag(signs) scales the columns
            dense.append(q)
        return dense

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        matmul = torch.backends.cuda.matmul  # TF32 would perturb Q g and Qᵀ s̄ by ~1e-3 relative
        precision, matmul.fp32_precision = matmul.fp32_precision, "ieee"
        try:
            for gi, group in enumerate(self.param_groups):
                self._group_step(gi, group)
        finally:
            matmul.fp32_precision = precision
        return loss

    def _group_step(self, gi, group):
        lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        params, factors, g_bars, exp_avgs, exp_avg_sqs, bc1s, bc2_sqrts = [], [], [], [], [], [], []
        for pi, p in enumerate(group["params"]):
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("OrthoAdam does not support sparse gradients")
            q_seed, rotated = self._rotation_of(p, group, gi, pi)
            state = self.state[p]
            if "step" not in state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
            state["step"] += 1
            f = self._device_factors(p, group, q_seed, rotated)
            params.append(p)
            factors.append(f)
            g_bars.append(rotate(p.grad.float(), f))
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            bc1s.append(1 - beta1 ** state["step"])
            bc2_sqrts.append(math.sqrt(1 - beta2 ** state["step"]))
        if not params:
            return
        if wd != 0:
            torch._foreach_mul_(params, 1 - lr * wd)
        torch._foreach_lerp_(exp_avgs, g_bars, 1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, g_bars, g_bars, value=1 - beta2)
        del g_bars
        denoms = torch._foreach_sqrt(exp_avg_sqs)  # sqrt(v̂) + eps = sqrt(v̄)/sqrt(1-β2^t) + eps
        torch._foreach_div_(denoms, bc2_sqrts)
        torch._foreach_add_(denoms, eps)
        for p, f, m, d, bc1 in zip(params, factors, exp_avgs, denoms, bc1s):
            p.add_(rotate(m / d, f, transpose=True), alpha=-lr / bc1)  # s̄ = m̂/(sqrt(v̂)+eps), s = Qᵀ s̄
