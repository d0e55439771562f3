"""tools/gpu_queue.py, the standing GPU queue (docs/gpu-queue.md), checked on the CPU so that a GPU window finds no
typo: every item's commands are valid at the gpu scale, each item runs as its CPU miniature into a fake $OUT in
the calls a window makes (a call cut by its deadline, a call that stops a training job, a call that finishes), what
lands in $OUT fits what a device call brings back, and the tests that failed on the H200 are the ones run first."""
import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
from types import SimpleNamespace

import pytest

import reproduce
from conftest import ROOT
from harness.dataset import prepare_bigram_backcopy
from harness.device_files import OUT_FILES
from harness.device_steps import error_line
from harness.recipe import STEPS

pytestmark = pytest.mark.slow   # the GPU queue's items as CPU trainings

SCRIPT = os.path.join(ROOT, 'tools', 'gpu_queue.py')
spec = importlib.util.spec_from_file_location('gpu_queue', SCRIPT)
gpu_queue = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_queue)


@pytest.fixture(scope='module')
def bb(tmp_path_factory):
    return str(prepare_bigram_backcopy(tmp_path_factory.mktemp('bb') / 'bb', train_docs=200, val_docs=20, doc_len=64))


def queue(*args, cwd=None, timeout=600):
    return subprocess.run([sys.executable, SCRIPT, *args], cwd=cwd or ROOT, capture_output=True, text=True,
                          timeout=timeout)


def mini(item, out, work, bb, minutes='3', *extra):
    return queue('run', item, '--out', str(out), '--minutes', minutes, '--mini', '--work', str(work), '--dataset', bb,
                 *extra)


def status(out):
    with open(os.path.join(out, 'status.json')) as f:
        return json.load(f)


