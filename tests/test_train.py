"""train.py end to end on CPU: logging, checkpoints, exact resume, DDP equivalence, clear errors."""
import json
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import train
from conftest import ROOT, write_dataset
from configurator import load_config
from harness import devices, measure, optimizers, runs, train_config, train_data

pytestmark = pytest.mark.slow   # train.py end to end, DDP under torchrun


def config(data, out, *overrides):
    args = [os.path.join(ROOT, 'config', 'tiny_cpu.py'), f'--dataset={data}', f'--out_dir={out}',
            '--n_layer=2', '--n_embd=32', '--n_head=2', '--block_size=32', '--batch_size=4',
            '--eval_tokens=2048', '--log_interval=1', '--warmup_iters=2', '--lr_decay_iters=12',
            '--max_iters=6', '--eval_interval=100', *overrides]
    return load_config(train_config.DEFAULTS, list(args), train_config.CHOICES)


def config_args(data, out, *overrides):
    """config()'s arguments as train.py's command line."""
    return [os.path.join('config', 'tiny_cpu.py'), f'--dataset={data}', f'--out_dir={out}', '--n_layer=2',
            '--n_embd=32', '--n_head=2', '--block_size=32', '--batch_size=4', '--log_interval=1', '--warmup_iters=2',
            '--lr_decay_iters=12', '--max_iters=6', '--eval_interval=100', *overrides]


def run_cli(*args, env=None, **kw):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, **(env or {})), timeout=240, **kw)


def final_weights(out):
    return torch.load(os.path.join(out, 'ckpt.pt'), map_location='cpu', weights_only=False)['model']


def test_tiny_run_logs_checkpoints_and_learns(bigram_data, tmp_path):
    out = str(tmp_path / 'run')
    result = train.train(config(bigram_data, out, '--max_iters=30', '--lr_decay_iters=30', '--eval_interval=15',
                                '--attn=softmax1', '--optimizer=orthoadam', '--log_interval=5'))
    events = [json.loads(line) for line in open(os.path.join(out, 'log.jsonl'))]
    evals = [e for e in events if e['event'] == 'eval']
    trains = [e for e in events if e['event'] == 'train']
    assert [e['iter'] for e in evals] == [0, 15, 30]
    assert [e['iter'] for e in trains] == [5, 10, 15, 20, 25, 30]
    assert evals[-1]['val_loss'] < evals[0]['val_loss'] - 0.5       # a bigram process is learnable
    assert evals[0]['val_loss'] == pytest.approx(math.log(64), abs=0.3)   # uniform over 64 tokens at init
    assert result['val_ppl'] == pytest.approx(math.exp(evals[-1]['val_loss']))
    assert set(trains[0]) >= {'loss', 'lr', 'tokens_per_s', 'mfu', 'elapsed_s', 'tokens'}
    ckpt = torch.load(result['ckpt'], map_location='cpu', weights_only=False)
    assert ckpt['iter_num'] == 30 and not any(k.startswith('_orig_mod') for k in ckpt['model'])
    assert {'model', 'optimizer', 'model_args', 'rng', 'config', 'data', 'scaler'} <= set(ckpt)
    assert all('q_seed' in s for s in ckpt['optimizer']['state'].values())   # OrthoAdam's Q identity
    saved = json.load(open(os.path.join(out, 'config.json')))
    assert saved['attn'] == 'softmax1' and saved['vocab_size'] == 64


@pytest.mark.parametrize('variant', [(), ('--windows=document', '--attn=softmax1', '--sink_token=True')])
def test_last_probe_equals_analyze_on_the_final_checkpoint(bigram_data, tmp_path, variant):
    """Every evaluation logs a probe under analyze.py's JSON keys; a resumed run keeps one history (the evaluation
    at the resume point twice, read_log counts it once); the last probe equals what analyze.py's command line
    writes (--json) for the final checkpoint on the same documents. Document windows: the BOS; sink token: the
    first real token and the sink's own keys."""
    import analyze
    out = str(tmp_path / 'run')
    common = ('--probe_docs=8', '--eval_interval=3', *variant)
    train.train(config(bigram_data, out, *common, '--max_iters=3'))
    train.train(config(bigram_data, out, *common, '--max_iters=6', '--init_from=resume'))
    _, evals = runs.read_log(os.path.join(out, 'log.jsonl'))
    assert [(e['iter'], e['tokens']) for e in evals] == [(0, 0), (3, 3 * 4 * 32), (6, 6 * 4 * 32)]   # 4 x 32 per iter
    at3 = [json.loads(line)['probe'] for line in open(os.path.join(out, 'log.jsonl')) if '"eval", "iter": 3,' in line]
    assert len(at3) == 2 and at3[0] == at3[1]          # the same weights before and after the resume
    json_path = str(tmp_path / 'analysis.json')
    r = run_cli('analyze.py', '--ckpt', out, '--max_docs', '8', '--json', json_path)
    assert r.returncode == 0, r.stderr[-3000:]
    ref, probe = json.load(open(json_path)), evals[-1]['probe']
    keys = set(ref['per_layer'])
    assert keys >= {'kurtosis_first', 'kurtosis_rest', 'max_abs_first', 'max_abs_rest', 'first_attn_argmax',
                    'first_attn_mass', 'attn_nowhere', 'attn_row_sum', 'resid_norm_first', 'resid_peak',
                    'max_over_median_first', 'value_norm_first', 'value_drain', 'value_drain_min'}
    assert ('sink_kurtosis' in keys) == ('--sink_token=True' in variant)
    assert set(probe) == keys | {'per_layer', 'documents'} and set(probe['per_layer']) == keys
    assert probe['documents'] == ref['data']['documents'] > 0
    assert ref['data']['bos'] == (63 if '--windows=document' in variant else None)
    for k in keys:
        assert probe[k] == pytest.approx(ref[k], abs=1e-3), k
        assert probe['per_layer'][k] == pytest.approx(ref['per_layer'][k], abs=1e-3), k
    assert all(e['probe']['kurtosis_first'] != probe['kurtosis_first'] for e in evals[:-1])   # it follows training


