"""The optimisers train.py builds from its config (configure_optimizer: AdamW, OrthoAdam, RMSProp, SGD, Muon with
AdamW) and the learning-rate schedule (get_lr, set_lr, set_hyperparameters)."""
import math

import torch

from orthoadam import OrthoAdam

# optimizer= (train.py): each name is one branch of configure_optimizer
OPTIMIZERS = ('adamw', 'orthoadam', 'rmsprop', 'sgd', 'muon')
# those whose weight decay is decoupled (theta *= 1 - lr wd); RMSProp's and SGD's is torch's coupled L2 term
DECOUPLED_WEIGHT_DECAY = ('adamw', 'orthoadam', 'muon')


class MuonWithAdamW:
    """optimizer='muon': torch.optim.Muon on the weight matrices of the blocks, AdamW on the rest (embeddings and
    LM head, norms, biases, attn_bias and sink vectors), stepped together as one optimizer."""

    def __init__(self, muon, adamw):
        self.muon, self.adamw = muon, adamw

    @property
    def param_groups(self):   # read each time: load_state_dict replaces the parts' group dicts
        return self.muon.param_groups + self.adamw.param_groups

    @property
    def state(self):
        return {**self.muon.state, **self.adamw.state}

    def step(self):
        self.muon.step()
        self.adamw.step()

    def zero_grad(self, set_to_none=True):
        self.muon.zero_grad(set_to_none)
        self.adamw.zero_grad(set_to_none)

    def state_dict(self):
        return {'muon': self.muon.state_dict(), 'adamw': self.adamw.state_dict()}

    def load_state_dict(self, state):
        self.muon.load_state_dict(state['muon'])
        self.adamw.load_state_dict(state['adamw'])


def muon_split(model):
    """(Muon's parameters, AdamW's parameters) by name: the 2-D weights inside the blocks go to Muon (the
    hidden matrices its authors orthogonalise), everything else to AdamW."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    muon = [(n, p) for n, p in named if n.startswith('transformer.h.') and p.dim() == 2]
    return muon, [(n, p) for n, p in named if not (n.startswith('transformer.h.') and p.dim() == 2)]


def configure_optimizer(model, cfg, device_type):
    """Weight decay on matrices only (not on norms, biases, other 1-D params), nanoGPT style."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if cfg['optimizer'] == 'muon':   # Muon takes the blocks' matrices; the groups below are its AdamW part's
        muon, named = muon_split(model)
    decay = [(n, p) for n, p in named if p.dim() >= 2]
    no_decay = [(n, p) for n, p in named if p.dim() < 2]
    groups = [{'params': [p for _, p in decay], 'param_names': [n for n, _ in decay], 'weight_decay': cfg['weight_decay']},
              {'params': [p for _, p in no_decay], 'param_names': [n for n, _ in no_decay], 'weight_decay': 0.0}]
    lr, betas, eps, name = cfg['learning_rate'], (cfg['beta1'], cfg['beta2']), cfg['eps'], cfg['optimizer']
    if name == 'adamw':
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=device_type in ('cuda', 'cpu'))
    if name == 'muon':   # Keller Jordan's conventions: lr 0.02, momentum 0.95, Nesterov, update x sqrt(max(1, rows / cols))
        opt = torch.optim.Muon([{'params': [p for _, p in muon], 'param_names': [n for n, _ in muon], 'muon': True}],
                               lr=cfg['muon_lr'], weight_decay=cfg['weight_decay'], momentum=cfg['muon_momentum'],
                               nesterov=True, adjust_lr_fn='original')
        return MuonWithAdamW(opt, torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps,
                                                    fused=device_type in ('cuda', 'cpu')))
    if name == 'rmsprop':   # weight decay here is torch's coupled L2 term
        return torch.optim.RMSprop(groups, lr=lr, alpha=cfg['beta2'], eps=eps, momentum=cfg['momentum'])
    if name == 'sgd':
        return torch.optim.SGD(groups, lr=lr, momentum=cfg['momentum'])
    if name != 'orthoadam':
        raise ValueError(f"optimizer {name!r} is in OPTIMIZERS but configure_optimizer does not build it")
    if cfg['orthoadam_vocab_axis'] == 'skip':   # token embedding and LM head (tied or not): vocabulary axis unrotated
        vocab = [model.transformer.wte.weight, model.lm_head.weight]
        keep = [i for i, p in enumerate(groups[0]['params']) if any(p is v for v in vocab)]
        groups.append({'params': [groups[0]['params'][i] for i in keep],
                       'param_names': [groups[0]['param_names'][i] for i in keep],
                       'weight_decay': cfg['weight_decay'], 'skip_axes': (0,)})
        for key in ('params', 'param_names'):
            groups[0][key] = [x for i, x in enumerate(groups[0][key]) if i not in keep]
    return OrthoAdam(groups, lr=lr, betas=betas, eps=eps, rotation=cfg['orthoadam_rotation'],
                     axes=cfg['orthoadam_axes'], residual_dim=cfg['n_embd'], seed=cfg['orthoadam_seed'])


def set_lr(optimizer, lr, cfg):
    """The schedule's lr for every group; Muon's groups follow it in proportion (muon_lr at the peak)."""
    for group in optimizer.param_groups:
        group['lr'] = lr * cfg['muon_lr'] / cfg['learning_rate'] if group.get('muon') else lr


def set_hyperparameters(optimizer, cfg):
    """Put cfg's hyperparameters into every param group, as configure_optimizer would set them. Needed after
    load_state_dict, which restores the saved groups' values: a resume runs with the values it records."""
    name = cfg['optimizer']
    for group in optimizer.param_groups:
        group['weight_decay'] = cfg['weight_decay'] if all(p.dim() >= 2 for p in group['params']) else 0.0
        if group.get('muon'):
            group['momentum'] = cfg['muon_momentum']
        elif name in ('adamw', 'orthoadam', 'muon'):   # muon: its AdamW part
            group['betas'], group['eps'] = (cfg['beta1'], cfg['beta2']), cfg['eps']
        elif name == 'rmsprop':
            group['alpha'], group['eps'], group['momentum'] = cfg['beta2'], cfg['eps'], cfg['momentum']
            if cfg['momentum'] > 0:   # momentum switched on: its buffer starts at zero, as in a fresh RMSprop
                for p in group['params']:
                    state = optimizer.state.get(p)
                    if state and 'momentum_buffer' not in state:
                        state['momentum_buffer'] = torch.zeros_like(p)
        else:
            group['momentum'] = cfg['momentum']


def get_lr(it, cfg):
    """Linear warmup to learning_rate, cosine decay to min_lr at lr_decay_iters, then min_lr."""
    if not cfg['decay_lr']:
        return cfg['learning_rate']
    decay_iters = cfg['lr_decay_iters'] or cfg['max_iters']
    if it < cfg['warmup_iters']:
        return cfg['learning_rate'] * (it + 1) / (cfg['warmup_iters'] + 1)
    if it >= decay_iters:
        return cfg['min_lr']
    ratio = (it - cfg['warmup_iters']) / max(1, decay_iters - cfg['warmup_iters'])
    return cfg['min_lr'] + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg['learning_rate'] - cfg['min_lr'])
