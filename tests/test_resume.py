"""What a resume may change and what it may not; the schedule's horizon; ckpt.pt (latest) and best.pt (best)."""
import glob
import json
import math
import os
import shutil

import pytest
import torch

import train
from test_faults import SMALL, cli, one_thread, snapshot   # noqa: F401 (one_thread: autouse fixture)
from harness import optimizers, train_config

pytestmark = pytest.mark.slow   # train.py runs resumed


def finished_run(data, out, capsys, *extra):
    code, _, err = cli(capsys, f'--dataset={data}', f'--out_dir={out}', *SMALL, '--max_iters=4', '--eval_interval=2',
                       *extra)
    assert code == 0, err
    return [f'--dataset={data}', f'--out_dir={out}', *SMALL, *extra]


def events(out, kind):
    return [e for e in map(json.loads, open(os.path.join(out, 'log.jsonl'))) if e['event'] == kind]


def test_every_config_key_has_one_resume_policy():
    sets = (train_config.RESUME_MAY_CHANGE, train_config.RESUME_MUST_MATCH, train_config.RESUME_IGNORED)
    assert set().union(*sets) == set(train_config.DEFAULTS)
    assert sum(map(len, sets)) == len(train_config.DEFAULTS)


@pytest.mark.parametrize('optimizer,changes', [
    ('adamw', ['--weight_decay=0.1', '--beta2=0.95', '--eps=1e-6']),
    ('orthoadam', ['--weight_decay=0.1', '--beta1=0.8', '--beta2=0.95']),
    ('rmsprop', ['--momentum=0.9', '--beta2=0.95', '--weight_decay=0.01']),   # momentum switched on
    ('sgd', ['--momentum=0.5', '--weight_decay=0.1']),
    ('muon', ['--muon_momentum=0.9', '--muon_lr=0.01', '--beta2=0.95', '--weight_decay=0.1']),
])
def test_resume_runs_and_records_changed_optimizer_hyperparameters(bigram_data, tmp_path, capsys, optimizer, changes):
    """The resumed optimizer's param groups hold what a fresh optimizer with the new config would hold (the
    reference), and config.json, ckpt['config'] and log.jsonl record exactly those values."""
    out = str(tmp_path / 'run')
    start = ['--momentum=0.0'] if optimizer == 'rmsprop' else []
    args = finished_run(bigram_data, out, capsys, f'--optimizer={optimizer}', *start)
    code, stdout, err = cli(capsys, *args, '--init_from=resume', '--max_iters=6', *changes)
    assert code == 0, err
    new = {c[2:].split('=')[0]: float(c.split('=')[1]) for c in changes}
    ckpt = torch.load(os.path.join(out, 'ckpt.pt'), weights_only=False)
    from model import GPT, GPTConfig
    cfg = dict(ckpt['config'], **new)
    groups = lambda sd: sd['muon']['param_groups'] + sd['adamw']['param_groups'] if 'muon' in sd else sd['param_groups']
    reference = groups(optimizers.configure_optimizer(GPT(GPTConfig(**ckpt['model_args'])), cfg, 'cpu').state_dict())
    assert len(groups(ckpt['optimizer'])) == len(reference)
    for got, want in zip(groups(ckpt['optimizer']), reference):
        for k in set(want) - {'params', 'lr', 'initial_lr'}:
            assert got[k] == want[k], (k, got[k], want[k])
    saved = json.load(open(os.path.join(out, 'config.json')))
    logged = {e['key']: e['new'] for e in events(out, 'resume_change')}
    for key, value in new.items():
        assert saved[key] == ckpt['config'][key] == logged[key] == value
        assert f"changed on resume: {key} " in stdout and f" -> {value!r}" in stdout


@pytest.mark.parametrize('start,change,key', [
    ('adamw', '--optimizer=orthoadam', 'optimizer'), ('adamw', '--optimizer=sgd', 'optimizer'),
    ('adamw', '--optimizer=rmsprop', 'optimizer'), ('orthoadam', '--optimizer=adamw', 'optimizer'),
    ('orthoadam', '--orthoadam_axes=all', 'orthoadam_axes'), ('orthoadam', '--orthoadam_seed=1', 'orthoadam_seed'),
])
def test_optimizer_change_on_resume_is_one_line_error(bigram_data, tmp_path, capsys, start, change, key):
    out = str(tmp_path / 'run')
    args = finished_run(bigram_data, out, capsys, f'--optimizer={start}')
    before = snapshot(out)
    code, _, err = cli(capsys, *args, '--init_from=resume', '--max_iters=6', change)
    assert code == 2 and err.count('\n') == 1 and err.startswith('error: cannot resume'), err
    assert f"{key}: checkpoint" in err
    assert snapshot(out) == before


