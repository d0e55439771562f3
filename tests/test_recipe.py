"""The sink recipe of issue 27 (harness/recipe.py) and how reproduce.py runs it: every gpu-scale row gets it, weight decay
reaches matrices only, a row trains as a chain of jobs that equals one run and refuses changed data in one line,
a diverged row is reported under the table, a row's results pack into one tarball within the size limit, and the
goal checker judges synthetic result files."""
import json
import os
import tarfile

import pytest
import torch

from harness import recipe, sweep_report
import reproduce
from conftest import full_disk_writes, write_dataset
from harness.optimizers import configure_optimizer
from harness.train_config import DEFAULTS
from model import GPT, GPTConfig

pytestmark = pytest.mark.usefixtures('one_thread')


def test_gpu_scale_applies_the_recipe_to_every_row_and_pilots_keep_their_levers(tmp_path):
    s = reproduce.SCALES['gpu']
    runs = reproduce.plan(['table2', 'table3', 'table5', 'table6', 'mitigations'], s, str(tmp_path))
    assert len(runs) > 30 and {r.cfg['optimizer'] for r in runs} >= {'adamw', 'orthoadam', 'sgd', 'rmsprop'}
    for run in runs:
        c = run.cfg
        paper = reproduce.resolve(run.config, [])
        wd = 0.5 if c['optimizer'] in ('adamw', 'orthoadam', 'muon') else 0.0   # SGD, RMSProp: coupled L2, kept off
        assert (c['windows'], c['weight_decay'], c['learning_rate'], c['min_lr']) == (
            'document', wd, paper['learning_rate'], paper['min_lr'])
        assert c['batch_size'] * c['gradient_accumulation_steps'] * c['block_size'] == recipe.TOKENS_PER_STEP
    pilots = {r.config: r.cfg for r in reproduce.plan(['pilots'], s, str(tmp_path))}
    assert {(c['windows'], c['weight_decay']) for c in pilots.values()} == {
        (w, d) for w in ('random', 'document') for d in (0.1, 0.5)}
    assert pilots['pilots/bos1_wd05']['windows'] == 'document' and pilots['pilots/bos0_wd01']['weight_decay'] == 0.1
    for c in pilots.values():   # vanilla 60M otherwise, probed 25 times (between two evaluations and the last)
        assert (c['n_layer'], c['n_embd'], c['attn'], c['optimizer']) == (10, 512, 'softmax', 'adamw')
        assert c['learning_rate'] == 1e-3 and c['max_iters'] // c['probe_interval'] == 25 and c['probe_docs'] == 32
        assert c['max_iters'] // c['eval_interval'] == 2
    mini = {r.config: r.cfg for r in reproduce.plan(['pilots'], reproduce.SCALES['mini'], str(tmp_path))}
    assert {(c['windows'], c['weight_decay']) for c in mini.values()} == set(
        (c['windows'], c['weight_decay']) for c in pilots.values())   # the mini scale's windows do not override