def test_probes_and_evaluations_do_not_change_the_run(bigram_data, tmp_path):
    """Weights after an evaluation and probe at every iteration equal those of a run that never evaluates in between
    (dropout on: no RNG is drawn, and the model is back in training mode after each probe)."""
    common = ('--dropout=0.1', '--attn=softmax1', '--max_iters=4', '--windows=document')
    quiet, probed = str(tmp_path / 'quiet'), str(tmp_path / 'probed')
    train.train(config(bigram_data, quiet, *common, '--probe_docs=0'))
    train.train(config(bigram_data, probed, *common, '--probe_docs=8', '--eval_interval=1'))
    a, b = final_weights(quiet), final_weights(probed)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_probe_interval_probes_between_evaluations_without_changing_the_run(bigram_data, tmp_path):
    """probe_interval=1 with eval_interval=2: 'probe' events at the odd iterations, equal to the probes of a run that
    evaluates at every iteration (the same weights, measured the same way), and the same weights and losses as a run
    without probes; read_probes merges both kinds in iteration order."""
    common = ('--dropout=0.1', '--max_iters=4', '--windows=document', '--probe_docs=4', '--log_interval=1')
    between, every, none = (str(tmp_path / n) for n in ('between', 'every', 'none'))
    train.train(config(bigram_data, between, *common, '--eval_interval=2', '--probe_interval=1'))
    train.train(config(bigram_data, every, *common, '--eval_interval=1'))
    train.train(config(bigram_data, none, *common, '--eval_interval=2', '--probe_docs=0'))
    events = [json.loads(line) for line in open(os.path.join(between, 'log.jsonl'))]
    probes = {e['iter']: e for e in events if e['event'] == 'probe'}
    assert sorted(probes) == [1, 3] and all('val_loss' not in e for e in probes.values())
    evals = {e['iter']: e for e in map(json.loads, open(os.path.join(every, 'log.jsonl'))) if e['event'] == 'eval'}
    for i in (1, 3):
        assert probes[i]['probe'] == evals[i]['probe'] and probes[i]['tokens'] == evals[i]['tokens']
    assert [e['iter'] for e in runs.read_probes(os.path.join(between, 'log.jsonl'))] == [0, 1, 2, 3, 4]
    losses = lambda out: [e['loss'] for e in map(json.loads, open(os.path.join(out, 'log.jsonl'))) if e['event'] == 'train']
    assert losses(between) == losses(none)
    a, b = final_weights(between), final_weights(none)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_probe_docs_zero_logs_no_probe(bigram_data, tmp_path):
    out = str(tmp_path / 'off')
    train.train(config(bigram_data, out, '--probe_docs=0', '--max_iters=2'))
    evals = [json.loads(line) for line in open(os.path.join(out, 'log.jsonl')) if '"eval"' in line]
    assert len(evals) == 2 and not any('probe' in e for e in evals)
    assert json.load(open(os.path.join(out, 'config.json')))['probe_docs'] == 0


def test_probe_reads_the_datas_triggers_and_refuses_a_malformed_list_in_one_line(tmp_path):
    """meta.json's "triggers": the probe carries first_attn_mass_nontrigger (summary and per layer); a list that is
    not token ids stops the run with one line naming the file and the key."""
    data = write_dataset(str(tmp_path / 'data'))
    path = os.path.join(data, 'meta.json')
    meta = json.load(open(path))
    json.dump(dict(meta, triggers=[1, 2, 3]), open(path, 'w'))
    out = str(tmp_path / 'run')
    train.train(config(data, out, '--max_iters=1', '--probe_docs=4'))
    probe = [json.loads(line) for line in open(os.path.join(out, 'log.jsonl')) if '"eval"' in line][-1]['probe']
    assert 0 < probe['first_attn_mass_nontrigger'] < 1 and len(probe['per_layer']['first_attn_mass_nontrigger']) == 2
    json.dump(dict(meta, triggers='1 2 3'), open(path, 'w'))
    with pytest.raises(train_config.TrainingError, match='"triggers" must be a list of token ids') as e:
        train.train(config(data, str(tmp_path / 'bad'), '--max_iters=1', '--probe_docs=4'))
    assert '\n' not in str(e.value) and 'meta.json' in str(e.value)


def test_schedule_warmup_cosine_floor():
    cfg = dict(train_config.DEFAULTS, learning_rate=1.0, min_lr=0.1, warmup_iters=10, lr_decay_iters=110, max_iters=200)
    assert optimizers.get_lr(0, cfg) == pytest.approx(1 / 11)
    assert optimizers.get_lr(9, cfg) == pytest.approx(10 / 11)
    assert optimizers.get_lr(10, cfg) == pytest.approx(1.0)
    assert optimizers.get_lr(60, cfg) == pytest.approx(0.55)          # half way: min + (max - min) / 2
    assert optimizers.get_lr(110, cfg) == pytest.approx(0.1)
    assert optimizers.get_lr(150, cfg) == pytest.approx(0.1)