@pytest.mark.parametrize('item', [i for i in gpu_queue.ITEMS if i.kind == 'rows'], ids=lambda i: i.name)
def test_each_rows_item_trains_exactly_its_rows_with_the_recipe_and_the_probe(item, tmp_path):
    runs = reproduce.plan(list(item.tables), reproduce.SCALES['gpu'], str(tmp_path), list(item.rows))
    call = SimpleNamespace(item=item, work=str(tmp_path / 'w'), mini=False)
    assert [os.path.basename(d) for d in gpu_queue.row_dirs(call).values()] == [r.name for r in runs]
    for run in runs:
        c = run.cfg
        steps = STEPS['pilot' if item.name == 'pilots' else '60m']
        probes = 25 if item.name == 'pilots' else 40
        # the pilots vary BOS (document windows) and weight decay; every other row has the recipe's
        windows = 'random' if run.name.startswith('pilots-bos0') else 'document'
        wd = 0.1 if run.name.endswith('wd01') else 0.5
        assert (c['max_iters'], c['windows'], c['weight_decay'], c['dataset']) == (steps, windows, wd, 'pinned_archive')
        assert (c['eval_interval'], c['probe_interval'], c['probe_docs']) == (steps // 2, steps // probes, 32)
        assert c['batch_size'] * c['block_size'] == 32_768 and c['compile']
        # every Table 2 / 3 row is quantised at 4 to 8 bits too (the bits table), the pilots only analysed
        quant = dict(reproduce.commands(run, reproduce.SCALES['gpu'], 1)).get('quant')
        if item.name == 'pilots':
            assert quant is None
        else:
            schemes = quant[quant.index('--schemes') + 1].split(',')
            assert {'coarse', 'moderate', 'fine', 'zeropoint4', 'coarse4', 'moderate4', 'coarse7'} <= set(schemes)


def test_a_whole_row_name_selects_that_row_alone():
    assert reproduce.row_selected('table2/gpt2_60m_s1', ['gpt2_60m_s1'])
    assert not reproduce.row_selected('table2/gpt2_60m_s1oa', ['gpt2_60m_s1'])
    assert not reproduce.row_selected('table2/gpt2_60m_s1oa', ['table2/gpt2_60m_s1'])
    assert reproduce.row_selected('table2/gpt2_60m_s1oa', ['gpt2_60m'])            # a part of names: every match
    assert reproduce.row_selected('table5/11_orthoadam', ['orthoadam'])


def test_an_item_is_done_only_by_its_own_complete_window(tmp_path):
    """The queue's next item: the laptop scale's rows carry the 60M rows' folder names, and a window cut short leaves
    part of an item's files (a tests.log of half the suite); neither makes an item done. A committed
    <item>.status.json whose "complete" is true does, in any results folder; a damaged one does not."""
    def put(rel, text):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    put('2026-11-28-laptop-bf16/runs/table2-gpt2_60m_vanilla/analysis.json', '{}')
    put('w1/tests.log', '....')
    put('w1/gpu_tests.status.json', json.dumps({'item': 'gpu_tests', 'complete': False}))
    put('w1/s1oa_60m.status.json', '{"item": "s1oa_60m", "comp')
    put('w2/vanilla_60m.status.json', json.dumps({'item': 'vanilla_60m', 'complete': True}))
    done = gpu_queue.done_items(str(tmp_path))
    assert [name for name, paths in done.items() if paths] == ['vanilla_60m']
    assert done['vanilla_60m'] == [str(tmp_path / 'w2' / 'vanilla_60m.status.json')]


def test_the_first_tests_are_the_ones_that_failed_on_the_h200():
    pytest.importorskip('triton', reason="the first tests include tests/test_flash_sink.py's, which needs triton")
    log = open(os.path.join(ROOT, 'docs', 'results', 'h200-2026-11-26', 'tests_gpu.log')).read()
    failed = re.findall(r'^FAILED (\S+?)(?:\[.*?\])?(?: - .*)?$', log, re.M)
    assert len(failed) == 7 and {f for f in failed} <= set(gpu_queue.FIRST_TESTS)
    r = subprocess.run([sys.executable, '-m', 'pytest', '--collect-only', '-q', '-m', 'gpu', *gpu_queue.FIRST_TESTS],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:]
    assert re.search(r'^7 tests collected', r.stdout, re.M), r.stdout[-500:]


def test_a_rows_item_over_three_calls_cut_stopped_then_complete(bb, tmp_path):
    """Call 1 is cut by its deadline, call 2 stops its training job after one step, call 3 finishes the row,
    analyses and quantises it; every call leaves status.json, the third the complete pack; a fourth does nothing."""
    work = tmp_path / 'machine'
    r = mini('vanilla_60m', tmp_path / 'o1', work, bb, '0.4')   # 24 s: the step gets 4 s before the deadline's margin
    assert r.returncode == 0, r.stderr[-2000:]
    s1 = status(tmp_path / 'o1')
    assert s1['complete'] is False and s1['calls'][-1]['outcome'] == 'unfinished'
    assert s1['steps']['reproduce gpt2_60m_vanilla']['rc'] is None          # stopped at the deadline
    r = mini('vanilla_60m', tmp_path / 'o2', work, bb, '3', '--job_minutes', '1e-6')
    assert r.returncode == 0, r.stderr[-2000:]
    s2 = status(tmp_path / 'o2')
    row = s2['rows']['table2-gpt2_60m_vanilla']
    assert (row['state'], row['analysis'], s2['complete']) == ('stopped', False, False)
    with tarfile.open(tmp_path / 'o2' / 'table2-gpt2_60m_vanilla.tar.gz') as t:
        names = t.getnames()
    assert 'table2-gpt2_60m_vanilla/log.jsonl' in names and not any(n.endswith('.pt') for n in names)
    r = mini('vanilla_60m', tmp_path / 'o3', work, bb)
    assert r.returncode == 0, r.stderr[-2000:]
    s3 = status(tmp_path / 'o3')
    assert s3['complete'] and [c['call'] for c in s3['calls']] == [1, 2, 3]
    assert s3['rows']['table2-gpt2_60m_vanilla'] | {'tokens_per_s': None} == {
        'state': 'finished', 'iter': 4, 'max_iters': 4, 'tokens_per_s': None, 'analysis': True, 'quant': True}
    files = os.listdir(tmp_path / 'o3')
    assert len(files) <= OUT_FILES and 'status.json' in files
    with tarfile.open(tmp_path / 'o3' / 'table2-gpt2_60m_vanilla.tar.gz') as t:
        names = set(t.getnames())
        analysis = json.load(t.extractfile('table2-gpt2_60m_vanilla/analysis.json'))
    assert {f'table2-gpt2_60m_vanilla/{f}' for f in ('analysis.json', 'quant.json', 'log.jsonl', 'table2.md',
                                                     'table3.md', 'config.json')} <= names
    assert analysis['ppl'] > 1
    r = mini('vanilla_60m', tmp_path / 'o4', work, bb)   # nothing left to do: no step runs, the same results
    s4 = status(tmp_path / 'o4')
    assert r.returncode == 0 and s4['complete'] and s4['steps'] == s3['steps'] and s4['rows'] == s3['rows']
    # unpack: the packs become run folders for reproduce.py --render, the rest lands beside them; never twice
    into = tmp_path / 'docs' / 'results' / 'x'
    r = queue('unpack', str(tmp_path / 'o3'), '--into', str(into), '--work', str(tmp_path / 'here'))
    assert r.returncode == 0, r.stderr
    assert (into / 'vanilla_60m.status.json').is_file() and (into / 'table2_trajectories.png').is_file()
    assert (into / 'runs' / 'table2-gpt2_60m_vanilla' / 'analysis.json').is_file()
    assert (tmp_path / 'here' / 'out' / 'reproduce' / 'gpu' / 'runs' / 'table2-gpt2_60m_vanilla' / 'quant.json').is_file()
    r = queue('unpack', str(tmp_path / 'o3'), '--into', str(into), '--work', str(tmp_path / 'here'))
    assert r.returncode == 2 and r.stderr.count('\n') == 1 and 'exists' in r.stderr
    # a second window of the same row (vanilla_60m_bits): a new --into, but the run folder for --render is taken
    r = queue('unpack', str(tmp_path / 'o3'), '--into', str(tmp_path / 'y'), '--work', str(tmp_path / 'here'))
    assert r.returncode == 2 and r.stderr.count('\n') == 1 and 'a run of that name unpacked before: move it aside' \
        in r.stderr and 'table2-gpt2_60m_vanilla' in r.stderr and not (tmp_path / 'y').exists()


def test_the_gpu_tests_item_runs_the_first_tests_then_the_suite(bb, tmp_path):
    pytest.importorskip('triton', reason="its first test is tests/test_flash_sink.py's, which needs triton")
    r = mini('gpu_tests', tmp_path / 'o', tmp_path / 'machine', bb)
    assert r.returncode == 0, r.stderr[-2000:]
    s = status(tmp_path / 'o')
    assert s['complete'] and s['steps']['tests_first']['rc'] == 0 and s['steps']['tests']['rc'] == 0
    assert '1 passed' in open(tmp_path / 'o' / 'tests_first.log').read()
    assert sorted(os.listdir(tmp_path / 'o')) == ['status.json', 'tests.log', 'tests.xml', 'tests_first.log',
                                                  'tests_first.xml']


def test_the_bench_item_measures_two_rows_side_by_side(bb, tmp_path):
    r = mini('bench', tmp_path / 'o', tmp_path / 'machine', bb, '4')
    assert r.returncode == 0, r.stderr[-2000:]
    sbs = json.load(open(tmp_path / 'o' / 'side_by_side.json'))
    for v in ('vanilla', 's1oa'):
        assert sbs['alone'][v] > 0 and sbs['together'][v] > 0
        assert sbs['ratio'][v] == pytest.approx(sbs['together'][v] / sbs['alone'][v])
    assert json.load(open(tmp_path / 'o' / 'bench.json'))['attention']


@pytest.mark.parametrize('args, message', [
    (['run', 'nope', '--out', '{tmp}/o', '--minutes', '3'], "no queue item 'nope'"),
    (['run', 'vanilla_60m', '--out', '{tmp}/o', '--minutes', '11', '--mini'], '<= 10'),
    (['run', 'vanilla_60m', '--out', '{tmp}/o', '--minutes', 'nan', '--mini'], '<= 10'),
    (['run', 'vanilla_60m', '--out', '{tmp}/file', '--minutes', '3', '--mini'], 'is a file'),
    (['run', 'vanilla_60m', '--out', '{tmp}/full', '--minutes', '3', '--mini'], 'did not write'),
    (['run', 'vanilla_60m', '--out', '{tmp}/w/out', '--minutes', '3', '--mini', '--work', '{tmp}/w'], 'keeps its state'),
    (['run', 'vanilla_60m', '--out', '{tmp}/o', '--minutes', '3'], 'no CUDA GPU here'),
    (['unpack', '{tmp}/empty', '--into', '{tmp}/into'], 'holds no status.json'),
])
def test_bad_input_is_one_line(args, message, tmp_path):
    (tmp_path / 'file').write_text('x')
    (tmp_path / 'full').mkdir()
    (tmp_path / 'full' / 'mine.txt').write_text('keep')
    (tmp_path / 'empty').mkdir()
    r = queue(*[a.format(tmp=tmp_path) for a in args])
    assert r.returncode == 2 and r.stderr.count('\n') == 1 and message in r.stderr, r.stderr
    assert (tmp_path / 'full' / 'mine.txt').read_text() == 'keep'


def test_the_queue_file_lists_every_item_in_order_with_its_command():
    doc = open(os.path.join(ROOT, 'docs', 'gpu-queue.md')).read()
    listed = re.findall(r'python tools/gpu_queue\.py run ([a-z0-9_]+) --out "\$OUT" --minutes', doc)
    assert list(dict.fromkeys(listed)) == [i.name for i in gpu_queue.ITEMS]
    out = queue('next').stdout
    assert 'carry=["data/corpus-archive.jsonl.xz", "data/corpus_cache/gpt2.tiktoken"]' in out or 'every item' in out


def write_pack(path, members):
    """A .tar.gz holding {name: bytes}."""
    import io
    with tarfile.open(path, 'w:gz') as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize('damage, said', [
    ('status cut', 'status.json cannot be read'),
    ('pack cut', 'row-a.tar.gz is damaged or not a pack'),
    ('member outside', 'the member ../../evil.txt lies outside row-b/'),
    ('member escaping', 'the member row-b/../../../evil.txt lies outside row-b/'),
    ('not a tar', 'row-b.tar.gz is damaged or not a pack'),
    ('into a file', 'is a file, not a folder; choose another --into'),
    ('status twice', 'status.json and {src}/vanilla_60m.status.json would both be unpacked as '
                     '{into}/vanilla_60m.status.json'),
    ('a file named runs', 'runs would be unpacked as {into}/runs, the folder the packs unpack into'),
])
def test_unpack_of_damaged_files_is_one_line_and_leaves_nothing(tmp_path, damage, said):
    """Tracebacks, case 12: what a GPU machine can send back damaged (status.json cut in half, a pack cut short, a
    pack with a member ../../evil.txt, a file that is no tar) or an --into that is a file was a traceback, and left a
    half-done unpack in --into. Now one line, exit 2, and --into and the work folder's runs are as they were (every
    pack is unpacked into temporary folders first, moved in only when all are whole)."""
    src, into, work = tmp_path / 'files', tmp_path / 'into', tmp_path / 'here'
    src.mkdir()
    (src / 'status.json').write_text(json.dumps({'item': 'vanilla_60m', 'complete': True}))
    (src / 'bench.log').write_text('measured')
    write_pack(src / 'row-a.tar.gz', {'row-a/log.jsonl': b'{"event": "eval", "iter": 4}\n' * 2000})
    write_pack(src / 'row-b.tar.gz', {'row-b/analysis.json': b'{"ppl": 30.0}'})
    if damage == 'status cut':
        (src / 'status.json').write_bytes((src / 'status.json').read_bytes()[:20])
    elif damage == 'pack cut':
        (src / 'row-a.tar.gz').write_bytes((src / 'row-a.tar.gz').read_bytes()[:200])
    elif damage == 'member outside':
        write_pack(src / 'row-b.tar.gz', {'row-b/analysis.json': b'{}', '../../evil.txt': b'escaped'})
    elif damage == 'member escaping':
        write_pack(src / 'row-b.tar.gz', {'row-b/analysis.json': b'{}', 'row-b/../../../evil.txt': b'escaped'})
    elif damage == 'not a tar':
        (src / 'row-b.tar.gz').write_bytes(b'<html>502 Bad Gateway</html>')
    elif damage == 'status twice':   # two files, one name: the second replaced the real status.json, silently
        (src / 'vanilla_60m.status.json').write_text(json.dumps({'item': 'vanilla_60m', 'complete': False}))
    elif damage == 'a file named runs':   # the packs' folder
        (src / 'runs').write_text('not a folder')
    else:
        into.write_text('mine')
    r = queue('unpack', str(src), '--into', str(into), '--work', str(work))
    said = said.format(src=src, into=into)
    assert r.returncode == 2 and r.stderr.count('\n') == 1 and said in r.stderr and 'Traceback' not in r.stderr, \
        r.stderr
    assert 'nothing was unpacked' in r.stderr or damage == 'into a file'
    assert sorted(os.listdir(tmp_path)) == (['files', 'into'] if damage == 'into a file' else ['files'])
    assert not list(tmp_path.rglob('evil.txt')) and not list(tmp_path.parent.glob('evil.txt'))
    if damage == 'into a file':
        assert into.read_text() == 'mine'


def add_member(tar, name, data=b'', link=None, hard=False):
    import io
    info = tarfile.TarInfo(name)
    if link is not None:
        info.type, info.linkname = tarfile.LNKTYPE if hard else tarfile.SYMTYPE, link
    else:
        info.size = len(data)
    tar.addfile(info, io.BytesIO(data) if link is None else None)


@pytest.mark.parametrize('case', ['item ../..', 'item absolute', 'item folder', 'member absolute', 'member ..',
                                  'member .. inside', 'symlink out', 'symlink in', 'hard link', 'file a link',
                                  'pack name ..'])
def test_unpack_writes_no_name_from_the_pack_outside_into(tmp_path, case):
    """Security: every name taken from the files (status.json's "item", which names INTO/<item>.status.json, each
    pack's members, the files' own names) stays inside --into. A status.json naming "item": "../../evil" wrote
    evil.status.json two folders above --into. Each case is refused in one line (exit 2) and no file appears or
    changes anywhere outside the files' folder."""
    top = tmp_path / 'a' / 'b'
    src, into, work = top / 'files', top / 'into', top / 'here'
    src.mkdir(parents=True)
    (tmp_path / 'secret').write_text('outside')
    item = {'item ../..': '../../evil', 'item absolute': str(tmp_path / 'evil'), 'item folder': 'x/evil'}
    (src / 'status.json').write_text(json.dumps({'item': item.get(case, 'vanilla_60m')}))
    with tarfile.open(src / 'row-b.tar.gz', 'w:gz') as tar:
        add_member(tar, 'row-b/analysis.json', b'{}')
        if case == 'member absolute':
            add_member(tar, str(tmp_path / 'evil.txt'), b'escaped')
        elif case == 'member ..':
            add_member(tar, 'row-b/../../../../../evil.txt', b'escaped')
        elif case == 'member .. inside':          # stays in the staging folder, but lands in another run's folder
            add_member(tar, 'row-b/../row-a/evil.txt', b'escaped')
        elif case in ('symlink out', 'symlink in', 'hard link'):
            target = {'symlink out': str(tmp_path), 'symlink in': '.', 'hard link': 'row-b/analysis.json'}[case]
            add_member(tar, 'row-b/link', link=target, hard=case == 'hard link')
            if case == 'symlink out':
                add_member(tar, 'row-b/link/evil.txt', b'escaped')
    if case == 'file a link':                     # a file of the folder that is a link to one outside it
        (src / 'notes.txt').symlink_to(tmp_path / 'secret')
    if case == 'pack name ..':
        (src / 'row-b.tar.gz').rename(src / '..tar.gz')
    before = {p: p.read_bytes() for p in tmp_path.rglob('*') if p.is_file()}
    r = queue('unpack', str(src), '--into', str(into), '--work', str(work))
    assert r.returncode == 2 and r.stderr.count('\n') == 1 and 'nothing was unpacked' in r.stderr, r.stderr
    assert 'Traceback' not in r.stderr
    assert {p: p.read_bytes() for p in tmp_path.rglob('*') if p.is_file()} == before
    assert not into.exists() and not work.exists() and not list(tmp_path.rglob('*evil*'))


def test_unpack_of_whole_files_puts_each_in_its_place(tmp_path):
    src, into, work = tmp_path / 'files', tmp_path / 'into', tmp_path / 'here'
    src.mkdir()
    (src / 'status.json').write_text(json.dumps({'item': 'vanilla_60m'}))
    (src / 'bench.log').write_text('measured')
    write_pack(src / 'row-a.tar.gz', {'row-a/log.jsonl': b'{"event": "eval", "iter": 4}\n'})
    r = queue('unpack', str(src), '--into', str(into), '--work', str(work))
    assert r.returncode == 0, r.stderr
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob('*') if p.is_file() and 'files' not in p.parts) \
        == ['here/out/reproduce/gpu/runs/row-a/log.jsonl', 'into/bench.log', 'into/runs/row-a/log.jsonl',
            'into/vanilla_60m.status.json']
    assert (into / 'runs' / 'row-a' / 'log.jsonl').read_bytes() == b'{"event": "eval", "iter": 4}\n'


