"""bench.py smoke run on CPU: it completes, prints its table and writes the documented JSON (no timing assertions)."""
import json
import math
import subprocess
import sys

import pytest

from harness import bench_report
from conftest import ROOT

pytestmark = pytest.mark.slow   # bench.py run whole

RATIOS = ('attn_softmax1_over_softmax', 'optim_state_orthoadam_over_adamw', 'optim_step_orthoadam_over_adamw',
          'train_step_s1oa_over_vanilla')


def test_quick_run_writes_ratios(tmp_path):
    out = tmp_path / 'bench.json'
    run = subprocess.run([sys.executable, 'bench.py', '--quick', '--device=cpu', '--repeats=2', f'--json={out}'],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert 'targets (CPU' in run.stdout and 'optim tiny' in run.stderr   # table on stdout, progress on stderr
    res = json.loads(out.read_text())
    assert res['device'].startswith('cpu') and res['quick'] is True
    for key in RATIOS:
        assert isinstance(res[key], float) and math.isfinite(res[key]) and res[key] > 0, key
    assert {r['optimizer'] for r in res['optimizer']} >= {'adamw', 'adamw_foreach', 'orthoadam hadamard/residual',
                                                          'orthoadam hadamard/all', 'orthoadam haar/residual'}
    assert [(r['variant'], r['grad_accum']) for r in res['train']] == [
        ('vanilla', 2), ('softmax1+orthoadam', 2), ('vanilla', 1), ('softmax1+orthoadam', 1)]
    assert isinstance(res['attn_extra_key_over_softmax'], float) and isinstance(res['unreliable'], list)
    assert all(set(bench_report.ATTN_VARIANTS) | {'softmax1_over_softmax_spread', 'attn_bias_over_softmax',
                                           'sdpa_route_over_softmax', 'extra_key_over_softmax', 'eager_over_softmax'}
               <= set(r) for r in res['attention'])
    assert res['attn_bias_over_softmax'] == max(r['attn_bias_over_softmax'] for r in res['attention'])
    assert set(res['train_step_s1oa_over_vanilla_by_accum']) == {'2', '1'}
    assert res['train_step_s1oa_over_vanilla'] == res['train_step_s1oa_over_vanilla_by_accum']['2']
    assert all(r['tokens_per_s'] * r['median_s'] == pytest.approx(r['grad_accum'] * 8 * 64) for r in res['train'])
    assert all(r['mfu'] is None and r['peak_memory_bytes'] > 0 for r in res['train'])   # no MFU on CPU
    # the bf16 section: each CPU config in its three paths; fp32 eager is its own baseline; the peak memory of a
    # step holds at least the parameters (config/laptop/base.py: 4 x 256 with a 257-byte vocabulary, ~3.3 M)
    assert [(r['case'], r['path']) for r in res['bf16']] == [(c, p) for c in ('laptop', 'bb') for p in (
        'fp32 eager', 'bf16 eager', 'bf16 compiled')]
    assert all(r['tokens'] == 2 * 256 and r['tokens_per_s'] * r['median_s'] == pytest.approx(512) for r in res['bf16'])
    assert [r['speedup'] for r in res['bf16'] if r['path'] == 'fp32 eager'] == [1.0, 1.0]
    assert all(r['peak_memory_bytes'] is None or r['peak_memory_bytes'] > 3e6 * 4 for r in res['bf16']
               if r['case'] == 'laptop')
    assert res['bf16_speedup_laptop'] == res['bf16'][2]['speedup'] and res['bf16_speedup_bb'] == res['bf16'][4]['speedup']


def test_sections_subset_and_errors(tmp_path):
    import bench
    res = bench.main(['--quick', '--device=cpu', '--sections=attn', '--repeats=1'])
    assert res['attn_softmax1_over_softmax'] > 0 and res['optim_step_orthoadam_over_adamw'] is None
    for bad in (['--sections=attn,nope'], ['--grad_accum=0'], ['--grad_accum=4,x']):
        with pytest.raises(SystemExit):
            bench.main(bad)


def test_a_json_path_that_cannot_be_written_is_refused_before_the_benchmark(tmp_path, monkeypatch, capsys):
    """Issue 36, case 26: --json FILE/b.json was a FileExistsError after the whole benchmark had run."""
    import bench
    monkeypatch.setattr(bench, 'bench_optimizer', lambda *a, **k: pytest.fail('benchmarked with an unwritable --json'))
    (tmp_path / 'FILE').write_text('mine')
    for path, said in ((tmp_path / 'FILE' / 'b.json', f"{tmp_path / 'FILE'} is a file, not a folder"),
                       (tmp_path, f'--json {tmp_path} is a folder, not a file')):
        with pytest.raises(SystemExit) as e:
            bench.main(['--quick', '--sections=optim', '--json', str(path)])
        err = capsys.readouterr().err
        assert e.value.code == 2 and said in err and 'Traceback' not in err, err
    assert (tmp_path / 'FILE').read_text() == 'mine'


@pytest.mark.skipif(__import__('torch').cuda.is_available(), reason='checks the error without a GPU')
def test_cuda_without_gpu_is_a_clear_error():
    run = subprocess.run([sys.executable, 'bench.py', '--quick', '--device=cuda'], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 2 and 'CUDA is not available' in run.stderr


def test_rounds_interleave_variants_and_ratios_are_paired():
    """measure() calls every variant once per round, in turn; a ratio is the median of per-round ratios, so a
    slowdown that hits one round of both variants alike leaves it unchanged."""
    import bench
    calls = []
    times = bench.measure({'a': lambda: calls.append('a'), 'b': lambda: calls.append('b')},
                          __import__('torch').device('cpu'), repeats=3, warmup=1)
    assert calls == ['a', 'b'] * 4 and [len(t) for t in times.values()] == [3, 3]
    ratio, spread = bench.paired_ratio([2.0, 20.0, 2.2], [1.0, 10.0, 1.0])   # round 2: machine 10x slower
    assert ratio == pytest.approx(2.0) and spread == pytest.approx((2.1 - 2.0) / 2.0)
    assert bench_report.spread([1.0, 1.0, 1.0, 1.0]) == 0.0


def test_best_of_interleaves_calls_and_keeps_each_rounds_fastest(monkeypatch):
    """best_of=2: a round calls a, b, a, b and keeps each one's faster call, so a call the scheduler interrupted
    (a: 5 s, b: 9 s below) does not become the round's time."""
    import bench
    calls, durations = [], iter([5.0, 1.0, 2.0, 9.0, 3.0, 1.0, 1.0, 4.0])
    monkeypatch.setattr(bench, 'time_call', lambda fn, device: (fn(), next(durations))[1])
    times = bench.measure({'a': lambda: calls.append('a'), 'b': lambda: calls.append('b')},
                          __import__('torch').device('cpu'), repeats=2, warmup=0, best_of=2)
    assert calls == ['a', 'b'] * 4 and times == {'a': [2.0, 1.0], 'b': [1.0, 1.0]}
    assert bench.plan(__import__('torch').device('cpu'), quick=True)['best_of'] == 3


def test_scattered_ratios_and_a_busy_machine_are_reported_unreliable():
    row = {'shape': [1, 2, 3, 4], 'softmax1_over_softmax_spread': 0.25, 'extra_key_over_softmax_spread': 0.01,
           'attn_bias_over_softmax_spread': 0.0}
    res = {'attention': [row], 'optimizer': [{'model': 'tiny', 'optimizer': 'adamw', 'step_over_adamw_spread': 0.0}],
           'train': [{'model': 'tiny', 'grad_accum': 1, 'batch_size': 8, 'block_size': 64,
                      'step_over_vanilla_spread': 0.5}]}
    reasons = bench_report.unreliable(res, 'busy')
    assert reasons[0] == 'busy' and len(reasons) == 3
    assert 'softmax1_over_softmax: spread 25%' in reasons[1] and 'train tiny 1x8x64: spread 50%' in reasons[2]
    assert bench_report.fmt_ratio(1.5, 0.2).endswith('?') and not bench_report.fmt_ratio(1.5, 0.05).endswith('?')


def test_a_full_disk_during_the_benchmark_is_one_line_and_keeps_the_last_write(tmp_path, monkeypatch):
    """Issue 36: a disk that fills between two sections: the first section's json stays whole, the error is one line."""
    import errno
    import bench
    out, writes = tmp_path / 'b.json', []

    def write_json(path, obj, indent=2):
        if writes:
            raise OSError(errno.ENOSPC, 'No space left on device')
        writes.append(path)
        out.write_text(json.dumps(obj))
    monkeypatch.setattr(bench, 'write_json', write_json)
    with pytest.raises(SystemExit) as e:
        bench.main(['--quick', '--device=cpu', '--repeats=1', '--sections=optim,train', '--grad_accum=1',
                    f'--json={out}'])
    assert str(e.value).startswith(f"bench.py: error: the disk holding {tmp_path} is full (writing {out} failed)")
    assert '\n' not in str(e.value) and json.loads(out.read_text())['optimizer']   # the optim section, whole