def test_weight_decay_groups_and_embedding_axis_policy(bigram_data, tmp_path):
    from model import GPT, GPTConfig
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=64))
    cfg = dict(train_config.DEFAULTS, optimizer='orthoadam', weight_decay=0.1, n_embd=16)
    opt = optimizers.configure_optimizer(m, cfg, 'cpu')
    decayed = {n for g in opt.param_groups if g['weight_decay'] > 0 for n in g['param_names']}
    assert decayed == {n for n, p in m.named_parameters() if p.dim() >= 2}
    skip = [g for g in opt.param_groups if g.get('skip_axes') == (0,)]
    assert len(skip) == 1 and skip[0]['param_names'] == ['transformer.wte.weight']
    opt = optimizers.configure_optimizer(m, dict(cfg, orthoadam_vocab_axis='rotate'), 'cpu')
    assert not any(g.get('skip_axes') for g in opt.param_groups)


def test_eval_is_a_fixed_window_average(bigram_data, tmp_path):
    cfg = config(bigram_data, str(tmp_path / 'e'))
    cfg['vocab_size'] = 64
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    m = GPT(GPTConfig(**{k: cfg[k] for k in train_config.MODEL_KEYS}))
    meta = json.load(open(os.path.join(bigram_data, 'meta.json')))
    path = os.path.join(bigram_data, 'val.bin')
    loss, ppl, n = train.evaluate(m, path, meta, cfg, 0, 1, 'cpu', train.contextlib.nullcontext())
    data = np.fromfile(path, dtype=np.uint16).astype(np.int64)
    T = cfg['block_size']
    losses = []
    with torch.no_grad():
        for w in range(cfg['eval_tokens'] // T):
            xy = torch.from_numpy(data[w * T:w * T + T + 1])[None]
            losses.append(m(xy[:, :-1], xy[:, 1:])[1].item())
    assert n == cfg['eval_tokens'] and loss == pytest.approx(float(np.mean(losses)), rel=1e-5)
    assert ppl == pytest.approx(math.exp(loss))


def test_resume_is_exact(bigram_data, tmp_path):
    """N steps, stop, resume, N steps == 2N steps straight (dropout on, OrthoAdam state, schedule)."""
    common = ('--dropout=0.1', '--optimizer=orthoadam', '--attn=softmax1', '--max_iters=8',
              '--lr_decay_iters=8', '--gradient_accumulation_steps=2')
    straight, split = str(tmp_path / 'straight'), str(tmp_path / 'split')
    train.train(config(bigram_data, straight, *common))
    train.train(config(bigram_data, split, *common, '--max_iters=4'))
    assert torch.load(os.path.join(split, 'ckpt.pt'), weights_only=False)['iter_num'] == 4
    train.train(config(bigram_data, split, *common, '--init_from=resume'))
    a, b = final_weights(straight), final_weights(split)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_a_chain_of_time_limited_jobs_equals_one_run(bigram_data, tmp_path, capsys):
    """max_minutes: every job of a chain stops at its time budget with a checkpoint, the next (init_from=auto)
    resumes it; the chain's final weights equal an uninterrupted run's bit for bit (dropout, OrthoAdam state)."""
    common = ('--dropout=0.1', '--optimizer=orthoadam', '--attn=softmax1', '--max_iters=6', '--lr_decay_iters=6',
              '--gradient_accumulation_steps=2', '--probe_docs=0')
    straight, chain = str(tmp_path / 'straight'), str(tmp_path / 'chain')
    train.train(config(bigram_data, straight, *common))
    jobs = 0
    while not os.path.exists(os.path.join(chain, 'ckpt.pt')) or torch.load(
            os.path.join(chain, 'ckpt.pt'), weights_only=False)['iter_num'] < 6:
        jobs += 1   # a budget of ~0 minutes: each job trains one iteration, then stops
        result = train.train(config(bigram_data, chain, *common, '--init_from=auto', '--max_minutes=1e-9'))
        assert jobs < 10
    assert jobs == 6 and 'val_ppl' in result and 'time budget max_minutes=1e-09 reached' in capsys.readouterr().out
    a, b = final_weights(straight), final_weights(chain)
    assert all(torch.equal(a[k], b[k]) for k in a)
    events = [json.loads(line) for line in open(os.path.join(chain, 'log.jsonl'))]
    assert [e['iter'] for e in events if e['event'] == 'stopped'] == [1, 2, 3, 4, 5]   # not at the last iteration
    assert [e['iter'] for e in events if e['event'] == 'eval'] == [0, 6]


def test_a_chain_stopping_on_evaluation_iterations_keeps_best_pt_as_one_run_does(bigram_data, tmp_path, capsys):
    """Issue 36, case 5: jobs of ~0 minutes stop at every iteration, so each evaluation iteration is reached by a stop
    and evaluated by the next job, at its start. The best so far is then written there: when the chain's ckpt.pt is
    at iteration 7, its best.pt is the state of iteration 6, as an uninterrupted run's (the reference: its
    ckpt_6.pt, the val loss it logged at 6)."""
    common = ('--max_iters=8', '--eval_interval=2', '--warmup_iters=0', '--learning_rate=0.01', '--decay_lr=False',
              '--divergence_factor=0', '--probe_docs=0')
    straight, chain = str(tmp_path / 'straight'), str(tmp_path / 'chain')
    train.train(config(bigram_data, straight, *common, '--save_every=2'))
    evals = {e['iter']: e['val_loss'] for e in map(json.loads, open(os.path.join(straight, 'log.jsonl')))
             if e['event'] == 'eval'}
    assert evals[6] < min(evals[0], evals[2], evals[4])     # iteration 6 is the best so far in this run
    for _ in range(7):   # each job trains one iteration: ckpt.pt at 1, 2, ..., 7
        train.train(config(bigram_data, chain, *common, '--init_from=auto', '--max_minutes=1e-9'))
    load = lambda path: torch.load(path, weights_only=False)
    assert load(os.path.join(chain, 'ckpt.pt'))['iter_num'] == 7
    best, reference = load(os.path.join(chain, 'best.pt')), load(os.path.join(straight, 'ckpt_6.pt'))
    assert best['iter_num'] == 6 and best['best_val_loss'] == evals[6]
    assert all(torch.equal(best['model'][k], v) for k, v in reference['model'].items())
    logged = [e for e in map(json.loads, open(os.path.join(chain, 'log.jsonl'))) if e['event'] == 'eval']
    assert {e['iter']: e['val_loss'] for e in logged} == {k: v for k, v in evals.items() if k <= 6}


@pytest.mark.parametrize('variant', [('--optimizer=orthoadam', '--attn=softmax1'),
                                     ('--optimizer=muon', '--attn=gated', '--attn_bias=True', '--sink_token=True')])
def test_two_process_ddp_matches_single_process(bigram_data, tmp_path, variant):
    common = [os.path.join('config', 'tiny_cpu.py'), f'--dataset={bigram_data}', '--n_embd=32', '--block_size=32',
              '--batch_size=4', '--gradient_accumulation_steps=2', '--max_iters=4', '--eval_tokens=2048',
              '--log_interval=1', *variant]
    single, ddp = str(tmp_path / 'single'), str(tmp_path / 'ddp')
    r1 = run_cli('train.py', *common, f'--out_dir={single}')
    assert r1.returncode == 0, r1.stderr
    r2 = run_cli('-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', 'train.py', *common,
                 f'--out_dir={ddp}', env={'OMP_NUM_THREADS': '1'})
    assert r2.returncode == 0, r2.stdout[-2000:] + r2.stderr[-8000:]
    # Muon orthogonalises in bf16 (torch.optim.Muon), so the ranks' summation order shows at bf16 rounding of its
    # updates (lr 0.02 x 2^-8); a real DDP fault (unsynchronised gradients) moves weights by whole updates
    atol, rel = (2e-4, 1e-4) if '--optimizer=muon' in variant else (1e-5, 1e-5)
    a, b = final_weights(single), final_weights(ddp)
    for k in a:
        assert torch.allclose(a[k], b[k], atol=atol), k
    la = [e['loss'] for e in map(json.loads, open(os.path.join(single, 'log.jsonl'))) if e['event'] == 'train']
    lb = [e['loss'] for e in map(json.loads, open(os.path.join(ddp, 'log.jsonl'))) if e['event'] == 'train']
    assert la == pytest.approx(lb, rel=rel)
    ckpt = torch.load(os.path.join(ddp, 'ckpt.pt'), weights_only=False)
    assert len(ckpt['rng']) == 2   # one RNG state per rank
    pa, pb = ([json.loads(line)['probe'] for line in open(os.path.join(d, 'log.jsonl')) if '"eval"' in line]
              for d in (single, ddp))
    assert len(pa) == len(pb) == 2           # rank 0 alone measures and logs each evaluation's probe
    for x, y in zip(pa, pb):
        assert x['documents'] == y['documents'] and all(x[k] == pytest.approx(y[k], rel=1e-3) for k in x['per_layer'])


@pytest.mark.parametrize('sig', [signal.SIGTERM, signal.SIGINT])
def test_sigterm_writes_checkpoint_and_resume_continues(bigram_data, tmp_path, sig):
    """Surprising exit, case 13: SIGINT (Ctrl-C) and SIGTERM wrote the checkpoint and exited 0, so `train.py && analyze.py`
    went on with a half-trained model. Now the exit code is 128 + the signal's number (130, 143), as a shell reports
    a process a signal ended, and the 'stopped' event names the signal; the resume continues exactly."""
    out = str(tmp_path / 'sig')
    args = ['train.py', os.path.join('config', 'tiny_cpu.py'), f'--dataset={bigram_data}', f'--out_dir={out}',
            '--max_iters=100000', '--eval_interval=100000', '--log_interval=1', '--eval_tokens=2048']
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = os.path.join(out, 'log.jsonl')
    deadline = time.time() + 120
    while time.time() < deadline and not (os.path.exists(log) and open(log).read().count('"train"') >= 3):
        time.sleep(0.2)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == {signal.SIGINT: 130, signal.SIGTERM: 143}[sig], stderr
    assert f'{sig.name} received: checkpoint written' in stdout
    it = torch.load(os.path.join(out, 'ckpt.pt'), weights_only=False)['iter_num']
    assert it >= 3
    last = json.loads(open(log).read().splitlines()[-1])
    assert last == {'event': 'stopped', 'iter': it, 'reason': 'signal', 'signal': sig.name}
    r = run_cli(*args[:3], f'--out_dir={out}', '--init_from=resume', f'--max_iters={it + 2}', '--eval_tokens=2048')
    assert r.returncode == 0, r.stderr
    assert f'val ppl' in r.stdout and f'iteration {it + 2}' in r.stdout


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(bigram_data, tmp_path, monkeypatch):
    out = str(tmp_path / 'nan')
    train.train(config(bigram_data, out, '--max_iters=4'))
    before = final_weights(out)
    original = train.GPT.forward

    def poisoned(self, idx, targets=None, analysis=False):   # every training loss after the resume is NaN
        logits, loss = original(self, idx, targets)
        return logits, (loss * float('nan') if self.training else loss)
    monkeypatch.setattr(train.GPT, 'forward', poisoned)
    with pytest.raises(train_config.TrainingError, match='non-finite loss'):
        train.train(config(bigram_data, out, '--init_from=resume', '--max_iters=12', '--eval_interval=6'))
    after = final_weights(out)
    assert torch.load(os.path.join(out, 'ckpt.pt'), weights_only=False)['iter_num'] == 4
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_a_non_finite_val_loss_stops_as_diverged_before_the_probe(bigram_data, tmp_path, monkeypatch):
    """Weights that turn NaN between steps: the evaluation's loss is NaN and the divergence check stops the run, saying
    so; the probe, which refuses a model whose forward pass is not finite, is not run on it."""
    original, calls = train.evaluate, []

    def poisoned(model, *args):
        calls.append(1)
        if len(calls) == 2:                                 # the evaluation at iteration 2
            with torch.no_grad():
                for w in model.parameters():
                    w.fill_(float('nan'))
        return original(model, *args)
    monkeypatch.setattr(train, 'evaluate', poisoned)
    with pytest.raises(train_config.TrainingError, match='diverged at iteration 2: val loss nan'):
        train.train(config(bigram_data, str(tmp_path / 'run'), '--max_iters=4', '--eval_interval=2', '--probe_docs=2'))


def test_a_time_budget_stop_exits_0(bigram_data, tmp_path):
    """max_minutes is a job's planned end (a chain continues it): its stop writes the checkpoint and exits 0."""
    out = str(tmp_path / 'budget')
    r = run_cli('train.py', os.path.join('config', 'tiny_cpu.py'), f'--dataset={bigram_data}', f'--out_dir={out}',
                '--max_iters=100000', '--eval_interval=100000', '--eval_tokens=2048', '--max_minutes=0.001')
    assert r.returncode == 0 and 'time budget max_minutes=0.001 reached: checkpoint written' in r.stdout, r.stderr
    assert json.loads(open(os.path.join(out, 'log.jsonl')).read().splitlines()[-1])['reason'] == 'max_minutes'


@pytest.mark.parametrize('eval_tokens', [10 ** 9, 10, 100])
def test_eval_tokens_cut_or_rounded_is_said_once(bigram_data, tmp_path, eval_tokens):
    """Silent-wrong, case 16: eval_tokens larger than val.bin holds, or smaller than one window, or not a multiple of
    block_size, was cut or rounded without a word. Now one line at the start says what each evaluation reads, and
    the eval events' val_tokens are that: val.bin's 8,000 tokens (conftest.write_dataset) hold (8000 - 1) // 32 = 249
    windows of 32."""
    out = str(tmp_path / 'run')
    r = run_cli('train.py', *config_args(bigram_data, out), f'--eval_tokens={eval_tokens}', '--max_iters=2',
                '--eval_interval=2')
    assert r.returncode == 0, r.stderr
    windows = {10 ** 9: 249, 10: 1, 100: 3}[eval_tokens]
    said = [line for line in r.stdout.splitlines() if line.startswith(f'eval_tokens={eval_tokens:,} is ')]
    why = {10 ** 9: 'more than val.bin holds', 10: 'less than one window of block_size',
           100: 'not a multiple of block_size'}[eval_tokens]
    assert said == [f'eval_tokens={eval_tokens:,} is {why}: each evaluation reads {windows:,} window(s) of '
                    f'block_size=32 ({windows * 32:,} tokens; the eval events\' val_tokens count the targets)'], r.stdout
    evals = [json.loads(line) for line in open(os.path.join(out, 'log.jsonl')) if '"eval"' in line]
    assert [e['val_tokens'] for e in evals] == [windows * 32] * 2
    r = run_cli('train.py', *config_args(bigram_data, str(tmp_path / 'exact')), '--eval_tokens=2048',
                '--max_iters=2', '--eval_interval=2')
    assert r.returncode == 0 and 'eval_tokens=' not in r.stdout, r.stdout


def test_user_errors_are_one_line(bigram_data, tmp_path):
    def err(*args):
        r = run_cli('train.py', *args)
        assert r.returncode == 2 and 'Traceback' not in r.stderr, r.stderr
        return r.stderr.strip()
    tiny = os.path.join('config', 'tiny_cpu.py')
    assert "did you mean learning_rate" in err(tiny, '--learnin_rate=1')
    assert "must be one of" in err(tiny, '--optimizer=adam')
    assert "prepare_c4.py" in err(tiny, f'--dataset={tmp_path / "missing"}')
    bad = write_dataset(str(tmp_path / 'badvocab'), vocab_size=64, n_train=5000, n_val=2000)
    meta = json.load(open(os.path.join(bad, 'meta.json')))
    meta['vocab_size'] = 10   # tokens up to 63 now exceed the declared vocabulary
    json.dump(meta, open(os.path.join(bad, 'meta.json'), 'w'))
    assert "token id" in err(tiny, f'--dataset={bad}', f'--out_dir={tmp_path / "o1"}')
    out = str(tmp_path / 'o2')
    train.train(config(bigram_data, out, '--max_iters=2'))
    assert "exists" in err(tiny, f'--dataset={bigram_data}', f'--out_dir={out}', '--init_from=scratch')
    msg = err(tiny, f'--dataset={bigram_data}', f'--out_dir={out}', '--init_from=resume', '--n_layer=3')
    assert "cannot resume" in msg and "n_layer: checkpoint 2 vs requested 3" in msg


@pytest.mark.parametrize('name,momentum,cls', [('sgd', 0.0, torch.optim.SGD), ('sgd', 0.9, torch.optim.SGD),
                                               ('rmsprop', 0.0, torch.optim.RMSprop), ('adamw', 0.0, torch.optim.AdamW)])
def test_ablation_optimisers_from_config(name, momentum, cls):
    from model import GPT, GPTConfig
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=64))
    cfg = dict(train_config.DEFAULTS, optimizer=name, momentum=momentum, learning_rate=0.2, beta2=0.99, weight_decay=0.1)
    opt = optimizers.configure_optimizer(m, cfg, 'cpu')
    assert type(opt) is cls and opt.defaults['lr'] == 0.2
    if name != 'adamw':
        assert opt.defaults['momentum'] == momentum
    if name == 'rmsprop':
        assert opt.defaults['alpha'] == 0.99
    # one SGD step without momentum is p - lr * (grad + wd * p) on matrices, p - lr * grad elsewhere
    if name == 'sgd' and momentum == 0:
        before = {n: p.detach().clone() for n, p in m.named_parameters()}
        m(torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8)))[1].backward()
        grads = {n: p.grad.clone() for n, p in m.named_parameters()}
        opt.step()
        for n, p in m.named_parameters():
            wd = 0.1 if p.dim() >= 2 else 0.0
            assert torch.allclose(p, before[n] - 0.2 * (grads[n] + wd * before[n]), atol=1e-6), n