def test_unpack_names_each_file_it_leaves_out(tmp_path):
    """Silent loss: a file named .written-by among the device's files was copied over the staging folder's own mark,
    then skipped as the mark: "unpacked 2 file(s)" and it was nowhere. Every file is unpacked or named in a line
    saying why not; .written-by (fileio.MARK) is left out, since in --into it would claim the folder as a program's."""
    src, into, work = tmp_path / 'files', tmp_path / 'into', tmp_path / 'here'
    src.mkdir()
    (src / 'status.json').write_text(json.dumps({'item': 'vanilla_60m'}))
    (src / 'bench.log').write_text('measured')
    (src / '.written-by').write_text('someone else')
    write_pack(src / 'row-a.tar.gz', {'row-a/log.jsonl': b'{"event": "eval", "iter": 4}\n'})
    r = queue('unpack', str(src), '--into', str(into), '--work', str(work))
    assert r.returncode == 0 and r.stderr == '', r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"left out {src / '.written-by'}: .written-by is the mark"), r.stdout
    assert lines[1].startswith('unpacked 2 file(s) and 1 pack(s) into ') and lines[1].endswith(
        '; 1 file(s) left out (the line(s) above)'), r.stdout
    assert sorted(str(p.relative_to(into)) for p in into.rglob('*') if p.is_file()) == [
        'bench.log', 'runs/row-a/log.jsonl', 'vanilla_60m.status.json']
    assert json.loads((into / 'vanilla_60m.status.json').read_text()) == {'item': 'vanilla_60m'}


