"""Every output records where it came from (harness/provenance.py) and no absolute path: meta.json, a run's log.jsonl,
analyze.py's and eval_quant.py's JSON, made as a user makes them (relative paths from a working directory)."""
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

import analyze
import eval_quant
import prepare_c4
from harness import provenance
from conftest import ROOT
from test_faults import SMALL, cli, one_thread   # noqa: F401 (one_thread: autouse fixture)


def test_the_record_against_git_hashlib_and_torch():
    rec = provenance.record('cpu', {'splits': {'train': {'sha256': 'a'}, 'val': {'sha256': 'b'}}})
    head = subprocess.run(['git', 'rev-parse', 'HEAD'], cwd=ROOT, capture_output=True, text=True)
    if head.returncode == 0:
        assert rec['commit'].removesuffix('-dirty') == head.stdout.strip()
    with open(os.path.join(ROOT, 'pinned_corpus/manifest.json'), 'rb') as f:
        assert rec['corpus_manifest_sha256'] == hashlib.sha256(f.read()).hexdigest()
    assert rec['torch'] == torch.__version__ and rec['device'].startswith(f'cpu ({os.cpu_count()} cores')
    assert rec['data'] == {'train': 'a', 'val': 'b'}
    assert provenance.record()['device'] is None and 'data' not in provenance.record()


def test_a_cpu_device_names_the_cpu_model_the_kernel_reports(tmp_path, monkeypatch):
    """Two CPUs can round one fp32 training differently, so a CPU record names the model: /proc/cpuinfo's first
    'model name' (one line per core; other fields and a blank value skipped), else platform.processor()."""
    info = tmp_path / 'cpuinfo'
    info.write_text('processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: \nmodel\t\t: 106\n'
                    'model name\t: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz\n\nprocessor\t: 1\n'
                    'model name\t: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz\n')
    assert provenance.cpu_model(str(info)) == 'Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz'
    monkeypatch.setattr(provenance.platform, 'processor', lambda: 'x86_64')
    assert provenance.cpu_model(str(tmp_path / 'none')) == 'x86_64'
    monkeypatch.setattr(provenance.platform, 'processor', lambda: '')
    assert provenance.cpu_model(str(tmp_path / 'none')) is None
    monkeypatch.setattr(provenance, 'cpu_model', lambda: 'AMD EPYC')
    assert provenance.device_name('cpu') == f'cpu ({os.cpu_count()} cores, AMD EPYC)'
    assert provenance.device_name('cpu', detail='2 threads') == f'cpu ({os.cpu_count()} cores, AMD EPYC, 2 threads)'
    monkeypatch.setattr(provenance, 'cpu_model', lambda: None)
    assert provenance.device_name('cpu') == f'cpu ({os.cpu_count()} cores)'
    assert provenance.device_name('cpu', detail='2 threads') == f'cpu ({os.cpu_count()} cores, 2 threads)'


def test_a_copy_without_git_inside_another_repository_records_no_commit(tmp_path):
    """Issue 36, case 4: the project as a `git archive` tarball unpacks it (its files, no .git) inside another git
    repository (a home folder kept in git): that repository's HEAD says nothing about this code, so the commit is
    null, not the outer HEAD as a clean commit."""
    outer = tmp_path / 'home'
    project = outer / 'src' / 'project'
    project.mkdir(parents=True)
    git = lambda *a: subprocess.run(['git', *a], cwd=outer, capture_output=True, text=True, check=True,
                                    env=dict(os.environ, GIT_AUTHOR_NAME='t', GIT_AUTHOR_EMAIL='t@t',
                                             GIT_COMMITTER_NAME='t', GIT_COMMITTER_EMAIL='t@t')).stdout.strip()
    git('init', '-q')
    (outer / '.bashrc').write_text('alias ll="ls -l"\n')
    git('add', '.bashrc')
    git('commit', '-q', '-m', 'dotfiles')
    outer_head = git('rev-parse', 'HEAD')
    for path in glob.glob(os.path.join(ROOT, '*.py')):
        shutil.copy(path, project)
    shutil.copytree(os.path.join(ROOT, 'harness'), project / 'harness')
    (project / 'pinned_corpus').mkdir()
    shutil.copy(os.path.join(ROOT, 'pinned_corpus', 'manifest.json'), project / 'pinned_corpus')
    code = 'from harness import provenance; print(provenance.git_commit()); print(provenance.record()["commit"])'
    r = subprocess.run([sys.executable, '-c', code], cwd=project, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ['None', 'None'] and outer_head not in r.stdout


@pytest.mark.slow   # every script run on a trained model
def test_outputs_record_provenance_and_no_absolute_path(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert prepare_c4.main(['--source', 'bigram_backcopy', '--out_dir', 'data/bb',
                            '--val_docs', '20']) in (0, None)
    meta = json.loads((tmp_path / 'data' / 'bb' / 'meta.json').read_text())
    assert meta['provenance']['data'] == {s: meta['splits'][s]['sha256'] for s in meta['splits']}
    code, _, err = cli(capsys, '--dataset=bb', '--out_dir=out/run', *SMALL, '--max_iters=2', '--eval_interval=2')
    assert code == 0, err
    events = [json.loads(line) for line in (tmp_path / 'out' / 'run' / 'log.jsonl').read_text().splitlines()]
    rec = [e for e in events if e['event'] == 'provenance']
    assert len(rec) == 1 and rec[0]['iter'] == 0 and rec[0]['data'] == meta['provenance']['data']
    assert rec[0]['device'].startswith('cpu') and rec[0]['commit'] == meta['provenance']['commit']
    assert analyze.main(['--ckpt', 'out/run', '--max_docs', '4', '--json', 'out/run/analysis.json']) in (0, None)
    assert eval_quant.main(['--ckpt', 'out/run', '--max_docs', '4', '--schemes', 'coarse',
                            '--json', 'out/run/quant.json']) in (0, None)
    val = hashlib.sha256((tmp_path / 'data' / 'bb' / 'val.bin').read_bytes()).hexdigest()   # the bytes measured
    for name in ('analysis.json', 'quant.json'):
        doc = json.loads((tmp_path / 'out' / 'run' / name).read_text())
        assert doc['provenance']['torch'] == torch.__version__, name
        assert (doc if name == 'analysis.json' else doc['models'][0])['data']['val_sha256'] == val, name
    outputs = [tmp_path / 'data' / 'bb' / 'meta.json', *(tmp_path / 'out' / 'run').glob('*.json*')]
    for path in outputs:
        text = path.read_text()
        assert str(tmp_path) not in text and os.path.realpath(tmp_path) not in text, path
        assert ROOT not in text, path
    ckpt = torch.load(tmp_path / 'out' / 'run' / 'ckpt.pt', weights_only=False)
    assert not os.path.isabs(ckpt['data']['dir'])
    assert sys.executable   # (the checks above ran in this process, as the scripts' main())
