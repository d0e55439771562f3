"""OrthoAdam (Algorithm 1 of the paper): Adam whose moments live in a fixed random orthogonal basis.

For every parameter p with gradient g and a fixed orthogonal Q unique to p:
    ḡ = Q g;  m̄ = β1 m̄ + (1-β1) ḡ;  v̄ = β2 v̄ + (1-β2) ḡ²;  m̂ = m̄/(1-β1^t);  v̂ = v̄/(1-β2^t)
    s̄ = m̂ / (sqrt(v̂) + eps);  s = Qᵀ s̄;  p ← p·(1 - lr·weight_decay) - lr·s
Weight decay is decoupled and applied in the parameter basis, exactly as torch.optim.AdamW does.
Q is never materialised: it is the Kronecker product of one small factor per rotated axis
(for a matrix G: Ḡ = Q0 G Q1ᵀ), applied by `rotate`, or on CUDA inside kernels/orthoadam.py's fused step.

Options (per param group, like lr):
  rotation  'hadamard' (default): per axis of size n = 2^k·m (m odd), Q_axis = (H_{2^k}/sqrt(2^k) ⊗ R_m)·diag(s)
            with random signs s and a Haar-random R_m, applied in as few matmul passes as `axis_blocks` finds:
            Sylvester blocks of at most HADAMARD_BLOCK shared by all parameters, and H_{2^j} ⊗ R_m as one dense
            block per parameter (768 = 32·24: two passes). Extra memory: n signs + (2^j·m)² floats per axis
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

Speed. On CUDA a parameter with exactly one rotated axis whose factor is one or two matrices (the default
'hadamard' / 'residual' case: every parameter but those with two n_embd axes) takes its whole step in one
Triton kernel (kernels/orthoadam.py: g, p, m, v read once, p, m, v written once, as fused AdamW); kernel=False
turns that off. A parameter with no rotated axis (Q = I: the norms' scalars, axes='none') takes torch's fused
AdamW step, all of a group's in one call (fp32 parameters on CPU and CUDA). Everything else, and every
rotated parameter on the CPU, takes the stacked path: the same-shaped parameters of a group are rotated as
one stack (each member with its own Q; one matmul per pass for all of them, at most BUCKET_NUMEL elements
per stack), a parameter bigger than that whose axis 0 is unrotated (the token embedding) in blocks of rows;
each pass is one matmul on a view, signs are applied while stacking and while adding to p, and the moment
update is torch's fused AdamW kernel on CPU and CUDA (on the spare buffer with lr = 1 and weight decay 1,
which zeroes it and subtracts m̂/(sqrt(v̂)+eps) in one pass). Workspace: two fp32 buffers the size of the
largest stack, handed back to the CUDA caching allocator after each step and kept between steps on CPU.

FSDP2 (harness/fsdp.py: DTensor parameters, each rank holding a shard). A shard cut along an axis Q does not rotate holds
whole rotated fibres: it takes the paths above on its local tensor, which is Algorithm 1 on those rows. A parameter
cut along a rotated axis takes _gathered_step: the full gradient rotated on every rank, the moments kept as shards of
the rotated-basis moments, s̄ gathered for Qᵀ s̄. Either way the update equals one process's (tests/test_fsdp.py).

Usage:
    opt = OrthoAdam(model.named_parameters(), lr=1e-3, weight_decay=0.1)
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
"""
import hashlib
import math
import re
import sys

import torch

HADAMARD_BLOCK = 64  # largest Sylvester block applied in one matmul: smaller blocks, fewer FLOPs per pass
MERGE_LIMIT = 256  # largest dense block H_{2^j} ⊗ R_m holding an axis' odd factor m (a larger m stands alone)
BUCKET_NUMEL = 1 << 24  # same-shaped parameters are rotated as one stack of at most this many elements
FUSED_ADAM_DEVICES = ("cpu", "cuda")  # devices where torch._fused_adam_ does the moment update in one kernel
KERNEL_DEVICES = ("cuda",)  # devices where kernels/orthoadam.py does a parameter's whole step in one Triton kernel
ROTATIONS = ("hadamard", "haar", "identity")
AXES = ("all", "residual", "none")


