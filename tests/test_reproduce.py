"""reproduce.py: the table configs state the paper's settings, scales keep every row's differences, and a
smoke-scale sweep trains, analyses, quantises, renders and skips finished runs."""
import hashlib
import json
import os
import subprocess
import sys

import pytest

import reproduce
from conftest import ROOT
from harness.dataset import prepare_bigram_backcopy

pytestmark = pytest.mark.slow   # reproduce.py sweeps: trainings

# the paper's words for our config values (Table 5's label columns)
NORM = {'layernorm': 'LayerNorm', 'rmsnorm': 'RMSNorm-M', 'rmsnorm_single': 'RMSNorm-S'}
POS = {'absolute': 'Absolute', 'rotary': 'Rotary', 'none': 'None'}
# Appendix A: (warmup, steps) per size; the ablation trains 130M for 40k steps with 2000 warmup
SCHEDULE = {'gpt2_60m': (1000, 160_000), 'gpt2_130m': (2000, 320_000), 'gpt2_350m': (6000, 960_000),
            'gpt2_1.4b': (10_000, 600_000), 'llama2_130m': (2000, 320_000)}


def paper(config):
    return reproduce.resolve(config, [])


def optimizer_label(cfg):
    if cfg['optimizer'] == 'sgd':
        return 'SGD w/mom*' if cfg['momentum'] > 0 else 'SGD w/o mom*'
    assert cfg['optimizer'] != 'rmsprop' or cfg['momentum'] == 0    # RMSProp = Adam with beta1 = 0
    return {'adamw': 'Adam', 'rmsprop': 'RMSProp', 'orthoadam': 'OrthoAdam'}[cfg['optimizer']]


def test_table5_configs_match_the_papers_row_labels_and_schedule():
    rows = reproduce.TABLES['table5'].rows
    assert len(rows) == 14
    for row in rows:
        cfg = paper(row.config)
        labels = ('✓' if cfg['bias'] else '✗', POS[cfg['pos_emb']], NORM[cfg['norm']], optimizer_label(cfg),
                  '✓' if cfg['attn'] == 'softmax1' else '✗')
        assert labels == row.labels, row.config
        sgd = cfg['optimizer'] == 'sgd'
        assert (cfg['warmup_iters'], cfg['max_iters']) == (2000, 40_000 * (8 if sgd else 1)) == (2000, 40_000 * row.steps)
        assert cfg['learning_rate'] == (0.2 if sgd else 1e-3)
        assert (cfg['n_layer'], cfg['n_head'], cfg['n_embd'], cfg['block_size']) == (12, 12, 768, 256)
        assert cfg['batch_size'] * cfg['gradient_accumulation_steps'] == 512 and cfg['weight_decay'] == 0


@pytest.mark.parametrize('table', ['table2', 'table3', 'table6'])
def test_table2_3_6_configs_have_the_flags_sizes_and_schedules_of_appendix_a(table):
    for row in reproduce.TABLES[table].rows:
        cfg = paper(row.config)
        name = row.config.split('/')[1]
        size = name.split('_seq')[0] if '_seq' in name else name.rsplit('_', 1)[0]
        variant = row.config.rsplit('_', 1)[1]
        assert cfg['attn'] == ('softmax1' if variant in ('s1', 's1oa') else 'softmax'), row.config
        assert cfg['optimizer'] == ('orthoadam' if variant in ('oa', 's1oa') else 'adamw'), row.config
        assert (cfg['warmup_iters'], cfg['max_iters']) == SCHEDULE[size]
        assert cfg['batch_size'] * cfg['gradient_accumulation_steps'] == 512 and cfg['learning_rate'] == 1e-3
        seq = int(row.config.split('_seq')[1].split('_')[0]) if '_seq' in row.config else 256
        assert cfg['block_size'] == seq
        llama = size.startswith('llama')
        assert (cfg['norm'], cfg['pos_emb'], cfg['mlp']) == (
            ('rmsnorm', 'rotary', 'swiglu') if llama else ('rmsnorm_single', 'absolute', 'gelu'))
        assert not cfg['bias']


def differing(a, b, ignore=('out_dir', 'eval_interval', 'log_interval')):
    return {k for k in a if a[k] != b[k] and k not in ignore}


@pytest.mark.parametrize('scale', ['mini', 'smoke'])
def test_scales_keep_every_rows_differences(scale, tmp_path):
    runs = reproduce.plan(['table5'], reproduce.SCALES[scale], str(tmp_path))
    shrunk = {r.config: r.cfg for r in runs}
    full = {r.config: paper(r.config) for r in runs}
    base = 'table5/02_no_biases'
    for config in shrunk:
        expected = differing(full[config], full[base])
        assert differing(shrunk[config], shrunk[base]) == expected, config
    s = reproduce.SCALES[scale]
    assert shrunk['table5/10_sgd']['max_iters'] == 8 * shrunk[base]['max_iters'] == 8 * s.iters
    assert shrunk[base]['n_embd'] // shrunk[base]['n_head'] == 64            # head size kept