def test_carry_refuses_a_file_that_is_not_the_pinned_archive_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    """Surprising exit, case 14: carry --archive <another file> was refused but left that file as
    data/corpus-archive.jsonl.xz, where prepare_c4.py --subset archive then read it. Now it is checked while copied
    to a temporary name, and renamed only when it is the pinned archive: a refusal leaves nothing in data/."""
    monkeypatch.setattr(gpu_queue, 'ROOT', str(tmp_path / 'repo'))   # a fresh clone: no data/ yet
    (tmp_path / 'repo').mkdir()
    (tmp_path / 'other.jsonl.xz').write_bytes(b'not the archive' * 1000)
    code = gpu_queue.main(['carry', '--archive', str(tmp_path / 'other.jsonl.xz')])
    err = capsys.readouterr().err
    assert code == 2 and err.count('\n') == 1 and 'not the pinned archive, nothing was copied' in err, err
    assert sorted(os.listdir(tmp_path)) == ['other.jsonl.xz', 'repo'] and os.listdir(tmp_path / 'repo') == []


def test_a_step_a_signal_stopped_is_recorded_as_stopped_and_run_again(tmp_path):
    """Surprising exit, case 13: train.py and reproduce.py exit 128 + N after a signal N. run_step reads it as a
    stopped step (rc null, stopped_by naming the signal), which the next call runs again, not as a finished one."""
    call = SimpleNamespace(status={'steps': {}}, left=lambda: 60, save=lambda: None)
    for code, rc, stopped in ((143, None, 'SIGTERM'), (130, None, 'SIGINT'), (0, 0, None), (2, 2, None)):
        got = gpu_queue.run_step(call, 'step', [sys.executable, '-c', f'import sys; sys.exit({code})'], 30)
        assert got == rc and call.status['steps']['step'].get('rc') == rc
        assert call.status['steps']['step'].get('stopped_by') == stopped