def rotate(x, factors, transpose=False, spare=None, signs=True):
    """Q x (or Qᵀ x) for a stack x [P, *shape] of P same-shaped tensors, each with its own Q = ⊗_axis Q_axis.

    factors[axis] is None (identity) or (signs, mats) with Q_axis = (mats[0] ⊗ mats[1] ⊗ ...)·diag(signs):
    signs is [P, n] or None; a mat is [d, d] (shared by the stack) or [P, d, d] (one per tensor) and acts on
    one sub-axis of the axis, outermost first (mats whose sizes multiply to less than n act as mats ⊗ I; axis_factor
    always covers n, and orthoadam_kernel.plan, which rotates whole fibres, refuses anything else). The sign diagonals of all axes commute with the other axes' mats, so Q x applies
    every sign first and Qᵀ x every sign last (signs=False leaves them to the caller). Every pass is one
    matmul on a view, no copies: x is overwritten and spare (like x; allocated if None) takes every other
    pass. Returns (result, the other buffer)."""
    spare = torch.empty_like(x) if spare is None else spare
    diagonals = sign_views(factors, x.shape) if signs else []
    if not transpose:
        for d in diagonals:
            x.mul_(d)
    P, shape = x.shape[0], x.shape[1:]
    for axis, factor in enumerate(factors):
        if factor is None:
            continue
        outer, inner = math.prod(shape[:axis]), math.prod(shape[axis:])
        for mat in factor[1]:  # view the axis as (..., d, ...) sub-axes; each mat acts on one d
            d = mat.shape[-1]
            inner //= d
            _matmul_pass(mat.mT if transpose else mat, x, spare, P, outer, d, inner)
            x, spare = spare, x
            outer *= d
    if transpose:
        for d in diagonals:
            x.mul_(d)
    return x, spare


def sign_views(factors, shape):
    """The sign vectors of factors as tensors broadcasting against a stack of shape [P, *param_shape]."""
    return [f[0].view((shape[0],) + (1,) * axis + (-1,) + (1,) * (len(shape) - axis - 2))
            for axis, f in enumerate(factors) if f is not None and f[0] is not None]


def _matmul_pass(mat, x, out, P, outer, d, inner):
    """out[p, o, :, i] = mat(p) @ x[p, o, :, i] for x, out viewed as [P, outer, d, inner]."""
    if mat.dim() == 2:  # shared by the stack: the stack is more rows
        rows = P * outer
        if inner == 1:
            torch.mm(x.view(rows, d), mat.T, out=out.view(rows, d))
        elif rows == 1:
            torch.mm(mat, x.view(d, inner), out=out.view(d, inner))
        else:
            torch.matmul(mat, x.view(rows, d, inner), out=out.view(rows, d, inner))
    elif inner == 1:
        torch.bmm(x.view(P, outer, d), mat.mT, out=out.view(P, outer, d))
    elif outer == 1:
        torch.bmm(mat, x.view(P, d, inner), out=out.view(P, d, inner))
    else:
        torch.matmul(mat.unsqueeze(1), x.view(P, outer, d, inner), out=out.view(P, outer, d, inner))


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