def test_refused_resume_lists_every_difference_and_changes_nothing(bigram_data, tmp_path, capsys):
    out = str(tmp_path / 'run')
    args = finished_run(bigram_data, out, capsys)
    before = snapshot(out)
    code, _, err = cli(capsys, *args, '--init_from=resume', '--n_layer=3', '--seed=1', '--batch_size=8',
                       '--learning_rate=0.01')
    assert code == 2 and err.count('\n') == 1
    for key in ('n_layer: checkpoint 2 vs requested 3', 'seed: checkpoint 1337 vs requested 1',
                'batch_size: checkpoint 4 vs requested 8'):
        assert key in err
    assert 'learning_rate' not in err                         # may change: not an error
    assert snapshot(out) == before                            # config.json, log.jsonl, ckpt.pt, best.pt, .lock


def test_resume_refuses_other_data_under_the_same_name(bigram_data, tmp_path, capsys):
    from conftest import write_dataset
    data = write_dataset(str(tmp_path / 'data'), n_train=20_000)
    out = str(tmp_path / 'run')
    args = finished_run(data, out, capsys)
    write_dataset(data, n_train=30_000)                       # prepared again: other content, same folder
    code, _, err = cli(capsys, *args, '--init_from=resume', '--max_iters=6')
    assert code == 2 and 'train_tokens 20000 -> 30000' in err
    moved = str(tmp_path / 'moved')
    os.rename(data, moved)
    write_dataset(data, n_train=20_000)                       # the same data again, then under another path
    os.rename(data, str(tmp_path / 'moved2'))
    code, stdout, err = cli(capsys, *args, f'--dataset={tmp_path / "moved2"}', '--init_from=resume', '--max_iters=6')
    assert code == 0 and "changed on resume: dataset" in stdout, err


def test_larger_max_iters_keeps_the_recorded_schedule(bigram_data, tmp_path, capsys):
    """lr_decay_iters=0 is resolved to max_iters when the run starts and recorded; a resume with a larger
    max_iters keeps that horizon (lr = min_lr after it, by the formula) unless lr_decay_iters is passed."""
    lr, lo, warm = 3e-3, 3e-4, 2                              # tiny_cpu.py's peak and final lr, SMALL's warmup
    cosine = lambda it, horizon: lo + 0.5 * (1 + math.cos(math.pi * (it - warm) / (horizon - warm))) * (lr - lo)
    out, other = str(tmp_path / 'keep'), str(tmp_path / 'explicit')
    args = {folder: finished_run(bigram_data, folder, capsys, '--lr_decay_iters=0') for folder in (out, other)}
    for folder in (out, other):
        assert torch.load(os.path.join(folder, 'ckpt.pt'), weights_only=False)['config']['lr_decay_iters'] == 4
    code, stdout, err = cli(capsys, *args[out], '--init_from=resume', '--max_iters=8')
    assert code == 0, err
    assert ("max_iters 4 -> 8: the cosine schedule keeps lr_decay_iters=4 (min_lr after it); pass --lr_decay_iters "
            "to change it") in stdout
    assert [e['lr'] for e in events(out, 'train')][4:] == pytest.approx([lo] * 4)   # steps 4..7
    assert json.load(open(os.path.join(out, 'config.json')))['lr_decay_iters'] == 4
    code, stdout, err = cli(capsys, *args[other], '--init_from=resume', '--max_iters=8', '--lr_decay_iters=8')
    assert code == 0 and 'changed on resume: lr_decay_iters 4 -> 8' in stdout, err
    assert [e['lr'] for e in events(other, 'train')][4:] == pytest.approx([cosine(it, 8) for it in range(4, 8)])


def test_best_checkpoint_survives_a_bad_stretch_and_eval_only_writes_nothing(bigram_data, tmp_path, capsys):
    """ckpt.pt follows the run; best.pt keeps the lowest validation loss (the log says which iteration that
    was) even when divergence detection is off and the loss climbs."""
    out = str(tmp_path / 'run')
    args = finished_run(bigram_data, out, capsys, '--max_iters=8')
    best_bytes = open(os.path.join(out, 'best.pt'), 'rb').read()
    code, _, err = cli(capsys, *args, '--init_from=resume', '--max_iters=12', '--learning_rate=1.0',
                       '--decay_lr=False', '--grad_clip=0.0', '--divergence_factor=0')
    assert code == 0, err
    evals = events(out, 'eval')
    best_eval = min((e for e in evals if e['iter'] > 0), key=lambda e: e['val_loss'])
    latest, best = (torch.load(os.path.join(out, f), weights_only=False) for f in ('ckpt.pt', 'best.pt'))
    assert latest['iter_num'] == 12 and best['iter_num'] == best_eval['iter'] == 8
    assert open(os.path.join(out, 'best.pt'), 'rb').read() == best_bytes
    assert latest['best_val_loss'] == best['best_val_loss'] == best_eval['val_loss']
    before = snapshot(out)
    code, stdout, err = cli(capsys, *args, '--eval_only=True', '--learning_rate=1.0', '--decay_lr=False',
                            '--grad_clip=0.0')
    assert code == 0 and 'eval at iter 12' in stdout, err
    assert snapshot(out) == before