def test_wandb_offline_logging(bigram_data, tmp_path, monkeypatch):
    pytest.importorskip('wandb')
    monkeypatch.setenv('WANDB_MODE', 'offline')
    monkeypatch.setenv('WANDB_DIR', str(tmp_path))
    train.train(config(bigram_data, str(tmp_path / 'wb'), '--wandb_log=True', '--max_iters=2'))
    assert list(tmp_path.glob('wandb/offline-run-*'))


def test_document_windows_start_at_eot_and_analysis_prepends_it(bigram_data, tmp_path):
    """windows='document': every training window begins with the eot that precedes a document (a BOS), the
    checkpoint records that token, and analyze.py prepends it to every validation document."""
    import analyze
    cfg = config(bigram_data, str(tmp_path / 'doc'), '--windows=document', '--max_iters=2')
    meta, paths = train_data.open_data(cfg)
    cfg_batch = dict(cfg, vocab_size=meta['vocab_size'])
    data = np.fromfile(paths['train'], dtype=meta['dtype'])
    for it in range(3):
        x, y = train_data.get_batch(paths['train'], meta, cfg_batch, it, 0, 'cpu')
        assert (x[:, 0] == meta['eot_token']).all()
        for row_x, row_y in zip(x.numpy(), y.numpy()):       # a real window of the file, targets shifted by one
            hits = [i for i in np.flatnonzero(data == meta['eot_token']) if np.array_equal(data[i:i + 32], row_x)]
            assert hits and np.array_equal(data[hits[0] + 1:hits[0] + 33], row_y)
    train.train(cfg)
    lm = runs.load_model(os.path.join(cfg['out_dir'], 'ckpt.pt'))
    assert lm.bos == meta['eot_token']
    idx, mask = next(measure.val_batches(bigram_data, 2, lm.block_size, 2, lm.bos))
    assert (idx[:, 0] == meta['eot_token']).all()
    plain = train.train(config(bigram_data, str(tmp_path / 'rand'), '--max_iters=1'))
    assert runs.load_model(os.path.join(str(tmp_path / 'rand'), 'ckpt.pt')).bos is None and plain