def test_rows_with_one_training_config_share_a_run(tmp_path):
    """At mini scale Table 2's 130M softmax-1 / OrthoAdam rows train exactly what Table 5's rows 7, 11, 12 do."""
    runs = reproduce.plan(['table5', 'table2'], reproduce.SCALES['mini'], str(tmp_path), ['table5', 'gpt2_130m'])
    assert len(runs) == 15
    shared = {r.name: sorted(row.config for _, row in r.rows) for r in runs if len(r.rows) > 1}
    assert shared == {'table5-07_rmsnorm_s': ['table2/gpt2_130m_s1', 'table5/07_rmsnorm_s'],
                      'table5-11_orthoadam': ['table2/gpt2_130m_s1oa', 'table5/11_orthoadam'],
                      'table5-12_orthoadam_softmax': ['table2/gpt2_130m_oa', 'table5/12_orthoadam_softmax']}
    paper_runs = reproduce.plan(['table5', 'table2'], reproduce.SCALES['paper'], str(tmp_path), ['table5', 'gpt2_130m'])
    assert len(paper_runs) == 18                      # 320k vs 40k steps: nothing shared at paper scale


def test_a_run_saved_with_another_eval_interval_is_the_same_run(tmp_path):
    """eval_interval (and probe_docs) change what is logged, not the weights: a run saved while eval_interval was
    part of the identity (mini: one evaluation at the end) is the run that the current plan asks for."""
    (run,) = reproduce.plan(['table5'], reproduce.SCALES['mini'], str(tmp_path), ['02_no_biases'])
    assert run.cfg['eval_interval'] == 150 and 'eval_interval' not in run.identity
    assert reproduce.saved_identity(dict(run.identity, eval_interval=3000)) == run.identity
    assert reproduce.saved_identity(dict(run.identity, learning_rate=0.5)) != run.identity


@pytest.fixture(scope='module')
def bb(tmp_path_factory):
    return str(prepare_bigram_backcopy(tmp_path_factory.mktemp('bb') / 'bb', train_docs=200, val_docs=20, doc_len=64))


