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
    assert {r['optimizer'] for r in res['optimizer']} >= {'adamw', 'orthoadam hadamard/residual',
                                                          'orthoadam hadamard/all', 'orthoadam haar/residual'}
    assert [r['variant'] for r in res['train']] == ['vanilla', 'softmax1+orthoadam']
    assert all(r['mfu'] is None and r['peak_memory_bytes'] > 0 for r in res['train'])   # no MFU on CPU


def test_sections_subset_and_errors(tmp_path):
    import bench
    res = bench.main(['--quick', '--device=cpu', '--sections=attn', '--repeats=1'])
    assert res['attn_softmax1_over_softmax'] > 0 and res['optim_step_orthoadam_over_adamw'] is None
    with pytest.raises(SystemExit):
        bench.main(['--sections=attn,nope'])


@pytest.mark.skipif(__import__('torch').cuda.is_available(), reason='checks the error without a GPU')
def test_cuda_without_gpu_is_a_clear_error():
    run = subprocess.run([sys.executable, 'bench.py', '--quick', '--device=cuda'], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 2 and 'CUDA is not available' in run.stderr