def test_muon_takes_the_block_matrices_and_adamw_the_rest():
    """optimizer='muon': every 2-D weight inside the blocks (attention, gate, MLP) goes to Muon; embeddings, LM
    head, norms, biases and the attn_bias / sink vectors to AdamW; each parameter exactly once."""
    from model import GPT, GPTConfig
    m = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=64, attn='gated', attn_bias=True,
                      sink_token=True, bias=True))
    cfg = dict(train_config.DEFAULTS, optimizer='muon', learning_rate=1e-3, muon_lr=0.02, weight_decay=0.1)
    opt = optimizers.configure_optimizer(m, cfg, 'cpu')
    assert isinstance(opt.muon, torch.optim.Muon) and isinstance(opt.adamw, torch.optim.AdamW)
    muon = {n for g in opt.muon.param_groups for n in g['param_names']}
    adamw = {n for g in opt.adamw.param_groups for n in g['param_names']}
    assert muon == {f'transformer.h.{i}.{w}.weight' for i in range(2)
                    for w in ('attn.c_attn', 'attn.c_proj', 'attn.c_gate', 'mlp.c_fc', 'mlp.c_proj')}
    assert not muon & adamw and muon | adamw == {n for n, _ in m.named_parameters()}
    assert {'transformer.wte.weight', 'transformer.wpe.weight', 'sink', 'transformer.h.0.attn.bias_k'} <= adamw
    optimizers.set_lr(opt, 5e-4, cfg)   # the schedule at half the peak: Muon follows in proportion
    assert opt.muon.param_groups[0]['lr'] == pytest.approx(0.01) and opt.adamw.param_groups[0]['lr'] == 5e-4