def sweep(*args):
    return subprocess.run([sys.executable, 'reproduce.py', *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_smoke_sweep_trains_analyses_quantises_renders_and_skips_finished_runs(bb, tmp_path):
    out = str(tmp_path / 'out')
    args = ['table3', 'table5', '--scale', 'smoke', '--rows', '01_biases', 'gpt2_130m_s1oa',
            '--dataset', bb, '--out', out, '--jobs', '2']
    r = sweep(*args)
    assert r.returncode == 0, r.stderr[-3000:]
    runs = os.path.join(out, 'smoke', 'runs')
    assert sorted(os.listdir(runs)) == ['table2-gpt2_130m_s1oa', 'table5-01_biases']
    for name in os.listdir(runs):
        assert os.path.isfile(os.path.join(runs, name, 'analysis.json'))
    assert os.path.isfile(os.path.join(runs, 'table2-gpt2_130m_s1oa', 'quant.json'))
    assert not os.path.exists(os.path.join(runs, 'table5-01_biases', 'quant.json'))   # Table 5 needs no quantisation

    doc = json.load(open(os.path.join(out, 'smoke', 'table5.json')))
    (row,) = doc['rows']
    analysis = json.load(open(os.path.join(runs, 'table5-01_biases', 'analysis.json')))
    assert row['ours']['kurtosis_rest'] == analysis['kurtosis_rest'] and row['ours']['ppl'] == analysis['ppl']
    assert row['paper'] == {'ppl': 26.9, 'kurtosis_rest': 291.7, 'first_attn_argmax': 0.333, 'max_abs_rest': 1675.9}
    assert analysis['config']['bias'] is True and analysis['config']['norm'] == 'layernorm'
    val = hashlib.sha256(open(os.path.join(bb, 'val.bin'), 'rb').read()).hexdigest()   # what the row was measured on
    assert row['val_sha256'] == val and row['provenance'] == analysis['provenance'] and row['state'] == 'finished'
    assert doc['provenance']['torch'] == analysis['provenance']['torch'] and 'commit' in doc['provenance']
    md = open(os.path.join(out, 'smoke', 'table5.md')).read()
    assert '| ✓ | Absolute | LayerNorm | Adam | ✗ |' in md and '| 291.7 |' in md and 'Kurtosis (paper)' in md
    quant = json.load(open(os.path.join(out, 'smoke', 'table3.json')))['rows'][0]
    q = json.load(open(os.path.join(runs, 'table2-gpt2_130m_s1oa', 'quant.json')))['models'][0]
    assert quant['ours']['delta.coarse'] == q['delta']['coarse'] and quant['paper']['ppl.full'] == 22.78

    # a later sweep of another table finds the run that trained the same config (Table 5's row 11 at this scale)
    (shared,) = reproduce.plan(['table5'], reproduce.SCALES['smoke'], os.path.join(out, 'smoke'), ['11_orthoadam'], bb)
    assert shared.name == 'table2-gpt2_130m_s1oa' and reproduce.status(shared, reproduce.SCALES['smoke']) == 'done'

    for figure in ('table3_trajectories', 'table5_trajectories', 'table5_claims'):   # the probes against the tokens
        assert open(os.path.join(out, 'smoke', f'{figure}.png'), 'rb').read(8) == b'\x89PNG\r\n\x1a\n'
    evals = [json.loads(line) for line in open(os.path.join(runs, 'table5-01_biases', 'log.jsonl')) if '"eval"' in line]
    assert [e['iter'] for e in evals] == [0, 1, 2, 3, 4] and all(e['probe']['documents'] > 0 for e in evals)

    first = open(os.path.join(runs, 'table5-01_biases', 'train.out')).readline()   # the interpreter's path is not kept
    assert first.startswith('$ python train.py config/table5/01_biases.py ') and sys.executable not in first

    ckpt = os.path.join(runs, 'table5-01_biases', 'ckpt.pt')
    mtime = os.path.getmtime(ckpt)
    again = sweep(*args)
    assert again.returncode == 0 and '2 runs, 2 done, 0 to do' in again.stderr
    assert os.path.getmtime(ckpt) == mtime


def test_a_rows_commands_name_no_folder_of_this_machine_under_the_repository(bb, tmp_path):
    """The commands run in ROOT: under it, every path a row's commands (and so its train.out, config.json and
    reproduce.json) name is relative to it, the same folder; an --out elsewhere keeps its own path."""
    scale = reproduce.SCALES['smoke']
    for out, under in ((os.path.join(ROOT, 'out', 'reproduce', 'smoke'), True), (str(tmp_path / 'smoke'), False)):
        (run,) = reproduce.plan(['table5'], scale, out, ['01_biases'], bb)
        assert os.path.isabs(run.cfg['out_dir'])   # reproduce.py's own view stays absolute
        cmds = dict(reproduce.commands(run, scale, 1))
        args = [a for cmd in cmds.values() for a in cmd[1:]]
        assert cmds['train'][1:3] == ['train.py', os.path.join('config', 'table5', '01_biases.py')]
        out_dir = next(a for a in cmds['train'] if a.startswith('--out_dir=')).split('=', 1)[1]
        if under:
            assert not any(ROOT in a for a in args)
            assert out_dir == os.path.join('out', 'reproduce', 'smoke', 'runs', 'table5-01_biases')
            assert os.path.join(ROOT, out_dir) == run.cfg['out_dir']
        else:
            assert out_dir == run.cfg['out_dir']
            assert cmds['analyze'][cmds['analyze'].index('--ckpt') + 1] == os.path.join(out_dir, 'ckpt.pt')


def test_a_changed_row_config_is_a_one_line_error_not_a_silent_reuse(bb, tmp_path):
    out = str(tmp_path / 'out')
    run = reproduce.plan(['table5'], reproduce.SCALES['smoke'], os.path.join(out, 'smoke'), ['01_biases'], bb)[0]
    os.makedirs(run.cfg['out_dir'])
    identity = dict(json.loads(json.dumps(run.identity, default=str)), learning_rate=0.5)
    with open(os.path.join(run.cfg['out_dir'], 'reproduce.json'), 'w') as f:
        json.dump({'identity': identity}, f)
    r = sweep('table5', '--scale', 'smoke', '--rows', '01_biases', '--dataset', bb, '--out', out)
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1].startswith('reproduce.py: error: ')
    assert 'differs in learning_rate' in r.stderr


def test_dry_run_prints_torchrun_commands_and_unknown_rows_are_errors(tmp_path):
    r = sweep('table2', '--rows', 'gpt2_1.4b', '--nproc', '8', '--dry_run', '--out', str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert not os.listdir(tmp_path)                   # nothing written, no figure either
    assert r.stdout.count('torch.distributed.run --standalone --nproc_per_node=8') == 2
    assert 'config/table2/gpt2_1.4b_s1oa.py' in r.stdout and '--init_from=auto' in r.stdout
    assert f"(cd {ROOT})" in r.stderr and ' train.py config/table2/' in r.stdout   # the paths are relative to ROOT
    bad = sweep('table5', '--rows', 'nonesuch', '--dry_run', '--out', str(tmp_path))
    assert bad.returncode == 1 and 'matches no row' in bad.stderr


def test_iters_override_keeps_the_sgd_rows_factor(tmp_path):
    r = sweep('table5', '--rows', '10_sgd', '02_no', '--scale', 'mini', '--iters', '40', '--dry_run', '--out', str(tmp_path))
    assert r.returncode == 0, r.stderr
    (sgd,) = [line for line in r.stdout.splitlines() if 'table5/10_sgd.py' in line]
    (adam,) = [line for line in r.stdout.splitlines() if 'table5/02_no_biases.py' in line]
    assert '--max_iters=320 ' in sgd and '--max_iters=40 ' in adam
    assert '--warmup_iters=2 ' in sgd and '--warmup_iters=2 ' in adam      # the same warmup for every row


def named_fix(name):
    """What a mitigations row's file name says it changes against base.py: '10_softmax1_orthoadam' -> attn softmax1 and
    optimizer orthoadam; '06_attn_bias' -> attn_bias; '01_vanilla' -> nothing."""
    from model import CHOICES
    from harness.optimizers import OPTIMIZERS
    words, fix = name.split('_', 1)[1], {}
    for flag in ('attn_bias', 'sink_token'):
        if flag in words:
            fix[flag], words = True, words.replace(flag, '')
    for word in filter(None, words.split('_')):
        key = 'attn' if word in CHOICES['attn'] else 'optimizer' if word in OPTIMIZERS else None
        assert key or word == 'vanilla', f"config/mitigations/{name}.py: '{word}' names no attention or optimizer"
        if key:
            fix[key] = word
    return fix


def test_mitigation_rows_differ_from_one_base_only_in_their_fix():
    """Every file of config/mitigations/ is a row, in order, and changes against base.py exactly what its name says."""
    base = reproduce.resolve('mitigations/base', [])
    assert (base['attn'], base['optimizer'], base['norm'], base['bias'], base['max_iters']) == (
        'softmax', 'adamw', 'rmsnorm_single', False, 40_000)
    rows = reproduce.TABLES['mitigations'].rows
    files = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, 'config', 'mitigations')) if f[:2].isdigit())
    assert [r.config.split('/')[1] for r in rows] == files
    for row in rows:
        cfg = paper(row.config)
        assert {k: cfg[k] for k in differing(cfg, base)} == named_fix(row.config.split('/')[1]), row.config
        assert row.paper == () and not any(c[4] for c in reproduce.TABLES['mitigations'].columns)