def test_weight_decay_shrinks_matrices_and_never_norm_gains_biases():
    """One AdamW step with zero gradients (lr 0.1, wd 0.5): a decayed parameter is multiplied by 1 - lr * wd, a
    parameter without decay is unchanged. Every >= 2-D parameter decays (matrices and embeddings, as nanoGPT),
    no 1-D parameter (LayerNorm gains and biases)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=64, bias=True))
    cfg = dict(DEFAULTS, learning_rate=0.1, weight_decay=0.5, optimizer='adamw')
    opt = configure_optimizer(model, cfg, 'cpu')
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    decayed = {n for n, p in model.named_parameters() if torch.allclose(p, before[n] * 0.95, atol=1e-7)
               and not torch.equal(p, before[n])}
    kept = {n for n, p in model.named_parameters() if torch.equal(p, before[n])}
    assert decayed | kept == set(before) and not decayed & kept
    assert decayed == {n for n, p in model.named_parameters() if p.dim() >= 2}
    assert any('ln' in n and n.endswith('weight') for n in kept) and any(n.endswith('bias') for n in kept)


def test_run_state_reads_finished_stopped_and_diverged(tmp_path):
    def state(*events):
        d = tmp_path / str(len(list(tmp_path.iterdir())))
        d.mkdir()
        (d / 'log.jsonl').write_text(''.join(json.dumps(e) + '\n' for e in events) + '{"event": "tra')   # a cut line
        return recipe.run_state(str(d), 10)

    assert recipe.run_state(str(tmp_path / 'none'), 10) == {'state': 'none', 'iter': 0}
    assert state({'event': 'eval', 'iter': 0}, {'event': 'train', 'iter': 3}, {'event': 'stopped', 'iter': 3}) == {
        'state': 'stopped', 'iter': 3}
    assert state({'event': 'eval', 'iter': 0}, {'event': 'train', 'iter': 3})['state'] == 'started'
    assert state({'event': 'stopped', 'iter': 3}, {'event': 'eval', 'iter': 10})['state'] == 'finished'
    d = state({'event': 'eval', 'iter': 5}, {'event': 'diverged', 'iter': 5, 'val_loss': 9.0})
    assert d['state'] == 'diverged' and d['event']['val_loss'] == 9.0


def _run_dir(tmp_path, log_bytes=100):
    d = tmp_path / 'runs' / 'table2-gpt2_60m_vanilla'
    d.mkdir(parents=True)
    (d / 'analysis.json').write_text('{"ppl": 6.0}')
    (d / 'log.jsonl').write_bytes(os.urandom(log_bytes))    # incompressible: the pack's size is the file's
    (d / 'ckpt.pt').write_bytes(b'weights, never packed')
    (d / 'trajectories.png').write_bytes(b'\x89PNG fake')
    return d


def test_pack_holds_the_results_and_not_the_checkpoint(tmp_path):
    d = _run_dir(tmp_path)
    extra = tmp_path / 'table2.md'
    extra.write_text('| table |')
    dest, size, names = recipe.pack_run(str(d), str(tmp_path / 'pack' / 'row.tar.gz'), [str(extra)])
    assert size == os.path.getsize(dest) and size <= recipe.PACK_LIMIT
    with tarfile.open(dest) as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    row = 'table2-gpt2_60m_vanilla'
    assert set(got) == set(names) == {f'{row}/analysis.json', f'{row}/log.jsonl', f'{row}/trajectories.png',
                                      f'{row}/table2.md'}
    assert got[f'{row}/log.jsonl'] == (d / 'log.jsonl').read_bytes() and got[f'{row}/table2.md'] == b'| table |'


def test_pack_over_the_limit_is_refused_and_the_old_pack_kept(tmp_path):
    d = _run_dir(tmp_path, log_bytes=20_000)
    dest = tmp_path / 'row.tar.gz'
    dest.write_bytes(b'an earlier pack')
    with pytest.raises(ValueError) as e:
        recipe.pack_run(str(d), str(dest), limit=10_000)
    assert '> 0 MiB' in str(e.value) or 'MiB >' in str(e.value)
    assert 'log.jsonl' in str(e.value) and '\n' not in str(e.value)
    assert dest.read_bytes() == b'an earlier pack' and not [p for p in tmp_path.iterdir() if p.name.startswith('.pack')]
    recipe.pack_run(str(d), str(dest), limit=30_000)   # under a limit just above it: packed
    with pytest.raises(ValueError, match='holds no analysis.json or log.jsonl'):
        recipe.pack_run(str(tmp_path / 'empty'), str(tmp_path / 'x.tar.gz'))


def test_pack_on_a_full_disk_is_one_line_and_leaves_no_part(tmp_path, monkeypatch):
    """Found attacking --pack (issue 36): a full disk left the part of the pack that was written as a .pack.* file
    for good. Now: one line, the earlier pack kept, nothing else in the folder."""
    d = _run_dir(tmp_path)
    dest = tmp_path / 'packs' / 'row.tar.gz'
    dest.parent.mkdir()
    dest.write_bytes(b'an earlier pack')
    full_disk_writes(recipe, monkeypatch)
    with pytest.raises(ValueError) as e:
        recipe.pack_run(str(d), str(dest))
    assert 'is full' in str(e.value) and '\n' not in str(e.value)
    assert os.listdir(dest.parent) == ['row.tar.gz'] and dest.read_bytes() == b'an earlier pack'


GOOD_V = {'ppl': 30.0, 'kurtosis_first': 120.0, 'kurtosis_rest': 40.0, 'first_attn_argmax': 0.41}
GOOD_S = {'ppl': 30.3, 'kurtosis_first': 3.2, 'kurtosis_rest': 3.1, 'first_attn_argmax': 0.02}
GOOD_QV = {'delta': {'coarse': 2.0, 'zeropoint4': 8.0}}
GOOD_QS = {'delta': {'coarse': 0.1, 'zeropoint4': 0.5}}


@pytest.mark.parametrize('change, failing', [
    ((), None),
    (('v', 'first_attn_argmax', 0.063), 'vanilla first_attn_argmax'),   # the H100 miniature of the README
    (('v', 'kurtosis_first', 49.9), 'vanilla E_m kurtosis first'),
    (('s', 'first_attn_argmax', 0.051), 's1+OA first_attn_argmax'),
    (('s', 'kurtosis_rest', 7.0), 's1+OA E_m kurtosis'),
    (('s', 'ppl', 30.0 * 1.021), 's1+OA PPL within 2%'),
    (('qs', 'coarse', 0.41), 'coarse dPPL'),                           # 2.0 / 0.41 < 5
    (('qv', 'zeropoint4', 2.4), 'zeropoint4 dPPL'),                    # 2.4 / 0.5 < 5
])
def test_goal_checker_fails_exactly_the_criterion_that_is_missed(change, failing):
    parts = {'v': dict(GOOD_V), 's': dict(GOOD_S), 'qv': json.loads(json.dumps(GOOD_QV)),
             'qs': json.loads(json.dumps(GOOD_QS))}
    if change:
        part, key, value = change
        (parts[part]['delta'] if part.startswith('q') else parts[part])[key] = value
    results = recipe.check_goal(parts['v'], parts['s'], parts['qv'], parts['qs'])
    assert len(results) == 7
    failed = [name for name, _, ok in results if not ok]
    assert failed == ([] if failing is None else [n for n in failed if n.startswith(failing)])
    assert len(failed) == (0 if failing is None else 1)
    lines, verdict = recipe.goal_text(results)
    assert verdict is (failing is None) and lines[-1].endswith('met')


def test_goal_checker_on_missing_values_and_a_zero_penalty():
    results = recipe.check_goal({'ppl': 30.0}, GOOD_S)
    assert [ok for _, _, ok in results] == [None, None, True, True, True]   # no quantisation criteria asked for
    lines, verdict = recipe.goal_text(results)
    assert not verdict and lines[0].startswith('MISSING: vanilla first_attn_argmax')
    q = recipe.check_goal(GOOD_V, GOOD_S, GOOD_QV, {'delta': {'coarse': -0.02, 'zeropoint4': 0.0}})
    assert q[-2][1] == pytest.approx(2.0 / recipe.GOAL_FLOOR) and q[-1][2] is True


@pytest.fixture(scope='module')
def small(tmp_path_factory):
    return write_dataset(str(tmp_path_factory.mktemp('data') / 'small'), n_train=20_000, n_val=4_000)


@pytest.mark.slow   # trainings through reproduce.py
def test_a_chained_row_equals_one_job_refuses_changed_data_and_a_divergence_is_reported(small, tmp_path, capsys):
    """reproduce.execute with job_minutes ~0 and max_jobs 1: each call trains one iteration and says the row is
    unfinished; the finished chain's weights equal a one-job row's. A row whose data changed between jobs is
    refused with train.py's one line naming the change. A diverged row stays in the table with a note."""
    scale = reproduce.SCALES['smoke']

    def row(out):
        (run,) = reproduce.plan(['table2'], scale, str(out), ['gpt2_60m_vanilla'], small)
        return run

    one, chained = row(tmp_path / 'one'), row(tmp_path / 'chain')
    env = dict(os.environ, OMP_NUM_THREADS='1')
    assert reproduce.execute(one, scale, 1, env, False) == 'done'
    calls = 0
    while reproduce.execute(chained, scale, 1, env, False, reproduce.Chain(1e-9, 1)) == 'unfinished':
        calls += 1
        assert calls < 8
    assert calls == chained.cfg['max_iters'] - 1   # one iteration per job; the last job also evaluates and measures
    a, b = (torch.load(os.path.join(r.cfg['out_dir'], 'ckpt.pt'), weights_only=False)['model'] for r in (one, chained))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert json.load(open(os.path.join(one.cfg['out_dir'], 'analysis.json')))['ppl'] == json.load(
        open(os.path.join(chained.cfg['out_dir'], 'analysis.json')))['ppl']

    data = tmp_path / 'data'
    write_dataset(str(data), n_train=20_000, n_val=4_000)
    (changed,) = reproduce.plan(['table2'], scale, str(tmp_path / 'changed'), ['gpt2_60m_vanilla'], str(data))
    assert reproduce.execute(changed, scale, 1, env, False, reproduce.Chain(1e-9, 1)) == 'unfinished'
    write_dataset(str(data), n_train=20_001, n_val=4_000, seed=1)   # the same name, other tokens
    with pytest.raises(reproduce.SweepError) as e:
        reproduce.execute(changed, scale, 1, env, False, reproduce.Chain(1e-9, 1))
    message = str(e.value)
    assert 'cannot resume' in message and 'train_tokens 20000 -> 20001' in message and '\n' not in message

    with open(os.path.join(chained.cfg['out_dir'], 'log.jsonl'), 'a') as f:   # as train.py logs a divergence
        f.write(json.dumps({'event': 'diverged', 'iter': 3, 'val_loss': 50.0, 'best_val_loss': 4.0,
                            'divergence_factor': 10.0}) + '\n')
    with open(os.path.join(one.cfg['out_dir'], 'analysis.json'), 'w') as f:
        f.write('{"ppl": 1')   # cut short
    md, doc = sweep_report.render('table2', [chained], 'smoke', scale)
    assert 'config/table2/gpt2_60m_vanilla.py DIVERGED at iteration 3 (val loss 50 > best 4.0000' in md
    assert doc['rows'][0]['state'] == 'diverged'
    md, doc = sweep_report.render('table2', [one], 'smoke', scale)
    assert f"{os.path.join(one.cfg['out_dir'], 'analysis.json')} cannot be read" in capsys.readouterr().err
    assert doc['rows'][0]['ours']['ppl'] is None and doc['rows'][0]['state'] == 'finished'