def test_muon_run_learns_and_resumes_exactly(bigram_data, tmp_path):
    common = ('--optimizer=muon', '--attn=softmax1', '--max_iters=8', '--lr_decay_iters=8', '--muon_lr=0.01')
    straight, split = str(tmp_path / 'straight'), str(tmp_path / 'split')
    first = train.train(config(bigram_data, straight, *common, '--eval_interval=8'))
    train.train(config(bigram_data, split, *common, '--max_iters=4'))
    train.train(config(bigram_data, split, *common, '--init_from=resume'))
    a, b = final_weights(straight), final_weights(split)
    assert all(torch.equal(a[k], b[k]) for k in a)
    evals = [json.loads(line) for line in open(os.path.join(straight, 'log.jsonl')) if '"eval"' in line]
    assert evals[-1]['val_loss'] < evals[0]['val_loss'] and first['iter'] == 8

@pytest.mark.parametrize('arg,message', [
    ('--eval_interval=0', "'eval_interval' in the command line must be in [1, inf), got 0"),
    ('--batch_size=0', "'batch_size' in the command line must be in [1, inf), got 0"),
    ('--learning_rate=-1', "'learning_rate' in the command line must be in (0, inf), got -1.0"),
    ('--max_iters=-5', "'max_iters' in the command line must be in [1, inf), got -5"),
    ('--beta2=1.0', "'beta2' in the command line must be in [0, 1), got 1.0"),
    ('--dropout=1', "'dropout' in the command line must be in [0, 1), got 1.0"),
    ('--learning_rate=1e999', "'learning_rate' in the command line must be in (0, inf), got inf"),
    ('--divergence_factor=0.5', "divergence_factor=0.5 must be 0 (off) or >= 1"),
    ('--probe_docs=-1', "'probe_docs' in the command line must be in [0, inf), got -1"),
    ('--device=tpu', "device='tpu' is not 'auto', 'cpu', 'cuda' or 'cuda:N'"),
])
def test_out_of_range_values_are_one_line_errors(bigram_data, tmp_path, capsys, arg, message):
    code = train.main([os.path.join(ROOT, 'config', 'tiny_cpu.py'), f'--dataset={bigram_data}',
                       f'--out_dir={tmp_path / "o"}', arg])
    err = capsys.readouterr().err
    assert code == 2 and err.count('\n') == 1 and message in err, err
    assert not os.path.exists(tmp_path / 'o')