def test_leftover_tmp_files_are_removed_at_start(bigram_data, tmp_path, capsys):
    out = str(tmp_path / 'run')
    args = finished_run(bigram_data, out, capsys)
    for name in ('ckpt.pt.tmp', 'best.pt.tmp', 'config.json.tmp', 'ckpt_4.pt.tmp'):
        with open(os.path.join(out, name), 'wb') as f:
            f.write(b'half a checkpoint')
    os.makedirs(os.path.join(out, 'ckpt.dcp-4.tmp'))                       # a killed sharded save: train.py's mark
    for name, text in (('ckpt.dcp-4.tmp/.written-by', 'train.py\n'), ('ckpt.dcp-4.tmp/__0_0.distcp', 'half'),
                       # what is not train.py's stays (issue 36, case 1): a user's folder and file named *.tmp, and
                       # a folder under a name train.py writes but without its mark
                       ('plots.tmp/fig.png', 'f'), ('notes.tmp', 'mine'), ('ckpt.dcp-2.tmp/mine.txt', 'mine')):
        os.makedirs(os.path.dirname(os.path.join(out, name)), exist_ok=True)
        with open(os.path.join(out, name), 'w') as f:
            f.write(text)
    code, stdout, err = cli(capsys, *args, '--init_from=resume', '--max_iters=5')
    assert code == 0, err
    assert sorted(os.path.relpath(p, out) for p in glob.glob(os.path.join(out, '*.tmp'))) == [
        'ckpt.dcp-2.tmp', 'notes.tmp', 'plots.tmp']
    assert open(os.path.join(out, 'plots.tmp', 'fig.png')).read() == 'f'
    assert open(os.path.join(out, 'ckpt.dcp-2.tmp', 'mine.txt')).read() == 'mine'
    assert open(os.path.join(out, 'notes.tmp')).read() == 'mine'
    assert stdout.count('left by an interrupted save') == 5


def test_save_every_keeps_a_series_each_of_which_resumes_exactly(bigram_data, tmp_path, capsys):
    """save_every=2: ckpt_2, ckpt_4, ckpt_6 (the state at that iteration, as ckpt.pt would hold it); a later resume
    adds to the series without rewriting it; a copy of ckpt_4.pt resumed elsewhere reaches ckpt_6's weights bit for
    bit; a fresh start refuses a folder that holds a series; a negative value is one line."""
    out = str(tmp_path / 'run')
    args = finished_run(bigram_data, out, capsys, '--max_iters=6', '--eval_interval=3', '--save_every=2')
    series = lambda folder: sorted(os.path.basename(p) for p in glob.glob(os.path.join(folder, 'ckpt_*.pt')))
    assert series(out) == ['ckpt_2.pt', 'ckpt_4.pt', 'ckpt_6.pt']
    load = lambda path: torch.load(path, weights_only=False)
    kept = {n: load(os.path.join(out, f'ckpt_{n}.pt')) for n in (2, 4, 6)}
    assert [kept[n]['iter_num'] for n in (2, 4, 6)] == [2, 4, 6]
    latest = load(os.path.join(out, 'ckpt.pt'))
    assert all(torch.equal(latest['model'][k], v) for k, v in kept[6]['model'].items())
    assert not any(torch.equal(kept[2]['model'][k], v) for k, v in kept[6]['model'].items() if k.endswith('c_fc.weight'))
    before = {n: open(os.path.join(out, n), 'rb').read() for n in series(out)}
    code, _, err = cli(capsys, *args, '--init_from=resume', '--max_iters=8')
    assert code == 0, err
    assert series(out) == ['ckpt_2.pt', 'ckpt_4.pt', 'ckpt_6.pt', 'ckpt_8.pt']
    assert all(open(os.path.join(out, n), 'rb').read() == b for n, b in before.items())

    other = str(tmp_path / 'from4')
    os.makedirs(other)
    shutil.copy(os.path.join(out, 'ckpt_4.pt'), os.path.join(other, 'ckpt.pt'))
    other_args = [a for a in args if not a.startswith('--out_dir=')] + [f'--out_dir={other}']
    code, _, err = cli(capsys, *other_args, '--init_from=resume', '--max_iters=6')
    assert code == 0, err
    assert series(other) == ['ckpt_4.pt', 'ckpt_6.pt']     # ckpt_4: the state it resumed from, which was missing
    for n in (4, 6):
        again = load(os.path.join(other, f'ckpt_{n}.pt'))
        assert again['iter_num'] == n and all(torch.equal(again['model'][k], v) for k, v in kept[n]['model'].items())

    fresh = str(tmp_path / 'fresh')
    os.makedirs(fresh)
    shutil.copy(os.path.join(out, 'ckpt_2.pt'), fresh)
    code, _, err = cli(capsys, *[a for a in args if not a.startswith('--out_dir=')], f'--out_dir={fresh}')
    assert code == 2 and err.count('\n') == 1 and 'ckpt_<iter>.pt' in err and 'cp it to' in err
    assert os.listdir(fresh) == ['ckpt_2.pt']
    code, _, err = cli(capsys, *args, '--save_every=-1')
    assert code == 2 and err.count('\n') == 1 and "'save_every'" in err and '[0, inf)' in err