@pytest.mark.parametrize('code, name', [(130, 'SIGINT'), (143, 'SIGTERM'), (-15, 'SIGTERM'), (-9, 'SIGKILL'),
                                        (0, None), (1, None), (2, None), (128, None), (None, None), (300, None)])
def test_stopped_by_reads_the_exit_code_of_a_signal(code, name):
    """128 + N: a process that stopped on signal N (train.py after its checkpoint, as shells report it); -N: one a
    signal killed (subprocess's convention). SIGINT = 2, SIGTERM = 15, SIGKILL = 9 on POSIX."""
    from harness.recipe import stopped_by
    assert (stopped_by(code).name if stopped_by(code) else None) == name


LAPTOP_V = {'ppl': 3.0, 'first_attn_argmax': 0.06, 'first_attn_mass': 0.04, 'resid_peak': 1.6, 'kurtosis_first': 25.0}
LAPTOP_S = {'ppl': 3.05, 'first_attn_mass': 0.04, 'resid_peak': 1.2, 'kurtosis_first': 3.5}


@pytest.mark.parametrize('change, failing', [
    (None, None), (('v', 'kurtosis_first', 19.0), 'vanilla E_m kurtosis'), (('s', 'kurtosis_first', 5.5),
                                                                              's1+OA E_m kurtosis'),
    (('s', 'ppl', 3.07), 's1+OA PPL'), (('v', 'ppl', None), 's1+OA PPL')])