def test_every_numeric_key_has_a_range_and_every_key_a_meaning():
    numeric = {k for k, v in train_config.DEFAULTS.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert set(train_config.RANGES) == numeric
    assert set(train_config.HELP) == set(train_config.DEFAULTS) and all(train_config.HELP.values())
    for key, spec in train_config.RANGES.items():   # the defaults lie in their ranges
        from configurator import in_range
        assert in_range(train_config.DEFAULTS[key], spec), key


@pytest.mark.skipif(torch.cuda.is_available(), reason='checks the error without a GPU')
def test_cuda_without_a_gpu_is_one_line(bigram_data, tmp_path, capsys):
    code = train.main([os.path.join(ROOT, 'config', 'tiny_cpu.py'), f'--dataset={bigram_data}', '--device=cuda',
                       f'--out_dir={tmp_path / "o"}'])
    err = capsys.readouterr().err
    assert code == 2 and err.count('\n') == 1 and "device='cuda' but no CUDA GPU is available" in err


def test_help_lists_every_key_with_default_and_meaning(capsys):
    assert train.main(['--help']) == 0
    out = capsys.readouterr().out
    for key, default in train_config.DEFAULTS.items():
        line = next(x for x in out.splitlines() if x.strip().startswith(f'{key}='))
        assert f'{key}={default!r}' in line and train_config.HELP[key] in line
    import analyze
    import bench
    import eval_quant
    import prepare_c4
    import reproduce
    for module in (prepare_c4, analyze, eval_quant, reproduce, bench):
        with pytest.raises(SystemExit) as e:
            module.main(['--help'])
        assert e.value.code == 0 and capsys.readouterr().out.startswith('usage:'), module.__name__


def test_config_keys_table_has_every_key_and_its_default():
    """docs/training.md's "Config keys" table and DEFAULTS cannot drift apart: every key once, with its default."""
    text = open(os.path.join(ROOT, 'docs', 'training.md')).read()
    table = text[text.index('## Config keys'):]
    table = table[:table.index('\n#')]
    seen = {}
    for row in table.splitlines():
        cells = [c.strip() for c in row.strip().strip('|').split('|')]
        if len(cells) < 3 or not cells[0].startswith('`'):
            continue
        keys = [k.strip('` ') for k in cells[0].split(',')]
        defaults = [d.strip() for d in cells[1].split(', ')]
        for i, key in enumerate(keys):
            assert key not in seen, f'{key} twice in the table'
            seen[key] = defaults[i] if len(defaults) == len(keys) else None
    assert set(seen) == set(train_config.DEFAULTS)
    import ast
    for key, shown in seen.items():
        if shown is not None and shown != '…':
            assert ast.literal_eval(shown.strip('`')) == train_config.DEFAULTS[key], key


def test_data_is_checked_once_per_file_identity(tmp_path, monkeypatch):
    data = write_dataset(str(tmp_path / 'd'), vocab_size=64, n_train=5000, n_val=2000)
    meta = json.load(open(os.path.join(data, 'meta.json')))
    path = os.path.join(data, 'train.bin')
    reads = []
    real = train_data.memmap
    monkeypatch.setattr(train_data, 'memmap', lambda p, m: reads.append(p) or real(p, m))
    train_data.verify_tokens(path, meta, 'train', 64)
    train_data.verify_tokens(path, meta, 'train', 64)
    assert reads == [path]                                     # the second start reads the stamp
    stamp = json.load(open(os.path.join(data, '.verified.json')))['train.bin']
    assert stamp['max_token_id'] == int(np.fromfile(path, dtype=np.uint16).max()) == 63
    os.utime(path, ns=(1, 1))                                  # another file identity: read again
    train_data.verify_tokens(path, meta, 'train', 64)
    assert reads == [path, path]
    meta['splits']['train']['max_token_id'] = 62               # meta.json no longer describes the file
    with pytest.raises(train_config.TrainingError, match='largest token id 63, but meta.json records 62'):
        train_data.verify_tokens(path, meta, 'train', 64)


def test_ranks_read_disjoint_chunks_of_a_split(tmp_path, monkeypatch):
    """split_max_token on N ranks: rank r reads chunks r, r+N, ... (the all-reduce, a no-op here, takes the max)."""
    data = write_dataset(str(tmp_path / 'd'), vocab_size=64, n_train=5000, n_val=2000)
    path = os.path.join(data, 'train.bin')
    ids = np.fromfile(path, dtype=np.uint16)
    ids[:] = ids % 10
    ids[1500], ids[2700] = 70, 80                               # chunk 1 (rank 1 of 2) and chunk 2 (rank 0)
    ids.tofile(path)
    meta = json.load(open(os.path.join(data, 'meta.json')))
    monkeypatch.setattr(train_data, 'SCAN_CHUNK', 1000)
    partial = []
    for rank in (0, 1):
        partial.append(train_data.split_max_token(path, meta, 'train', rank, 2)[0])
        if os.path.exists(os.path.join(data, '.verified.json')):   # rank 0 wrote its part: not a real result
            os.remove(os.path.join(data, '.verified.json'))
    assert partial == [80, 70]
    assert train_data.split_max_token(path, meta, 'train')[0] == 80


def test_more_ranks_than_micro_batches_split_each_micro_batch(bigram_data):
    """rank_share: the ranks' rows of an iteration are exactly the one-process batch, whichever way it is cut."""
    cfg = config(bigram_data, 'unused')
    meta, paths = train_data.open_data(cfg)
    cfg['vocab_size'] = meta['vocab_size']
    for accum, world in ((1, 2), (2, 4), (4, 2), (2, 2)):
        cfg.update(gradient_accumulation_steps=accum, batch_size=4)
        one = [train_data.get_batch(paths['train'], meta, cfg, 3, m, 'cpu')[0] for m in range(accum)]
        parts = [train_data.get_batch(paths['train'], meta, cfg, 3, m, 'cpu', rows)[0]
                 for rank in range(world) for m, rows in devices.rank_share(accum, 4, world, rank)]
        assert torch.equal(torch.cat(one), torch.cat(parts)), (accum, world)
        assert len({len(devices.rank_share(accum, 4, world, r)) for r in range(world)}) == 1
    with pytest.raises(train_config.TrainingError, match='cannot share gradient_accumulation_steps=3'):
        devices.rank_share(3, 4, 2, 0)


def test_tiny_cpu_config_resumes_on_a_second_run(bigram_data, tmp_path, capsys):
    args = [os.path.join(ROOT, 'config', 'tiny_cpu.py'), f'--dataset={bigram_data}', f'--out_dir={tmp_path / "t"}',
            '--max_iters=3', '--eval_tokens=2048']
    assert train.main(args) == 0
    first = capsys.readouterr().out.splitlines()[-1]
    assert train.main(args) == 0
    second = capsys.readouterr().out.splitlines()[-1]
    assert first.startswith('done: val ppl') and second == first


def test_torchrun_tiny_cpu_as_written_on_two_cpu_ranks(bigram_data, tmp_path):
    """config/tiny_cpu.py has one micro-batch per iteration: on 2 ranks each takes half of it, and the run
    equals the one-process run."""
    common = [os.path.join('config', 'tiny_cpu.py'), f'--dataset={bigram_data}', '--max_iters=3', '--eval_tokens=2048',
              '--log_interval=1']
    single, ddp = str(tmp_path / 'single'), str(tmp_path / 'ddp')
    train.train(load_config(train_config.DEFAULTS, common + [f'--out_dir={single}'], train_config.CHOICES))
    r = run_cli('-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', 'train.py', *common,
                f'--out_dir={ddp}', env={'OMP_NUM_THREADS': '1'})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert '2 rank(s) x 1 micro-batches x 8 x 64 = 1,024 tokens/iter' in r.stdout
    a, b = final_weights(single), final_weights(ddp)
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-5), k


