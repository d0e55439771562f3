"""train.py's config schema in one place: every key with its default (DEFAULTS), allowed values (CHOICES),
numeric range (RANGES) and --help line (HELP); what a resume may change (RESUME_*); and TrainingError, the
one-line error that ends a run. configurator.py checks a config against these; reproduce.py and bench.py read them.
The choices of the model, optimizer and rotation keys are those of the modules that implement them (model.CHOICES,
optimizers.OPTIMIZERS, orthoadam.ROTATIONS and AXES): a value added there is valid here."""
from dataclasses import fields

import orthoadam
from harness.optimizers import OPTIMIZERS
from model import CHOICES as MODEL_CHOICES, GPTConfig


DEFAULTS = dict(
    # I/O
    out_dir='out', init_from='scratch', eval_interval=1000, eval_tokens=1_048_576, eval_only=False,
    log_interval=10, always_save_checkpoint=True, save_every=0, divergence_factor=10.0,
    probe_docs=8,    # at every evaluation, analyze.py's metrics on the first probe_docs validation documents (0 = off)
    probe_interval=0,   # also probe every N iterations between evaluations, without evaluating or saving (0 = off)
    wandb_log=False, wandb_project='softmax1-orthoadam', wandb_run_name='run',
    # data: data/<dataset>/{train,val}.bin + meta.json (an absolute path works too)
    dataset='c4', batch_size=32, gradient_accumulation_steps=16,   # global accumulation over all ranks
    windows='random',   # 'random': windows start anywhere; 'document': at a document's eot (BOS), see get_batch
    # model (GPTConfig); vocab_size=0 takes it from meta.json
    n_layer=12, n_head=12, n_embd=768, block_size=256, vocab_size=0, dropout=0.0, bias=True, norm_bias=None,
    attn='softmax', norm='layernorm', pos_emb='absolute', mlp='gelu', init='gpt2', causal_free_prefix=0,
    clip_gamma=-0.025, clip_zeta=1.0, sigmoid_bias=None, attn_bias=False, sink_token=False,   # other published fixes
    n_kv_head=0, mlp_hidden=0, rope_base=10000.0, norm_eps=1e-5, tie_embeddings=True,
    # optimiser
    optimizer='adamw', learning_rate=1e-3, weight_decay=0.0, beta1=0.9, beta2=0.999, eps=1e-8,
    momentum=0.9, grad_clip=1.0, muon_lr=0.02, muon_momentum=0.95,
    orthoadam_rotation='hadamard', orthoadam_axes='residual', orthoadam_vocab_axis='skip', orthoadam_seed=0,
    # schedule: linear warmup, cosine decay to min_lr at lr_decay_iters (0 = max_iters of the run's start)
    max_iters=40000, warmup_iters=2000, lr_decay_iters=0, min_lr=1e-4, decay_lr=True,
    max_minutes=0.0,   # a job's time budget: stop cleanly with a checkpoint after this many minutes (0 = off)
    # system
    device='auto', dtype='auto', compile=True, seed=1337,
    fsdp=False,   # under torchrun: shard weights, gradients and optimizer state across ranks (harness/fsdp.py)
)
CHOICES = dict(
    MODEL_CHOICES,
    windows=('random', 'document'),
    optimizer=OPTIMIZERS,
    orthoadam_rotation=orthoadam.ROTATIONS,
    orthoadam_axes=orthoadam.AXES,
    orthoadam_vocab_axis=('skip', 'rotate'),
    dtype=('auto', 'float32', 'bfloat16', 'float16'),
)
# the valid interval of every numeric key (configurator.py checks them)
RANGES = dict(
    eval_interval='[1, inf)', eval_tokens='[1, inf)', log_interval='[1, inf)', save_every='[0, inf)',
    divergence_factor='[0, inf)', probe_docs='[0, inf)', probe_interval='[0, inf)',
    batch_size='[1, inf)', gradient_accumulation_steps='[1, inf)',
    n_layer='[1, inf)', n_head='[1, inf)', n_embd='[1, inf)', block_size='[1, inf)', vocab_size='[0, inf)',
    dropout='[0, 1)', causal_free_prefix='[0, inf)',
    learning_rate='(0, inf)', weight_decay='[0, inf)', beta1='[0, 1)', beta2='[0, 1)', eps='(0, inf)',
    momentum='[0, 1)', grad_clip='[0, inf)', orthoadam_seed='[0, inf)',
    max_iters='[1, inf)', max_minutes='[0, inf)', warmup_iters='[0, inf)', lr_decay_iters='[0, inf)', min_lr='[0, inf)',
    n_kv_head='[0, inf)', mlp_hidden='[0, inf)', rope_base='(0, inf)', norm_eps='(0, 1)',
    seed='[0, 4294967295]', clip_gamma='(-inf, 0]', clip_zeta='[1, inf)', muon_lr='(0, inf)', muon_momentum='[0, 1)',
)
# one line per key for --help (docs/training.md's table says the same at more length)
HELP = dict(
    out_dir='folder of ckpt.pt, best.pt, config.json, log.jsonl',
    init_from="'scratch' (refuses a folder with a checkpoint), 'resume' (continue ckpt.pt), 'auto' (resume if it exists), "
              "'hf:NAME_OR_DIR' or 'hf:FILE.gguf' (a public model's weights)",
    eval_interval='evaluate every N iterations and at the end',
    eval_tokens='validation tokens per evaluation (a fixed prefix of val.bin)',
    eval_only='evaluate ckpt.pt of out_dir and exit',
    log_interval='progress line and log.jsonl event every N iterations',
    always_save_checkpoint='write ckpt.pt at every evaluation (False: only when val loss improves, and at the end)',
    save_every='also keep ckpt_<iter>.pt every N iterations, never overwritten by later ones (0 = off)',
    divergence_factor='stop (exit 2, no checkpoint written) when val perplexity > factor x the best so far; 0 = off',
    probe_docs="at every evaluation, analyze.py's metrics on the first N validation documents, logged as 'probe'; 0 = off",
    probe_interval="also every N iterations, the probe alone (a 'probe' event: no evaluation, no checkpoint): a finer "
                   "trajectory for the cost of the probe; 0 = only at evaluations",
    wandb_log='also log the events to wandb', wandb_project='wandb project', wandb_run_name='wandb run name',
    dataset='prepared data folder data/<dataset>, or a path (prepare_c4.py)',
    batch_size='sequences per micro-batch (split over ranks when there are more ranks than micro-batches)',
    gradient_accumulation_steps='micro-batches per iteration over all ranks',
    windows="where training windows start: 'random' (anywhere) or 'document' (at a document's eot, a BOS)",
    n_layer='transformer blocks', n_head='attention heads', n_embd='residual stream width',
    block_size='training sequence length', vocab_size='0 = from meta.json (padded to a multiple of 64)',
    dropout='dropout on embeddings, attention and residual branches',
    bias='biases in Linear layers and LayerNorm',
    norm_bias="LayerNorm's bias alone: None = as bias; True with bias=False is Guo et al.'s (2024) model", attn='attention normalisation', norm='normalisation layer',
    pos_emb='position encoding', mlp='feed-forward block',
    init="initial weights: 'gpt2' (N(0, 0.02), GPT-2's scheme) or 'torch' (PyTorch's layer defaults, Guo et al.)",
    causal_free_prefix='the first k tokens attend to each other without causal mask',
    n_kv_head='key/value heads (grouped-query attention when fewer than n_head); 0 = n_head',
    mlp_hidden='MLP hidden size; 0 = the default of mlp', rope_base='rotary base theta',
    norm_eps='epsilon of LayerNorm / RMSNorm', tie_embeddings='the LM head is the token embedding matrix',
    clip_gamma="attn='clipped': clip((zeta - gamma) softmax + gamma, 0, 1), gamma <= 0",
    clip_zeta="attn='clipped': the stretch's upper end, zeta >= 1",
    sigmoid_bias="attn='sigmoid': b in sigmoid(s + b); None = -log(block_size)",
    attn_bias='a learnt key and value per head and layer that every query also sees',
    sink_token='a learnt embedding prepended at position 0 of every window (the loss ignores it)',
    optimizer='optimiser', learning_rate='peak learning rate', weight_decay='weight decay on matrices',
    beta1='Adam first-moment decay', beta2="Adam second-moment decay (RMSProp's alpha)", eps='Adam/RMSProp epsilon',
    momentum='SGD and RMSProp momentum (0 = none)', grad_clip='global gradient-norm clipping (0 = off)',
    muon_lr="optimizer='muon': peak lr of Muon's matrices (the rest: learning_rate)",
    muon_momentum="optimizer='muon': Muon's (Nesterov) momentum",
    orthoadam_rotation="OrthoAdam per-axis rotation ('identity': Q = I)",
    orthoadam_axes="OrthoAdam: rotate the residual axes, all, or none (AdamW's arithmetic)",
    orthoadam_vocab_axis="OrthoAdam with axes='all': the embedding's vocabulary axis",
    orthoadam_seed='seed of the OrthoAdam rotations',
    max_iters='iterations to train',
    max_minutes='stop after this many minutes of training with a checkpoint (a job of a chain: the next '
                'job resumes exactly with --init_from=auto); 0 = no limit',
    warmup_iters='linear warmup iterations',
    lr_decay_iters='cosine reaches min_lr here (0 = max_iters when the run starts; a resume keeps it)',
    min_lr='final learning rate', decay_lr='False: constant learning_rate',
    device="'auto' (cuda if available), 'cpu', 'cuda', 'cuda:N'",
    fsdp="under torchrun: FSDP2, each rank holds 1/N of weights, gradients, optimizer state (harness/fsdp.py; docs/training.md)",
    dtype="'auto' = bfloat16 on CUDA when supported, else float32 (a CPU too: bf16's numbers differ between CPUs); "
          "'bfloat16' on a CPU: autocast, fp32 weights and optimizer state (the CPU configs' setting)", compile='torch.compile the model',
    seed='initialisation, dropout and data-sampling seed',
)
# What init_from='resume' may change. Every key is in exactly one of these sets (a test checks).
# May change: the new value is what runs (optimizer param groups, schedule, logging, hardware); each change is
# printed ("changed on resume: key old -> new") and logged ({"event": "resume_change"}).
RESUME_MAY_CHANGE = {
    'out_dir', 'eval_interval', 'eval_tokens', 'log_interval', 'always_save_checkpoint', 'save_every',
    'divergence_factor', 'probe_docs', 'probe_interval', 'wandb_log', 'wandb_project', 'wandb_run_name',
    'learning_rate', 'min_lr', 'warmup_iters', 'lr_decay_iters', 'decay_lr', 'max_iters', 'max_minutes',
    'weight_decay', 'beta1', 'beta2', 'eps', 'momentum', 'grad_clip', 'muon_lr', 'muon_momentum',
    'device', 'dtype', 'compile',
    'dataset',   # only its path: the data itself (meta.json's identity) must be the same, see check_resume
}
# Must match: they define what the saved weights, optimizer state and data position mean. The model, the
# optimizer and its rotations; the data sampler (seed, windows, and the global batch: batch_size x
# gradient_accumulation_steps sequences drawn per iteration from an RNG keyed by (seed, iter, micro-batch)).
# A difference is a one-line error listing every such key; nothing in out_dir is touched.
RESUME_MUST_MATCH = {
    'optimizer', 'orthoadam_rotation', 'orthoadam_axes', 'orthoadam_vocab_axis', 'orthoadam_seed',
    'batch_size', 'gradient_accumulation_steps', 'windows', 'seed',
    *(f.name for f in fields(GPTConfig)),
}
# How this invocation starts, not what the run is.
RESUME_IGNORED = {'init_from', 'eval_only', 'fsdp'}   # fsdp: fsdp.check_sharded says how
MODEL_KEYS = [f.name for f in fields(GPTConfig)]
INIT_FROM = ('scratch', 'resume', 'auto', 'hf:NAME_OR_DIR', 'hf:FILE.gguf')
# the model keys a public model fixes (init_from='hf:...'); attn, dropout, block_size, causal_free_prefix stay the config's
PUBLIC_MODEL_KEYS = ('n_layer', 'n_head', 'n_embd', 'vocab_size', 'bias', 'norm', 'pos_emb', 'mlp', 'n_kv_head',
                     'mlp_hidden', 'rope_base', 'norm_eps', 'tie_embeddings')


class TrainingError(RuntimeError):
    """A one-line, user-facing error that ends the run."""