def axis_blocks(k, m):
    """How an axis of size 2^k·m (m odd) is rotated: (Sylvester block sizes, j) where H_{2^j} joins R_m in
    one dense block. Fewest passes first (Sylvester blocks <= HADAMARD_BLOCK, dense block <= MERGE_LIMIT),
    then the fewest FLOPs per element (2·sum of block sizes). Blocks ascend: the largest acts on the
    innermost sub-axis, where a pass is one long matmul (H_a ⊗ H_b = H_b ⊗ H_a, so Q does not change)."""
    best = None
    for j in range(k + 1) if m > 1 else [0]:
        if m > 1 and j and m << j > MERGE_LIMIT:
            break
        n_blocks = math.ceil((k - j) / math.log2(HADAMARD_BLOCK))
        sizes = [2 ** ((k - j) // n_blocks + (i >= n_blocks - (k - j) % n_blocks)) for i in range(n_blocks)]
        cost = (n_blocks + (m > 1), sum(sizes) + (m << j if m > 1 else 0))
        if best is None or cost < best[0]:
            best = cost, sizes, j
    return best[1], best[2]


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
    mats, j = axis_blocks(k, m)
    if m > 1:  # H_{2^j} ⊗ R_m as one dense block: the same Q in one pass fewer
        mats.append(torch.kron(sylvester_hadamard(2 ** j), haar_orthogonal(m, generator)))
    return signs, mats


def rotated_axes(shape, group):
    """The axes of a parameter of this (global) shape that a param group's Q rotates: size > 1, not skipped, and of
    size residual_dim when axes='residual'. harness/fsdp.py shards a parameter along an axis outside this set."""
    skip = {a % max(len(shape), 1) for a in group["skip_axes"]}
    rotates = group["rotation"] != "identity" and group["axes"] != "none"
    return tuple(a for a, n in enumerate(shape) if rotates and n > 1 and a not in skip
                 and (group["axes"] == "all" or n == group["residual_dim"]))


def local(t):
    """A DTensor's shard on this rank (FSDP2), any other tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def shard_axis(t):
    """The axis a DTensor is sharded along (FSDP2: one mesh dimension, Shard(axis)), None for a plain tensor."""
    placements = getattr(t, "placements", ())
    return next((pl.dim for pl in placements if hasattr(pl, "dim")), None)


def adam_direction(s, g_bar, exp_avgs, exp_avg_sqs, steps, group, written):
    """Adam's moments in the rotated basis from the stack g_bar = Q G, and s = -m̂/(sqrt(v̂)+eps) written into the
    stack s. written=False: s may hold stale workspace and is zeroed first."""
    beta1, beta2 = group["betas"]
    device = s.device
    if device.type in FUSED_ADAM_DEVICES:
        # s = s·(1 - 1·1) - 1·m̂/(sqrt(v̂)+eps) = -m̂/(sqrt(v̂)+eps): torch's AdamW update with lr = 1 and
        # weight decay 1 zeroes s inside the kernel, which saves a pass over memory writing zeros first
        if not written:   # 0·NaN is NaN
            s.zero_()
        step_tensors = {t: torch.full((), float(t), device=device) for t in set(steps)}
        torch._fused_adamw_(list(s.unbind(0)), list(g_bar.unbind(0)), exp_avgs, exp_avg_sqs, [],
                            [step_tensors[t] for t in steps], lr=1.0, beta1=beta1, beta2=beta2,
                            weight_decay=1.0, eps=group["eps"], amsgrad=False, maximize=False)
    else:   # torch.div below writes every element of s
        g_bars = list(g_bar.unbind(0))
        torch._foreach_lerp_(exp_avgs, g_bars, 1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, g_bars, g_bars, value=1 - beta2)
        for s_i, m, v, t in zip(s.unbind(0), exp_avgs, exp_avg_sqs, steps):
            denom = (v.sqrt() / math.sqrt(1 - beta2 ** t)).add_(group["eps"])
            torch.div(m, denom, out=s_i).mul_(-1 / (1 - beta1 ** t))


def row_blocks(shape, split):
    """Index expressions cutting a tensor of shape into blocks of rows of at most BUCKET_NUMEL elements
    (split=True: its axis 0 is unrotated, so rows are independent) or taking it whole."""
    numel = math.prod(shape)
    if not split or numel <= BUCKET_NUMEL:
        return [...]
    rows = max(1, BUCKET_NUMEL * shape[0] // numel)
    return [slice(r, r + rows) for r in range(0, shape[0], rows)]


class OrthoAdam(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *,
                 rotation="hadamard", axes="all", residual_dim=None, skip_axes=(), seed=0, kernel=True):
        if lr < 0 or eps < 0 or weight_decay < 0 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"need lr, eps, weight_decay >= 0 and betas in [0, 1), got "
                             f"lr={lr}, eps={eps}, weight_decay={weight_decay}, betas={betas}")
        self.seed = seed
        self.kernel = kernel  # False: the stacked-matmul path on every device (same arithmetic; for comparisons)
        self._factors = {}  # (Q seeds, axes, rotation, shape, device) -> rotate()'s factors; rebuilt lazily, never saved
        self._hadamards = {}  # (size, device) -> Sylvester block shared by all parameters
        self._buffers = {}  # device -> two fp32 workspace buffers (see _workspace)
        self._kernel_failed = False  # orthoadam_kernel could not compile here: the stacked path for every parameter
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
        return {**super().__getstate__(), "seed": self.seed, "kernel": self.kernel}

    def __setstate__(self, state):
        super().__setstate__(state)  # also runs in load_state_dict: factors follow the loaded q_seed
        self.__dict__.setdefault("kernel", True)
        self._factors, self._hadamards, self._buffers, self._kernel_failed = {}, {}, {}, False

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
            state["rotated_axes"] = rotated_axes(p.shape, group)
        return state["q_seed"], state["rotated_axes"]

    def _axis_factors(self, p, group, q_seed, rotated):
        """Per-axis (signs, mats) in float64 on CPU, generated from q_seed alone."""
        generator = torch.Generator().manual_seed(q_seed)
        return [axis_factor(n, group["rotation"], generator) if a in rotated else None for a, n in enumerate(p.shape)]

    def _stack_factors(self, ps, group, seeds, rotated):
        """rotate()'s factors for a stack of same-shaped parameters with Q seeds `seeds`: shared Sylvester blocks,
        per-parameter signs and dense blocks stacked, fp32 on the parameters' device; cached."""
        device = ps[0].device
        key = (seeds, rotated, group["rotation"], tuple(ps[0].shape), device)
        if key not in self._factors:
            per_param = [self._axis_factors(p, group, s, rotated) for p, s in zip(ps, seeds)]
            factors = []
            for axis in zip(*per_param):
                if axis[0] is None:
                    factors.append(None)
                    continue
                signs = None if axis[0][0] is None else torch.stack([f[0] for f in axis]).to(device, torch.float32)
                mats = [self._hadamard(m, device) if isinstance(m, int) else
                        torch.stack([f[1][j] for f in axis]).to(device, torch.float32)
                        for j, m in enumerate(axis[0][1])]
                factors.append((signs, mats))
            self._factors[key] = factors
        return self._factors[key]

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
            # CPU keeps the workspace (fresh pages cost more than the step's arithmetic on them); CUDA hands it
            # back to the caching allocator, for activations to reuse
            self._buffers = {d: w for d, w in self._buffers.items() if d.type == "cpu"}
        return loss

    def _group_step(self, gi, group):
        lr, wd = group["lr"], group["weight_decay"]
        stacks = {}  # same shape, rotated axes, device: rotated together
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
            if shard_axis(p) in rotated:   # FSDP2 split p along an axis its Q mixes: rotate the full gradient
                self._gathered_step(p, group, q_seed, rotated)
                continue
            stacks.setdefault((tuple(local(p).shape), rotated, p.device), []).append((p, q_seed))
        if not stacks:
            return
        unrotated = [k for k in stacks if not k[1] and k[2].type in FUSED_ADAM_DEVICES and
                     all(p.dtype == p.grad.dtype == torch.float32 for p, _ in stacks[k])]
        for device in {k[2] for k in unrotated}:   # Q = I: Algorithm 1 is AdamW, one fused call per device
            self._adamw_step([p for k in unrotated if k[2] == device for p, _ in stacks.pop(k)], group)
        for key in [k for k in stacks if self.kernel and k[1] and k[2].type in KERNEL_DEVICES]:   # one kernel each
            if self._kernel_steps(stacks[key], group, key[1]):
                del stacks[key]
        if wd != 0 and stacks:  # decoupled, on the parameter before the step: p·(1 - lr·wd) - lr·s
            torch._foreach_mul_([local(p) for stack in stacks.values() for p, _ in stack], 1 - lr * wd)
        for (shape, rotated, device), stack in stacks.items():
            numel = max(1, math.prod(shape))
            per_stack = max(1, BUCKET_NUMEL // numel)
            for i in range(0, len(stack), per_stack):
                ps, seeds = zip(*stack[i:i + per_stack])
                factors = self._stack_factors(ps, group, seeds, rotated)
                states = [self.state[p] for p in ps]
                tensors = [[local(t) for t in ts] for ts in (ps, [p.grad for p in ps], [s["exp_avg"] for s in states],
                                                               [s["exp_avg_sq"] for s in states])]
                for rows in row_blocks(shape, 0 not in rotated):   # whole tensors, no views, when not split
                    self._stack_step(*(tensors if rows is ... else [[t[rows] for t in ts] for ts in tensors]),
                                     [s["step"] for s in states], group, factors)

    def _adamw_step(self, ps, group):
        """The step of fp32 parameters with no rotated axis (Q = I: the norms' scalars, axes='none',
        rotation='identity'): torch's fused AdamW kernel on all of them in one call, instead of the stacked
        path's copies, zeroing and separate decay and update passes (the same arithmetic as
        torch.optim.AdamW(fused=True))."""
        states = [self.state[p] for p in ps]
        device, (beta1, beta2) = ps[0].device, group["betas"]
        steps = {t: torch.full((), float(t), device=device) for t in {s["step"] for s in states}}
        torch._fused_adamw_([local(p) for p in ps], [local(p.grad) for p in ps], [local(s["exp_avg"]) for s in states],
                            [local(s["exp_avg_sq"]) for s in states], [], [steps[s["step"]] for s in states],
                            lr=group["lr"], beta1=beta1, beta2=beta2, weight_decay=group["weight_decay"],
                            eps=group["eps"], amsgrad=False, maximize=False)

    def _kernel_steps(self, stack, group, rotated):
        """orthoadam_kernel's step for each parameter of a stack, when the kernel can take them all; False (and
        nothing done) otherwise."""
        if self._kernel_failed:
            return False
        try:
            from kernels import orthoadam as orthoadam_kernel
        except ImportError:  # no Triton
            return False
        params, seeds = zip(*stack)
        factors = self._stack_factors(params, group, seeds, rotated)
        ps = [local(p) for p in params]   # FSDP2: this rank's shard, cut along an axis Q does not rotate
        grads = [local(p.grad) for p in params]
        if not all(g.shape == p.shape for p, g in zip(ps, grads)):
            return False
        signs, mats = factors[rotated[0]]
        how = orthoadam_kernel.plan(ps[0], rotated, factors[rotated[0]])
        if how is None or signs is None or not all(p.is_contiguous() for p in ps):
            return False
        beta1, beta2 = group["betas"]
        for i, p in enumerate(ps):
            state = self.state[params[i]]
            try:
                orthoadam_kernel.step(how, p, grads[i], local(state["exp_avg"]), local(state["exp_avg_sq"]), signs[i],
                                      [m if m.dim() == 2 else m[i] for m in mats], lr=group["lr"],
                                      betas=(beta1, beta2), eps=group["eps"], weight_decay=group["weight_decay"],
                                      t=state["step"])
            except Exception as e:  # Triton compiles at the first launch, before anything is written
                if i:
                    raise
                print(f"warning: OrthoAdam's fused Triton step cannot run here ({type(e).__name__}: "
                      f"{str(e).splitlines()[0][:200] if str(e) else ''}); using the stacked-matmul path",
                      file=sys.stderr, flush=True)
                self._kernel_failed = True
                return False
        return True

    def _workspace(self, n, device):
        """Two fp32 buffers of at least n elements on device, reused by every stack (CPU: by every step)."""
        if self._buffers.get(device, (torch.empty(0),))[0].numel() < n:
            self._buffers[device] = (torch.empty(n, device=device), torch.empty(n, device=device))
        return self._buffers[device]

    def _stack_step(self, ps, grads, exp_avgs, exp_avg_sqs, steps, group, factors):
        """Algorithm 1 for P same-shaped tensors at once (parameters, or row blocks of one): Ḡ = Q G for the
        stack G of their gradients, the moments and s̄ = m̂/(sqrt(v̂)+eps) in one fused kernel, p -= lr Qᵀ s̄."""
        device, shape, n = ps[0].device, (len(ps),) + ps[0].shape, len(ps) * ps[0].numel()
        a, b = (w[:n].view(shape) for w in self._workspace(n, device))
        diagonals = sign_views(factors, shape)  # D g is taken while stacking, Dᵀ u while adding to p
        for i, g in enumerate(grads):  # to fp32 from any dtype
            if diagonals:
                torch.mul(g, diagonals[0][i], out=a[i])
            else:
                a[i].copy_(g)
        for d in diagonals[1:]:
            a.mul_(d)
        g_bar, s = rotate(a, factors, spare=b, signs=False)
        written = any(f is not None for f in factors)  # s holds this step's first pass (finite for finite grads)
        adam_direction(s, g_bar, exp_avgs, exp_avg_sqs, steps, group, written)
        update, _ = rotate(s, factors, transpose=True, spare=g_bar, signs=False)  # -Qᵀ s̄ up to the signs
        for d in diagonals[1:]:
            update.mul_(d)
        if diagonals:
            for i, p in enumerate(ps):
                p.addcmul_(update[i], diagonals[0][i], value=group["lr"])
        else:
            torch._foreach_add_(ps, list(update.unbind(0)), alpha=group["lr"])

    def _gathered_step(self, p, group, q_seed, rotated):
        """Algorithm 1 for a DTensor that FSDP2 split along an axis its Q rotates (a norm's scale; a matrix with
        every axis rotated): no rank can rotate its shard alone, so every rank rotates the full gradient (one
        all-gather), updates its own shard of the moments (which live in the rotated basis, sharded as p), and
        the full s̄ is gathered (a second all-gather) for Qᵀ s̄; each rank then keeps its shard of the update.
        The arithmetic is the one-process step's, element for element."""
        from torch.distributed.tensor import DTensor, distribute_tensor
        mesh, placements, state = p.device_mesh, p.placements, self.state[p]

        def shard(full):   # this rank's part of a full tensor, cut as p is (no communication)
            return distribute_tensor(full, mesh, placements, src_data_rank=None).to_local()
        factors = self._stack_factors([p], group, (q_seed,), rotated)
        g_bar, _ = rotate(p.grad.full_tensor().to(torch.float32).unsqueeze(0).contiguous(), factors)
        s = torch.zeros_like(shard(g_bar[0])).unsqueeze(0)
        adam_direction(s, shard(g_bar[0]).unsqueeze(0), [local(state["exp_avg"])], [local(state["exp_avg_sq"])],
                       [state["step"]], group, written=True)
        s_full = DTensor.from_local(s[0], mesh, placements, shape=p.shape, stride=p.stride()).full_tensor()
        update, _ = rotate(s_full.unsqueeze(0).contiguous(), factors, transpose=True)
        mine = local(p)
        if group["weight_decay"] != 0:
            mine.mul_(1 - group["lr"] * group["weight_decay"])
        mine.add_(shard(update[0]).to(mine.dtype), alpha=group["lr"])

    def factor_bytes(self):
        """Bytes of the rotation factors held now (Sylvester blocks shared by all parameters counted once)."""
        tensors = {id(t): t for t in self._hadamards.values()}
        for factors in self._factors.values():
            for f in factors:
                if f is not None:
                    tensors.update({id(t): t for t in ([f[0]] if f[0] is not None else []) + f[1]})
        return sum(t.numel() * t.element_size() for t in tensors.values())