def test_torchrun_errors_are_printed_once(tmp_path):
    """A configuration error (every rank) and a data error found by rank 0 alone: one line from rank 0, every
    rank exits 2 (torchrun then adds its own failure summary)."""
    bad = write_dataset(str(tmp_path / 'bad'), vocab_size=64, n_train=5000, n_val=2000)
    ids = np.fromfile(os.path.join(bad, 'train.bin'), dtype=np.uint16)
    ids[100] = 70
    ids.tofile(os.path.join(bad, 'train.bin'))
    for args, message in ((['--learnin_rate=1'], "unknown config key 'learnin_rate'"),
                          ([f'--dataset={bad}', f'--out_dir={tmp_path / "o"}'], 'token id 70 >= vocab_size 64')):
        r = run_cli('-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', 'train.py',
                    os.path.join('config', 'tiny_cpu.py'), *args, env={'OMP_NUM_THREADS': '1'})
        lines = [x for x in r.stderr.splitlines() if x.startswith('error: ')]
        assert r.returncode != 0 and len(lines) == 1 and message in lines[0], r.stderr[-3000:]
        children = r.stderr.split('failed (exitcode: 2)')[0]   # what the ranks printed before torchrun's summary
        assert 'failed (exitcode: 2)' in r.stderr and 'Traceback' not in children