def test_laptop_goal_fails_exactly_the_criterion_that_is_missed(change, failing):
    """The laptop scale's goal, criterion by criterion at its thresholds (3.07 / 3.0 = 1.0233 > 1.02); no sink and no
    quantisation penalty required (the vanilla row here has neither), only shown."""
    v, s = dict(LAPTOP_V), dict(LAPTOP_S)
    if change:
        ({'v': v, 's': s}[change[0]])[change[1]] = change[2]
    results = recipe.check_laptop_goal(v, s, {'delta': {'coarse': 0.0}}, {'delta': {'coarse': 0.0}})
    failed = [name for name, _, ok in results if not ok]
    assert len(results) == 3 and failed == ([] if failing is None else [n for n in failed if n.startswith(failing)])
    assert len(failed) == (0 if failing is None else 1)
    lines, verdict = recipe.goal_text(results, 'laptop goal')
    assert verdict is (failing is None) and lines[-1].startswith('laptop goal: ')
    shown = recipe.laptop_measures(v, s, {'delta': {'coarse': 0.5}}, None)
    assert [(n.split(' ')[0], a, b) for n, a, b in shown] == [
        ('first_attn_argmax', 0.06, None), ('first_attn_mass', 0.04, 0.04), ('resid_peak', 1.6, 1.2),
        ('coarse', 0.5, None), ('zeropoint4', None, None)]