def test_mitigations_smoke_sweep_of_the_rows_with_their_own_code_paths(bb, tmp_path):
    """Sigmoid (eager attention), the sink token (one more position, sink metrics) and Muon (two optimizers)
    train, analyse, quantise and render; the other rows share their code paths with tested ones."""
    out = str(tmp_path / 'out')
    r = sweep('mitigations', '--scale', 'smoke', '--rows', 'sigmoid', 'sink_token', 'muon', '--dataset', bb,
              '--out', out, '--jobs', '2')
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.load(open(os.path.join(out, 'smoke', 'mitigations.json')))
    assert [row['labels'][0] for row in doc['rows']] == ['05', '07', '09']
    bits = ('delta.coarse6', 'delta.coarse4')   # the smoke scale quantises Table 3's four schemes only: '–'
    for row in doc['rows']:
        assert all(v is not None for k, v in row['ours'].items() if k not in bits), row
        assert all(row['ours'][k] is None for k in bits), row
    md = open(os.path.join(out, 'smoke', 'mitigations.md')).read()
    assert '| 09 | softmax | Muon |' in md and '1-Σp' in md
    assert open(os.path.join(out, 'smoke', 'mitigations_effects.png'), 'rb').read(8) == b'\x89PNG\r\n\x1a\n'


def test_gpu_scale_rows_shapes_and_budgets(tmp_path):
    """--scale gpu: rows up to 130M at their own shapes (350M and 1.4B left out), Table 5 and the mitigations at
    the 60M shape with every row's own difference kept, 32,768 tokens per step at every sequence length,
    document-aligned windows, the SGD rows' 8x schedule."""
    s = reproduce.SCALES['gpu']
    t2 = {r.config: r.cfg for r in reproduce.plan(['table2', 'table3'], s, str(tmp_path))}
    assert len(t2) == 12 and not any('350m' in c or '1.4b' in c for c in t2)
    assert all(c['windows'] == 'document' and c['batch_size'] * c['block_size'] == 32_768 for c in t2.values())
    assert t2['table2/gpt2_60m_vanilla']['max_iters'] == 10_000 and t2['table2/gpt2_130m_s1']['max_iters'] == 4000
    assert t2['table2/llama2_130m_oa']['n_embd'] == 768                     # its own shape
    t6 = {r.config: r.cfg for r in reproduce.plan(['table6'], s, str(tmp_path))}
    assert t6['table6/gpt2_60m_seq1024_s1oa']['batch_size'] == 32
    t5 = {r.config: r.cfg for r in reproduce.plan(['table5'], s, str(tmp_path))}
    base = 'table5/02_no_biases'
    full = {c: paper(c) for c in t5}
    for config, cfg in t5.items():
        assert (cfg['n_layer'], cfg['n_head'], cfg['n_embd']) == (10, 8, 512)
        # the recipe's weight decay (optimizers.DECOUPLED_WEIGHT_DECAY) reaches the Adam-family rows only: RMSProp and SGD keep 0
        coupled = {'weight_decay'} if cfg['optimizer'] in ('sgd', 'rmsprop') else set()
        assert differing(cfg, t5[base]) == differing(full[config], full[base]) | coupled, config
    assert t5['table5/10_sgd']['max_iters'] == 8 * t5[base]['max_iters'] == 8 * 3000
    mit = reproduce.plan(['mitigations'], s, str(tmp_path))
    assert len(mit) == len(reproduce.TABLES['mitigations'].rows) and all(r.cfg['n_embd'] == 512 for r in mit)


