"""bench.py smoke run on CPU: it completes, prints its table and writes the documented JSON (no timing assertions)."""
import json
import math
import subprocess
import sys

import pytest

from conftest import ROOT

RATIOS = ('attn_softmax1_over_softmax', 'optim_state_orthoadam_over_adamw', 'optim_step_orthoadam_over_adamw',
          'train_step_s1oa_over_vanilla')


def test_quick_run_writes_ratios(tmp_path):
    out = tmp_path / 'bench.json'
    run = subprocess.run([sys.executable, 'bench.py', '--quick', '--device=cpu', '--repeats=2', f'--json={out}'],
                         cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr
    assert 'ratios (median' in run.stdout and 'optim tiny' in run.stderr   # table on stdout, progress on stderr
    res = json.loads(out.read_text())
    assert res['device'].startswith('cpu') and res['quick'] is True
    for key in RATIOS:
        assert isinstance(res[key], float) and math.isfinite(res[key]) and res[key] > 0, key
    assert {r['optimizer'] for r in res['optimizer']} >= {'adamw', 'adamw_foreach', 'orthoadam hadamard/residual',
                                                          'orthoadam hadamard/all', 'orthoadam haar/residual'}
    assert [(r['variant'], r['grad_accum']) for r in res['train']] == [
        ('vanilla', 2), ('vanilla', 1), ('softmax1+orthoadam', 2), ('softmax1+orthoadam', 1)]
    assert set(res['train_step_s1oa_over_vanilla_by_accum']) == {'2', '1'}
    assert res['train_step_s1oa_over_vanilla'] == res['train_step_s1oa_over_vanilla_by_accum']['2']
    assert all(r['tokens_per_s'] * r['median_s'] == pytest.approx(r['grad_accum'] * 8 * 64) for r in res['train'])
    assert all(r['mfu'] is None and r['peak_memory_bytes'] > 0 for r in res['train'])   # no MFU on CPU


def test_sections_subset_and_errors(tmp_path):
    import bench
    res = bench.main(['--quick', '--device=cpu', '--sections=attn', '--repeats=1'])
    assert res['attn_softmax1_over_softmax'] > 0 and res['optim_step_orthoadam_over_adamw'] is None
    for bad in (['--sections=attn,nope'], ['--grad_accum=0'], ['--grad_accum=4,x']):
        with pytest.raises(SystemExit):
            bench.main(bad)


@pytest.mark.skipif(__import__('torch').cuda.is_available(), reason='checks the error without a GPU')
def test_cuda_without_gpu_is_a_clear_error():
    run = subprocess.run([sys.executable, 'bench.py', '--quick', '--device=cuda'], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 2 and 'CUDA is not available' in run.stderr