def test_laptop_scale_trains_config_laptop_base_for_each_60m_row_and_bb_as_written(tmp_path):
    """Table 2's vanilla 60M row at the laptop scale is config/laptop/base.py as train.py resolves it (its out_dir
    aside); the softmax-1 + OrthoAdam row is the same but for its attention and optimizer; the Bigram-Backcopy rows
    are their config files as written; rows of other sizes are left out."""
    runs = {r.config: r for r in reproduce.plan(['table2', 'bb', 'bb_pilots'], reproduce.SCALES['laptop'],
                                                str(tmp_path))}
    assert sorted(c for c in runs if c.startswith('table2/')) == [f'table2/gpt2_60m_{v}' for v in ('oa', 's1', 's1oa',
                                                                                                    'vanilla')]
    base = reproduce.resolve('laptop/base', [])
    same = lambda a, b: {k for k in a if k != 'out_dir' and a[k] != b[k]}
    assert same(runs['table2/gpt2_60m_vanilla'].cfg, base) == set()
    assert same(runs['table2/gpt2_60m_s1oa'].cfg, base) == {'attn', 'optimizer'}
    assert same(runs['bb/1l_relu_adam'].cfg, reproduce.resolve('bb/1l_relu_adam', [])) == set()
    assert same(runs['bb/pilots/3l_sgd'].cfg, reproduce.resolve('bb/pilots/3l_sgd', [])) == set()
    assert len([c for c in runs if c.startswith('bb/')]) == 6 + 3
    bb = runs['bb/1l_softmax_adam'].cfg   # Guo et al.'s batch of 512 sequences of 256 a step
    assert (bb['batch_size'] * bb['gradient_accumulation_steps'], bb['block_size'], bb['learning_rate']) == (512, 256, 3e-4)
    assert sweep_report.get({'per_layer': {'resid_norm_first': [24.0, 31.5]}}, 'per_layer.resid_norm_first.1') == 31.5
    assert sweep_report.get({'per_layer': {'resid_norm_first': [24.0]}}, 'per_layer.resid_norm_first.3') is None


def test_a_table_reads_a_training_probe_by_its_iteration(tmp_path):
    """The Bigram-Backcopy table's '@300' column: the probe that train.py logged at iteration 300 (the last line of a
    repeated iteration wins, as a resumed run logs it again); a run that has not reached it shows nothing."""
    probe = lambda mass: {'per_layer': {'first_attn_mass_nontrigger': [mass]}, 'documents': 64}
    lines = [{'event': 'eval', 'iter': 0, 'probe': probe(0.02)}, {'event': 'probe', 'iter': 300, 'probe': probe(0.4)},
             {'event': 'probe', 'iter': 300, 'tokens': 76800, 'probe': probe(0.5)},
             {'event': 'train', 'iter': 310, 'loss': 1.0}]
    (tmp_path / 'log.jsonl').write_text(''.join(json.dumps(e) + '\n' for e in lines))
    results = sweep_report.read_results(str(tmp_path))
    key = '300.per_layer.first_attn_mass_nontrigger.0'
    assert sweep_report.get(results['probe'], key) == 0.5
    assert sweep_report.get(results['probe'], key.replace('300', '600')) is None
    # the figures' series: (tokens, probe) in order; iteration 0's line has no token count, so it is not drawn
    assert results['probes'] == [(76800, probe(0.5))]
    assert sweep_report.read_results(str(tmp_path / 'none')) == {'probe': {}, 'probes': []}


def test_the_eta_counts_rows_in_flight_and_what_resumed_rows_have_left():
    # Two 1,000-step rows side by side for 50 minutes: one finished, the other at 900; two more rows wait, one of
    # them resumed at 400. Trained: 1,000 + 900 = 1,900 iterations; left: 100 + 1,000 + 600 = 1,700.
    progress = [(0, 1000, 1000), (0, 1000, 900), (0, 1000, 0), (400, 1000, 400)]
    assert recipe.remaining_time(3000, progress) == pytest.approx(3000 * 1700 / 1900)
    # The old count (finished rows only, whole rows) said 3000 × 3,000 / 1,000 = 9,000 s here.
    assert recipe.remaining_time(3000, [(1000, 1000, 1000)]) == 0.0   # nothing left to train: no '?'
    assert recipe.remaining_time(3000, [(0, 1000, 0)]) == float('inf')   # nothing trained yet: no estimate
    assert recipe.remaining_time(60, [(0, 10, 10), (5, 10, 5)]) == pytest.approx(60 * 5 / 10)
    # Rows that only measure, finished in the first minutes beside a row still compiling: 30 of 10,000 iterations
    # trained in 300 s would say 27 h; under 5% trained the sweep says the ETA is not known yet.
    assert recipe.remaining_time(300, [(0, 5000, 30), (0, 5000, 0)]) == float('inf')
    assert recipe.remaining_time(300, [(0, 5000, 500), (0, 5000, 0)]) == pytest.approx(300 * 9500 / 500)