def test_gpu_scale_dry_run_prints_data_tokens_and_expected_time(bb, tmp_path):
    r = sweep('table2', '--scale', 'gpu', '--rows', 'gpt2_60m', '--dataset', bb, '--dry_run', '--out', str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert f'data: {bb}' in r.stderr and r.stderr.count('328 M tokens') == 4
    assert 'expected wall time on one H100' in r.stderr and 'for the 4 runs to do' in r.stderr
    assert r.stdout.count('--windows=') == 4 and '--compile=True' in r.stdout


# ----------------------------------------------------------------------------- refused before any work (issue 36)
def exit_of(capsys, *argv):
    """reproduce.main in this process: (exit status as the shell sees it, its message, stdout + stderr)."""
    with pytest.raises(SystemExit) as e:
        reproduce.main(list(argv))
    code, printed = e.value.code, capsys.readouterr()
    return (code if isinstance(code, int) else 1), ('' if isinstance(code, int) else code), printed.out + printed.err


def finished_rows(out, rows, results):
    """The run folders of `rows` at the smoke scale under out, each holding the analysis.json in `results`."""
    planned = reproduce.plan(['table2'], reproduce.SCALES['smoke'], os.path.join(out, 'smoke'), rows)
    for run in planned:
        os.makedirs(run.cfg['out_dir'])
        with open(os.path.join(run.cfg['out_dir'], 'analysis.json'), 'w') as f:
            json.dump(results[run.config.split('/')[-1]], f)
    return planned


@pytest.mark.parametrize('value', ['nan', 'inf', '-1'])
def test_job_minutes_must_be_a_finite_number(capsys, tmp_path, value):
    """Cases 6-7: --job_minutes nan / inf planned train.py --max_minutes=nan, which train.py refuses later."""
    code, _, err = exit_of(capsys, 'table5', '--scale', 'smoke', '--rows', '11_orthoadam', '--job_minutes', value,
                           '--dry_run', '--out', str(tmp_path))
    assert code == 2 and f'argument --job_minutes: {value} is not allowed' in err and 'max_minutes' not in err


@pytest.mark.parametrize('render', [[], ['--render']])
def test_an_out_that_is_a_file_is_refused_before_any_work(capsys, tmp_path, monkeypatch, render):
    """Cases 23-24: --out FILE was a NotADirectoryError (after the training, without --render)."""
    monkeypatch.setattr(reproduce, 'run_all', lambda *a: pytest.fail('trained with an --out it cannot write'))
    (tmp_path / 'FILE').write_text('mine')
    code, message, _ = exit_of(capsys, 'table5', '--scale', 'smoke', '--rows', '11_orthoadam', '--out',
                               str(tmp_path / 'FILE'), *render)
    assert code == 1 and message == f"reproduce.py: error: --out {tmp_path / 'FILE'} is a file, not a folder; " \
                                    f"choose another --out"
    assert (tmp_path / 'FILE').read_text() == 'mine'


def test_goal_with_a_perplexity_of_zero_is_missing_not_a_traceback(capsys, tmp_path):
    """Case 25: vanilla's analysis.json with "ppl": 0 (no perplexity is below 1) divided by zero."""
    good = {'gpt2_60m_vanilla': {'ppl': 0, 'kurtosis_first': 120.0, 'kurtosis_rest': 40.0, 'first_attn_argmax': 0.4},
            'gpt2_60m_s1oa': {'ppl': 30.3, 'kurtosis_first': 3.2, 'kurtosis_rest': 3.1, 'first_attn_argmax': 0.02}}
    out = str(tmp_path / 'out')
    finished_rows(out, ['gpt2_60m_vanilla', 'gpt2_60m_s1oa'], good)
    code, message, printed = exit_of(capsys, 'table2', '--scale', 'smoke', '--rows', 'gpt2_60m_vanilla',
                                     'gpt2_60m_s1oa', '--out', out, '--render', '--goal')
    assert code == 1 and 'the sink goal is not met' in message and 'Traceback' not in printed
    assert 'MISSING: s1+OA PPL within 2% of vanilla' in printed and 'met: vanilla first_attn_argmax' in printed


def test_render_names_a_row_not_trained_apart_from_a_row_stopped_midway(tmp_path):
    """A row with no log.jsonl (a results folder copied while rows still trained) read 'not finished: iteration 0 of
    N', as if it had started; it says it was not trained. A stopped row says where it stopped."""
    out = str(tmp_path / 'out')
    rows = ['gpt2_60m_vanilla', 'gpt2_60m_s1oa']
    planned = finished_rows(out, rows, {r: {'ppl': 30.0} for r in rows})
    os.remove(os.path.join(planned[1].cfg['out_dir'], 'analysis.json'))
    with open(os.path.join(planned[0].cfg['out_dir'], 'log.jsonl'), 'w') as f:
        f.write(json.dumps({'iter': 2, 'event': 'eval', 'val_loss': 4.0}) + '\n')
    reproduce.main(['table2', '--scale', 'smoke', '--rows', *rows, '--out', out, '--render'])
    with open(os.path.join(out, 'smoke', 'table2.md')) as f:
        md = f.read()
    untrained = os.path.relpath(planned[1].cfg['out_dir'], os.path.join(out, 'smoke'))
    assert f"config/table2/gpt2_60m_vanilla.py not finished: iteration 2 of {planned[0].cfg['max_iters']}" in md
    assert f"config/table2/gpt2_60m_s1oa.py not trained: no log.jsonl in {untrained}" in md
    assert 'iteration 0 of' not in md


def test_pack_that_packs_nothing_is_an_error(capsys, tmp_path, monkeypatch):
    """--pack exited 0 when nothing was packed: into an existing file or a read-only folder (refused before any
    work), or a pack over 16 MiB (refused when packing: the exit status says so, the other rows are packed)."""
    out = str(tmp_path / 'out')
    rows = ['gpt2_60m_vanilla', 'gpt2_60m_s1oa']
    planned = finished_rows(out, rows, {r: {'ppl': 30.0} for r in rows})
    args = ['table2', '--scale', 'smoke', '--rows', *rows, '--out', out, '--render']
    (tmp_path / 'a_file').write_text('mine')
    code, message, _ = exit_of(capsys, *args, '--pack', str(tmp_path / 'a_file'))
    assert code == 1 and 'is a file, not a folder' in message and (tmp_path / 'a_file').read_text() == 'mine'
    from harness import fileio
    read_only = str(tmp_path / 'ro')
    os.makedirs(read_only)
    access = os.access   # what a read-only folder answers (chmod does not stop root, who may run the tests)
    monkeypatch.setattr(fileio.os, 'access', lambda p, mode, **k: False if p == read_only else access(p, mode, **k))
    code, message, _ = exit_of(capsys, *args, '--pack', read_only)
    assert code == 1 and f'--pack {read_only}: cannot write to {read_only}' in message
    assert not os.path.exists(os.path.join(out, 'smoke', 'table2.md'))      # refused before rendering
    monkeypatch.undo()
    with open(os.path.join(planned[0].cfg['out_dir'], 'log.jsonl'), 'wb') as f:   # 17 MiB that do not compress
        f.write(os.urandom(17 * 2 ** 20))
    packs = str(tmp_path / 'packs')
    code, message, _ = exit_of(capsys, *args, '--pack', packs)
    assert code == 1 and '1 of 2 row(s) not packed' in message and 'MiB > 16 MiB' in message
    assert sorted(os.listdir(packs)) == [f'{planned[1].name}.tar.gz']


@pytest.mark.parametrize('extra, named', [
    (['--render'], '--render'), (['--pack', '{tmp}/packs'], '--pack'), (['--goal'], '--goal'),
    (['--max_jobs', '1'], '--max_jobs'), (['--render', '--goal'], '--render and --goal'),
])
def test_a_dry_run_refuses_the_options_it_cannot_honour(capsys, tmp_path, extra, named):
    """Silent-wrong, case 7: --dry_run with --render, --pack DIR or --goal printed the commands and exited 0, each
    option ignored (--goal promises exit 1 when the goal is not met). Now one error line, exit 2, nothing printed or
    made."""
    code, _, printed = exit_of(capsys, 'table5', '--scale', 'smoke', '--dry_run', '--out', str(tmp_path / 'out'),
                               *[a.format(tmp=tmp_path) for a in extra])
    errors = [line for line in printed.splitlines() if 'error:' in line]
    assert code == 2 and len(errors) == 1 and errors[0].endswith(
        f"error: --dry_run prints the commands and runs nothing: {named} cannot be honoured; drop one"), printed
    assert '# ' not in printed and os.listdir(tmp_path) == []


def test_a_rows_whole_name_selects_a_row_folders_deep(capsys, tmp_path):
    """--rows p07_archive (the whole name of config/laptop/pilots/p07_archive.py) matched no row: only a name one
    folder deep was compared whole. Now the name alone or any tail of whole folders selects that row alone."""
    assert reproduce.row_selected('laptop/pilots/p07_archive', ['p07_archive'])
    assert reproduce.row_selected('laptop/pilots/p07_archive', ['pilots/p07_archive'])
    assert not reproduce.row_selected('laptop/pilots/p08_archive1800', ['p07_archive'])
    reproduce.main(['laptop_pilots', '--scale', 'laptop', '--rows', 'p07_archive', '--dry_run', '--out', str(tmp_path)])
    planned = [line for line in capsys.readouterr().out.splitlines() if line.startswith('# ')]
    assert planned == ['# laptop-pilots-p07_archive (todo) train', '# laptop-pilots-p07_archive (todo) analyze']


def test_a_table_with_no_row_at_the_scale_names_the_scales_that_run_it(capsys, tmp_path):
    """reproduce.py table6 --scale laptop (no --rows) ended "--rows  matches no row"; a --rows word that names no row
    with a laptop form lists the rows that have one."""
    code, message, _ = exit_of(capsys, 'table6', '--scale', 'laptop', '--dry_run', '--out', str(tmp_path))
    assert code == 1 and '--rows' not in message and 'no row of table6 runs at this scale' in message, message
    assert '--scale paper or mini or gpu or smoke' in message
    code, message, _ = exit_of(capsys, 'table2', '--scale', 'laptop', '--rows', 'gpt2_130m', '--dry_run', '--out',
                               str(tmp_path))
    assert code == 1 and message.endswith('the rows it runs here: gpt2_60m_vanilla, gpt2_60m_s1, gpt2_60m_oa, '
                                          'gpt2_60m_s1oa'), message


def test_a_missing_dataset_is_named_once_and_a_dry_run_says_so(capsys, tmp_path, monkeypatch):
    """--dataset data/X with no such folder ended "(the runs read data/data/X)", and --dry_run planned runs on it
    without a word."""
    monkeypatch.chdir(tmp_path)
    args = ['table5', '--scale', 'smoke', '--rows', '01_biases', '--dataset', 'data/X', '--out', str(tmp_path / 'o')]
    code, message, _ = exit_of(capsys, *args)
    missing = str(tmp_path / 'data' / 'X')
    assert code == 1 and 'is not a prepared dataset' in message and message.count(missing) >= 1, message
    assert 'data/data' not in message and 'data//' not in message and 'the runs read' not in message
    reproduce.main([*args, '--dry_run'])
    printed = capsys.readouterr()
    assert f'data: a run would stop here: {missing} is not a prepared dataset' in printed.err
    assert '# table5-01_biases (todo) train' in printed.out and not (tmp_path / 'data').exists()


@pytest.mark.parametrize('rows', [[''], ['11_orthoadam', ' ']])
def test_an_empty_rows_word_is_refused(capsys, tmp_path, rows):
    """Silent-wrong, case 7: --rows "" (an unset shell variable) matched every row."""
    code, _, printed = exit_of(capsys, 'table5', '--scale', 'smoke', '--dry_run', '--out', str(tmp_path), '--rows',
                               *rows)
    assert code == 2 and printed.strip().splitlines()[-1].endswith(
        "error: --rows: an empty WORD would select every row (an unset shell variable?); give part of a config name")
    assert '# ' not in printed


def test_a_training_job_a_signal_stopped_is_not_finished_and_the_exit_says_so(capsys, tmp_path, monkeypatch):
    """Surprising exit, case 13: train.py now exits 128 + N after the checkpoint a signal N asked for. reproduce.py
    reads it: no further job of the chain starts, the row is neither done nor failed, and it exits as train.py did."""
    from conftest import write_dataset
    data = write_dataset(str(tmp_path / 'data'), n_train=2000, n_val=500)
    stopped = [sys.executable, '-c', 'import sys; print("SIGTERM received: checkpoint written"); sys.exit(143)']
    real = reproduce.commands
    monkeypatch.setattr(reproduce, 'commands', lambda *a: [('train', stopped)] + real(*a)[1:])
    code, message, printed = exit_of(capsys, 'table5', '--scale', 'smoke', '--rows', '11_orthoadam', '--dataset', data,
                                     '--out', str(tmp_path / 'out'), '--job_minutes', '1')
    (run,) = os.listdir(tmp_path / 'out' / 'smoke' / 'runs')
    assert code == 143 and printed.strip().splitlines()[-1] == (
        f"reproduce.py: {run}: train stopped by SIGTERM (exit 143); the same command continues it"), printed
    log = open(tmp_path / 'out' / 'smoke' / 'runs' / run / 'train.out').read()
    assert log.count('$ ') == 1 and '[done' not in printed and '[failed]' not in printed and '[stopped]' in printed



def test_pack_into_the_results_folder_is_refused(capsys, tmp_path):
    """--pack into a row's own folder was accepted: a row's pack would hold the packs made before it."""
    out = tmp_path / 'o'
    code, message, _ = exit_of(capsys, 'table5', '--scale', 'smoke', '--rows', '01_biases', '--out', str(out),
                               '--pack', str(out / 'smoke' / 'runs' / 'table5-01_biases'))
    assert code == 1 and 'is inside the results folder' in message and 'choose a folder outside it' in message


def test_the_main_job_s_table_sentence_and_goal_from_its_two_results(tmp_path):
    """The main job (reproduce.py main): its two rows as their configs say (no scale override, and the caption says
    so, not the paper scale's C4 and batch 512), the sentence with the ratio and the perplexity gap by hand
    (17.6 / 3.6 = 4.89; 7.193 / 7.349 - 1 = -2.1%), and the goal: met at ratio >= 3 and a gap <= 3%, not met beyond."""
    from harness import sweep_report as report
    runs = reproduce.plan(['main'], reproduce.SCALES['paper'], str(tmp_path), None)
    assert sorted(r.config for r in runs) == ['main', 'main_vanilla']
    assert [o for r in runs for o in r.overrides if not o.startswith('--out_dir=')] == []
    measured = {'main_vanilla': (7.349, 17.6), 'main': (7.193, 3.6)}
    for run in runs:
        os.makedirs(run.cfg['out_dir'])
        ppl, kurtosis = measured[run.config]
        with open(os.path.join(run.cfg['out_dir'], 'analysis.json'), 'w') as f:
            json.dump({'ppl': ppl, 'kurtosis_first': kurtosis, 'kurtosis_rest': 3.0}, f)
    md, doc = report.render('main', runs, 'paper', reproduce.SCALES['paper'], str(tmp_path))
    assert md.splitlines()[0].endswith("— scale `paper`: each row as its config file says.")
    assert doc['scale_description'] == 'each row as its config file says'
    assert [r['ours']['kurtosis_first'] for r in doc['rows']] == [17.6, 3.6]   # vanilla first
    assert report.main_summary(runs) == ("vanilla's first token: kurtosis 17.6 (a Gaussian's is 3); with softmax-1 "
                                         "+ OrthoAdam 3.6, 4.9x less, at the same perplexity (7.349 and 7.193, -2.1%)")
    assert [ok for _, _, ok in report.main_goal(runs)] == [True, True]
    with open(os.path.join(runs[0].cfg['out_dir'] if runs[0].config == 'main' else runs[1].cfg['out_dir'],
                           'analysis.json'), 'w') as f:
        json.dump({'ppl': 7.7, 'kurtosis_first': 6.0}, f)   # the fixed model: 4.8% worse, ratio 2.93
    assert [ok for _, _, ok in report.main_goal(runs)] == [False, False]
    assert 'another perplexity' in report.main_summary(runs)


def test_a_row_whose_checkpoint_is_damaged_fails_in_one_line_and_the_other_rows_go_on(bb, tmp_path):
    """Issue 52's bad input: a stopped row whose ckpt.pt was damaged is refused with train.py's one line, named in the
    sweep's [failed] line; the row beside it trains to the end, and the damaged file is left as it was."""
    out = str(tmp_path / 'out')
    args = ['table5', '--scale', 'smoke', '--rows', '01_biases', '03_pos_none', '--dataset', bb, '--out', out,
            '--jobs', '2']
    assert sweep(*args).returncode == 0
    runs = os.path.join(out, 'smoke', 'runs')
    assert sorted(os.listdir(runs)) == ['table5-01_biases', 'table5-03_pos_none']
    damaged, other = os.path.join(runs, 'table5-01_biases'), os.path.join(runs, 'table5-03_pos_none')
    with open(os.path.join(damaged, 'log.jsonl')) as f:   # stopped after step 2: not finished, not measured
        kept = [line for line in f if json.loads(line).get('iter', 0) <= 2]
    with open(os.path.join(damaged, 'log.jsonl'), 'w') as f:
        f.writelines(kept)
    os.remove(os.path.join(damaged, 'analysis.json'))
    good = open(os.path.join(damaged, 'ckpt.pt'), 'rb').read()
    with open(os.path.join(damaged, 'ckpt.pt'), 'wb') as f:
        f.write(good[:len(good) // 2])
    for name in os.listdir(other):   # the other row: to train again from nothing
        os.remove(os.path.join(other, name))

    r = sweep(*args)
    assert r.returncode == 1 and 'Traceback' not in r.stderr, r.stderr[-3000:]
    (failed,) = [line for line in r.stderr.splitlines() if line.startswith('[failed]')]
    assert failed.startswith('[failed] table5-01_biases: train failed (exit 2: ') and 'corrupt' in failed, failed
    assert '[done 1/2] table5-03_pos_none' in r.stderr
    assert os.path.isfile(os.path.join(other, 'analysis.json'))
    assert open(os.path.join(damaged, 'ckpt.pt'), 'rb').read() == good[:len(good) // 2]   # nothing of it rewritten
