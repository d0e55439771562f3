"""gpu_suite.py on the CPU: its report logic against hand-made inputs, and one real (tiny) training part."""
import json
import os
import subprocess
import sys

import pytest

from harness import bench_report
import gpu_suite
from conftest import ROOT

pytestmark = pytest.mark.slow   # a real (tiny) training part of gpu_suite.py


def test_bench_parts_merge_and_targets_are_judged_by_hand():
    ops = {'device': 'H100', 'attention': [{'shape': [1]}], 'optimizer': [], 'train': [], 'unreliable': ['a'],
           'attn_softmax1_over_softmax': 1.02, 'attn_bias_over_softmax': 1.06, 'optim_step_orthoadam_over_adamw': 2.5,
           'train_step_s1oa_over_vanilla_60m': None}
    train = {'device': 'H100', 'attention': [], 'optimizer': [], 'unreliable': ['b'],
             'train': [{'variant': 'vanilla', 'model': '130m', 'block_size': 256, 'mfu': 0.41}],
             'attn_softmax1_over_softmax': None, 'optim_step_orthoadam_over_adamw': None, 'mfu_vanilla_130m': 0.46,
             'train_step_s1oa_over_vanilla_60m': 1.04, 'train_step_s1oa_over_vanilla_130m': 1.01}
    res = gpu_suite.merge_bench([ops, train])
    assert len(res['attention']) == 1 and len(res['train']) == 1 and res['unreliable'] == ['a', 'b']
    targets = {t['key']: (t['value'], t['met']) for t in bench_report.judge(res)}
    assert targets == {'attn_softmax1_over_softmax': (1.02, True), 'attn_bias_over_softmax': (1.06, False),
                       'optim_step_orthoadam_over_adamw': (2.5, False), 'optim_state_orthoadam_over_adamw': (None, None),
                       'train_step_s1oa_over_vanilla_60m': (1.04, False), 'train_step_s1oa_over_vanilla_130m': (1.01, True),
                       'mfu_vanilla_130m': (0.46, True), 'bf16_speedup_laptop': (None, None)}   # the CPU's alone
    assert bench_report.judge({})[0]['met'] is None   # not measured is not a failure
    cpu = {t['key']: t['target'] for t in bench_report.judge({'device': 'cpu (2 cores)'})}
    assert cpu['attn_softmax1_over_softmax'] == '<= 1.05' and cpu['mfu_vanilla_130m'] == '-'   # CUDA's alone
    assert cpu['bf16_speedup_laptop'] == '>= 2.5'


def test_junit_summary_counts_and_failure_messages(tmp_path):
    xml = tmp_path / 't.xml'
    xml.write_text('<testsuites><testsuite name="pytest">'
                   '<testcase classname="tests.test_gpu" name="a"/>'
                   '<testcase classname="tests.test_gpu" name="b"><failure message="assert 1 == 2&#10;more"/></testcase>'
                   '<testcase classname="tests.test_gpu" name="c"><skipped message="needs CUDA"/></testcase>'
                   '<testcase classname="tests.test_gpu" name="d"><error message="boom"/></testcase>'
                   '</testsuite></testsuites>')
    s = gpu_suite.junit_summary(str(xml))
    assert (s['passed'], s['failed'], s['skipped'], s['errors']) == (1, 1, 1, 1)
    assert s['failures'] == [{'test': 'tests.test_gpu::b', 'message': 'assert 1 == 2'},
                             {'test': 'tests.test_gpu::d', 'message': 'boom'}]


def test_train_part_runs_the_four_variants_and_reports_them(bigram_data, tmp_path):
    """The train part end to end with a tiny model (--train_args): four runs with equal budgets, analysed, in
    report.json and report.md; a second call adds another part to the same report."""
    out = tmp_path / 'suite'
    tiny = '--n_layer=1 --n_embd=32 --n_head=2 --block_size=32 --batch_size=4 --gradient_accumulation_steps=1 --compile=False'
    r = subprocess.run([sys.executable, 'gpu_suite.py', '--out', str(out), '--parts', 'train', '--data', bigram_data,
                        '--train_iters', '3', '--eval_tokens', '512', '--analyze_docs', '5', '--train_args', tiny],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.load(open(out / 'report.json'))
    assert [row['variant'] for row in rep['train']] == list(gpu_suite.VARIANTS)
    for row in rep['train']:
        assert row['returncode'] == 0 and row['iter'] == 3 and row['val_loss'] > 0 and row['ppl'] > 1
        cfg = json.load(open(out / 'train' / row['variant'] / 'config.json'))
        assert (cfg['max_iters'], cfg['n_layer'], cfg['batch_size']) == (3, 1, 4)
    attn = {row['variant']: json.load(open(out / 'train' / row['variant'] / 'config.json'))['attn'] for row in rep['train']}
    assert attn == {'vanilla': 'softmax', 's1': 'softmax1', 'oa': 'softmax', 's1oa': 'softmax1'}
    md = open(out / 'report.md').read()
    assert '| s1oa |' in md and '128 tokens each' in md and 'Extra train.py arguments' in md
    assert rep['parts']['train']['returncode'] == 0 and 'tests' not in rep['parts']


def test_bad_arguments_are_one_line_errors(tmp_path):
    for args in (['--parts', 'tests,nope'], ['--train_iters', '0']):
        with pytest.raises(SystemExit):
            gpu_suite.main(['--out', str(tmp_path), *args])


def test_an_out_that_is_a_file_is_refused_before_any_part(tmp_path, monkeypatch, capsys):
    """Issue 36, case 27: --out FILE was a FileExistsError."""
    monkeypatch.setattr(gpu_suite, 'run_part', lambda *a: pytest.fail('ran a part with an unwritable --out'))
    (tmp_path / 'FILE').write_text('mine')
    with pytest.raises(SystemExit) as e:
        gpu_suite.main(['--out', str(tmp_path / 'FILE'), '--parts', 'bench', '--quick'])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"--out {tmp_path / 'FILE'} is a file, not a folder" in err and 'Traceback' not in err
    assert (tmp_path / 'FILE').read_text() == 'mine'