@pytest.mark.parametrize('args, said', [
    (['--job_minutes', 'nan'], '--job_minutes nan: give a training job\'s minutes, a finite number > 0'),
    (['--job_minutes', 'inf'], '--job_minutes inf: give'),
    (['--job_minutes', '-1'], '--job_minutes -1: give'),
    (['--job_minutes', '0'], '--job_minutes 0: give'),
    (['--dataset', '{tmp}/not_prepared'], '--dataset: {tmp}/not_prepared is not a prepared dataset (no meta.json)'),
    (['--dataset', '{tmp}/missing'], '--dataset: {tmp}/missing is not a prepared dataset (no meta.json)'),
])
def test_options_a_step_would_refuse_are_refused_before_the_call_starts(tmp_path, args, said):
    """Surprising exit: --job_minutes nan (also inf, -1) or a --dataset that is not prepared started reproduce.py,
    which refused it; the call then said "unfinished: call again with the same command" and exited 0, and every call
    after it failed the same way (on a GPU window, the lease burnt in a loop). They are refused first, in one line,
    exit 2, with nothing made: no --out, no status.json, no state on the machine."""
    (tmp_path / 'not_prepared').mkdir()
    r = queue('run', 'vanilla_60m', '--out', str(tmp_path / 'o'), '--minutes', '2', '--mini',
              '--work', str(tmp_path / 'w'), *[a.format(tmp=tmp_path) for a in args])
    said = said.format(tmp=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith('gpu_queue: error: ') and r.stderr.count('\n') == 1 and \
        said in r.stderr, r.stderr
    assert sorted(os.listdir(tmp_path)) == ['not_prepared'] and r.stdout == ''


def test_job_minutes_for_an_item_that_trains_no_row_is_refused(tmp_path):
    r = queue('run', 'gpu_tests', '--out', str(tmp_path / 'o'), '--minutes', '2', '--mini', '--job_minutes', '1')
    assert r.returncode == 2 and r.stderr.count('\n') == 1 and 'gpu_tests trains no row' in r.stderr, r.stderr
    assert not (tmp_path / 'o').exists()


FAKE_CHILD = {   # reproduce.py as a child that ends each way, at once
    'refused': ("print('usage: reproduce.py [-h] TABLE', file=sys.stderr); print('reproduce.py: error: argument "
                "--job_minutes: nan is not allowed: a finite number >= 0', file=sys.stderr); sys.exit(2)"),
    'failed': ("print('[failed] table2-gpt2_60m_vanilla: train failed', file=sys.stderr); "
               "print('reproduce.py: error: 1 run(s) failed: train failed (exit 1: error: resuming on other data); "
               "see train.out', file=sys.stderr); print('a last line', file=sys.stderr); sys.exit(1)"),
    'stopped': "print('reproduce.py: stopped by SIGTERM', file=sys.stderr); sys.exit(143)",
    'time budget': "print('[unfinished] table2-gpt2_60m_vanilla: 1 training job(s) ran', file=sys.stderr)",
}


def fake_call(monkeypatch, capsys, bb, out, work, child):
    """One --mini call of vanilla_60m in this process, its reproduce.py child a fake that ends as `child` says:
    (main's exit code, its stdout, its stderr, status.json)."""
    child_cmd = [sys.executable, '-c', 'import sys; ' + FAKE_CHILD[child]]
    monkeypatch.setattr(gpu_queue, 'repro_args', lambda call: child_cmd)
    capsys.readouterr()
    code = gpu_queue.main(['run', 'vanilla_60m', '--out', str(out), '--minutes', '1', '--mini', '--work', str(work),
                           '--dataset', bb, '--commit', 'test'])
    captured = capsys.readouterr()
    return code, captured.out, captured.err, status(out)


@pytest.mark.parametrize('child, error', [
    ('refused', 'reproduce.py: error: argument --job_minutes: nan is not allowed: a finite number >= 0'),
    ('failed', 'reproduce.py: error: 1 run(s) failed: train failed (exit 1: error: resuming on other data); see '
               'train.out'),
])
def test_a_step_that_fails_is_a_failure_not_unfinished_work(bb, tmp_path, monkeypatch, capsys, child, error):
    """Surprising exit: a reproduce.py child that refused (exit 2) or failed (exit 1) read as unfinished work: "call
    N unfinished: call again with the same command", exit 0, and the same failure at every call after it. Now the
    call fails: one line quoting the child's own error line, exit 1, status.json's outcome "failed", "failed" naming
    the step, its exit and its line, and "next" saying to fix it rather than call again. A call after the fix
    starts clean (no earlier "failed")."""
    rc = 2 if child == 'refused' else 1
    code, out, err, s = fake_call(monkeypatch, capsys, bb, tmp_path / 'o1', tmp_path / 'w', child)
    mine = [line for line in err.splitlines() if line.startswith('gpu_queue')]
    assert code == 1 and mine == [f"gpu_queue: error: reproduce gpt2_60m_vanilla failed (exit {rc}): {error}; fix "
                                  f"that, then run the same command (as it is, it fails the same way)"], err
    assert error in err.splitlines() and 'unfinished' not in out + err   # the child's lines, relayed as they came
    assert (s['complete'], s['calls'][-1]['outcome'], s['next']) == (False, 'failed', gpu_queue.FIX_NEXT)
    assert s['failed'] == [{'step': 'reproduce gpt2_60m_vanilla', 'rc': rc, 'error': error}]
    assert s['error'] == mine[0][len('gpu_queue: error: '):]
    assert s['steps']['reproduce gpt2_60m_vanilla'] | {'seconds': 0} == {'rc': rc, 'seconds': 0, 'error': error}
    code, out, err, s = fake_call(monkeypatch, capsys, bb, tmp_path / 'o2', tmp_path / 'w', 'time budget')
    assert code == 0 and 'failed' not in s and 'error' not in s and [c['outcome'] for c in s['calls']] == [
        'failed', 'unfinished']
    assert s['next'] == 'call again with the same command'


@pytest.mark.parametrize('child, stopped_by', [('stopped', 'SIGTERM'), ('time budget', None)])
def test_a_step_stopped_or_out_of_time_is_unfinished_work(bb, tmp_path, monkeypatch, capsys, child, stopped_by):
    """A step a signal stopped (exit 128 + N) and a training job whose time budget ran out (exit 0, the row not
    finished) stay what they were: unfinished, exit 0, "call again with the same command"."""
    code, out, err, s = fake_call(monkeypatch, capsys, bb, tmp_path / 'o', tmp_path / 'w', child)
    assert code == 0 and 'gpu_queue: error' not in err and 'unfinished: call again with the same command' in out
    assert (s['complete'], s['calls'][-1]['outcome'], s['next']) == (False, 'unfinished',
                                                                     'call again with the same command')
    assert 'failed' not in s and 'error' not in s
    step = s['steps']['reproduce gpt2_60m_vanilla']
    assert step['rc'] == (None if stopped_by else 0) and step.get('stopped_by') == stopped_by and 'error' not in step


def test_error_line_is_the_step_s_last_error_line():
    assert error_line(['usage: x\n', 'reproduce.py: error: argument --n: bad\n', 'then\n']) == \
        'reproduce.py: error: argument --n: bad'
    assert error_line(['error: resuming on other data\n', '\n']) == 'error: resuming on other data'
    traceback = ['Traceback (most recent call last):\n', 'RuntimeError: boom\n']
    assert error_line(traceback) == 'RuntimeError: boom'
    assert error_line([]) == '(it printed nothing)'
