"""fsdp=True (harness/fsdp.py): FSDP2 on 2 CPU ranks (gloo, torchrun) against one process with the same global batch,
OrthoAdam on shards against dense Algorithm 1, sharded save and exact resume, resharding, a rank killed during a
save, the one-line refusals, and reproduce.py's plan."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from harness import fsdp  # noqa: E402
import train  # noqa: E402

pytestmark = pytest.mark.slow   # torchrun with 2 CPU ranks

TORCHRUN = ['-m', 'torch.distributed.run', '--standalone']


def run_cli(*args, timeout=300):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, OMP_NUM_THREADS='1'))


def tiny(data, out, *extra):
    return [os.path.join('config', 'tiny_cpu.py'), f'--dataset={data}', f'--out_dir={out}', '--n_embd=32',
            '--block_size=32', '--batch_size=4', '--gradient_accumulation_steps=2', '--max_iters=4',
            '--eval_tokens=2080', '--log_interval=1', '--eval_interval=4', *extra]   # 65 windows: ranks get 33 and 32


def ranks(n, *args):
    r = run_cli(*TORCHRUN, f'--nproc_per_node={n}', *args)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-6000:]
    return r


def ckpt(out):
    return torch.load(os.path.join(out, 'ckpt.pt'), map_location='cpu', weights_only=False)


def val_losses(out):
    import json
    return [json.loads(line)['val_loss'] for line in open(os.path.join(out, 'log.jsonl')) if '"eval"' in line]


def test_orthoadam_on_every_cut_of_a_parameter_equals_dense_algorithm1():
    """Cut along an unrotated axis (local rotation, uneven shards too) or along a rotated one (the gathered step):
    three steps equal Algorithm 1 with the dense Kronecker Q to float32 rounding."""
    r = ranks(2, os.path.join('tests', 'fsdp_orthoadam_worker.py'))
    cases = dict(line.split()[1:] for line in r.stdout.splitlines() if line.startswith('case '))
    assert len(cases) == 8, r.stdout
    for name, diff in cases.items():
        assert float(diff) < 2e-6, (name, diff)


def test_shard_axes_keep_orthoadam_rotations_whole():
    cfg = {'optimizer': 'orthoadam', 'orthoadam_rotation': 'hadamard', 'orthoadam_axes': 'residual',
           'orthoadam_vocab_axis': 'skip', 'n_embd': 64}
    assert fsdp.shard_axis((192, 64), cfg, 'transformer.h.0.attn.c_attn.weight', 2) == 0   # axis 1 rotated
    assert fsdp.shard_axis((64, 256), cfg, 'transformer.h.0.mlp.c_proj.weight', 2) == 1    # axis 0 rotated
    assert fsdp.shard_axis((64, 64), cfg, 'transformer.h.0.attn.c_proj.weight', 2) == 0    # both: gathered step
    assert fsdp.shard_axis((50304, 64), cfg, 'transformer.wte.weight', 2) == 0
    assert fsdp.shard_axis((64, 256), dict(cfg, optimizer='adamw'), 'x', 2) == 0


@pytest.mark.parametrize('optimizer', ['adamw', 'orthoadam', 'orthoadam --norm=rmsnorm_single --bias=False --attn=softmax1'])
def test_fsdp_on_two_ranks_matches_one_process(bigram_data, tmp_path, optimizer):
    """Same global batch: the 2 ranks each take one of the 2 micro-batches; gradients are reduce-scattered instead of
    summed in one process, so weights agree to float32 rounding (not bit for bit: the summation order differs)."""
    one, two = str(tmp_path / 'one'), str(tmp_path / 'two')
    args = f'--optimizer={optimizer}'.split()   # the paper's GPT-2: one-element RMSNorm scales (a shard is empty)
    r1 = run_cli('train.py', *tiny(bigram_data, one, *args))
    assert r1.returncode == 0, r1.stderr
    r2 = ranks(2, 'train.py', *tiny(bigram_data, two, *args, '--fsdp=True'))
    assert 'peak memory rank 0: ' in r2.stdout and 'peak memory rank 1: ' in r2.stdout
    a, b = ckpt(one), ckpt(two)
    assert b['optimizer'] is None and b['sharded'] == {'dir': 'ckpt.dcp-4', 'world': 2}
    assert os.path.isfile(os.path.join(two, 'ckpt.dcp-4', '.metadata'))
    assert a['model'].keys() == b['model'].keys()
    for k in a['model']:
        assert torch.allclose(a['model'][k], b['model'][k], atol=1e-5), k
    assert val_losses(one)[-1] == pytest.approx(val_losses(two)[-1], rel=2e-3)
    assert val_losses(one)[-1] < val_losses(one)[0]   # it trained


def test_sharded_resume_is_exact_reshards_and_is_read_by_analyze(bigram_data, tmp_path):
    straight, split, one_rank = (str(tmp_path / d) for d in ('straight', 'split', 'one_rank'))
    common = ['--optimizer=orthoadam', '--fsdp=True', '--weight_decay=0.1']
    ranks(2, 'train.py', *tiny(bigram_data, straight, *common, '--max_iters=8', '--lr_decay_iters=8'))
    ranks(2, 'train.py', *tiny(bigram_data, split, *common, '--lr_decay_iters=8'))
    shutil.copytree(split, one_rank)
    ranks(2, 'train.py', *tiny(bigram_data, split, *common, '--max_iters=8', '--init_from=resume'))
    a, b = ckpt(straight), ckpt(split)
    for k in a['model']:
        assert torch.equal(a['model'][k], b['model'][k]), k
    assert sorted(e for e in os.listdir(split) if e.startswith('ckpt.dcp')) == ['ckpt.dcp-8']   # the old one removed
    # the 2-rank shards read by 1 rank (DCP reshards): the same run to float32 rounding
    ranks(1, 'train.py', *tiny(bigram_data, one_rank, *common, '--max_iters=8', '--init_from=resume'))
    for k in a['model']:
        assert torch.allclose(a['model'][k], ckpt(one_rank)['model'][k], atol=1e-5), k
    r = run_cli('analyze.py', '--ckpt', split, '--max_docs', '4', '--device', 'cpu')
    assert r.returncode == 0, r.stderr[-3000:]
    # without fsdp the optimizer state (in the shards) cannot be read: one line
    r = run_cli('train.py', *tiny(bigram_data, split, '--optimizer=orthoadam', '--weight_decay=0.1', '--max_iters=9',
                                  '--lr_decay_iters=8', '--init_from=resume'))
    assert r.returncode == 2 and r.stderr.count('\n') == 1 and '--fsdp=True' in r.stderr, r.stderr


KILLER = '''import os, sys
sys.path.insert(0, {root!r})
import torch.distributed.checkpoint as dcp
import train
original, calls = dcp.save, []

def save(state, checkpoint_id):   # rank 1 dies half-way through the second sharded save
    calls.append(checkpoint_id)
    if len(calls) == 2 and os.environ['RANK'] == '1':
        os.makedirs(checkpoint_id, exist_ok=True)
        open(os.path.join(checkpoint_id, '__1_0.distcp'), 'wb').write(b'half a shard')
        os._exit(9)
    return original(state, checkpoint_id=checkpoint_id)
dcp.save = save
sys.exit(train.main(sys.argv[1:]))
'''


def test_a_rank_killed_during_a_sharded_save_leaves_the_last_checkpoint(bigram_data, tmp_path):
    out, script = str(tmp_path / 'run'), tmp_path / 'killer.py'
    script.write_text(KILLER.format(root=ROOT))
    args = tiny(bigram_data, out, '--optimizer=orthoadam', '--fsdp=True', '--max_iters=8', '--lr_decay_iters=8')
    r = run_cli(*TORCHRUN, '--nproc_per_node=2', str(script), *args)
    assert r.returncode != 0
    saved = ckpt(out)
    assert saved['iter_num'] == 4 and saved['sharded']['dir'] == 'ckpt.dcp-4'
    killed = [e for e in os.listdir(out) if re.fullmatch(r'ckpt\.dcp-8\.[0-9a-f]{8}\.tmp', e)]
    assert len(killed) == 1 and os.path.isdir(os.path.join(out, killed[0]))   # the killed save, never renamed
    r = ranks(2, 'train.py', *args, '--init_from=resume')
    assert 'left by an interrupted save' in r.stdout
    assert ckpt(out)['iter_num'] == 8
    assert sorted(e for e in os.listdir(out) if e.startswith('ckpt.dcp')) == ['ckpt.dcp-8']


def snapshot(folder):
    """{relative path: bytes} of every file under folder (the lock's holder line aside)."""
    found = {}
    for root, _, names in os.walk(folder):
        for name in names:
            if name != '.lock':
                path = os.path.join(root, name)
                found[os.path.relpath(path, folder)] = open(path, 'rb').read()
    return found


def one_error_line(r, *words):
    """What a user sees of a refused torchrun: rank 0's one `error:` line, no traceback from the ranks (torchrun's
    own failure summary comes after)."""
    lines = [x for x in r.stderr.splitlines() if x.startswith('error: ')]
    children = r.stderr.split('failed (exitcode: 2)')[0]
    assert r.returncode != 0 and len(lines) == 1 and 'Traceback' not in children, r.stderr[-4000:]
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


def test_best_pt_of_an_fsdp_run_resumes_and_broken_shards_are_one_line(bigram_data, tmp_path):
    """Issue 36, cases 20 and 22. best.pt of an fsdp run names the sharded folder of its iteration, which is kept
    while it does: `cp best.pt ckpt.pt`, then --init_from=resume continues from it under fsdp (it was an
    AttributeError, and fsdp=True advised fsdp=False); without fsdp the line says to use fsdp=True. A file of weights
    only, a truncated shard, a shard damaged inside: one line (no rank traceback), out_dir unchanged."""
    base = str(tmp_path / 'base')
    common = ['--optimizer=orthoadam', '--eval_interval=2', '--learning_rate=0.02', '--warmup_iters=0',
              '--decay_lr=False', '--divergence_factor=0']   # val loss at 0, 2, 4: 4.16, 4.03, 4.11 (best at 2)
    ranks(2, 'train.py', *tiny(bigram_data, base, *common, '--fsdp=True'))
    best = torch.load(os.path.join(base, 'best.pt'), weights_only=False)
    assert best['iter_num'] == 2 and best['sharded'] == {'dir': 'ckpt.dcp-2', 'world': 2}
    assert sorted(e for e in os.listdir(base) if e.startswith('ckpt.dcp')) == ['ckpt.dcp-2', 'ckpt.dcp-4']

    from_best = str(tmp_path / 'from_best')
    shutil.copytree(base, from_best)
    shutil.copy(os.path.join(from_best, 'best.pt'), os.path.join(from_best, 'ckpt.pt'))
    r = run_cli('train.py', *tiny(bigram_data, from_best, *common, '--max_iters=6', '--init_from=resume'))
    assert r.returncode == 2 and r.stderr.count('\n') == 1 and '--fsdp=True' in r.stderr, r.stderr
    ranks(2, 'train.py', *tiny(bigram_data, from_best, *common, '--fsdp=True', '--max_iters=6', '--init_from=resume'))
    assert ckpt(from_best)['iter_num'] == 6
    resumed = [json.loads(line) for line in open(os.path.join(from_best, 'log.jsonl'))]
    assert [e['iter'] for e in resumed if e['event'] == 'train'][-2:] == [5, 6]   # trained on from iteration 2

    weights_only = str(tmp_path / 'weights_only')   # e.g. save_every's ckpt_<iter>.pt of an fsdp run, copied
    shutil.copytree(base, weights_only)
    torch.save(dict(best, sharded=None), os.path.join(weights_only, 'ckpt.pt'))
    before = snapshot(weights_only)
    r = run_cli('train.py', *tiny(bigram_data, weights_only, *common, '--max_iters=6', '--init_from=resume'))
    assert r.returncode == 2 and r.stderr.count('\n') == 1 and 'holds the weights only' in r.stderr, r.stderr
    assert snapshot(weights_only) == before

    for damage in ('truncate', 'scramble'):
        broken = str(tmp_path / damage)
        shutil.copytree(base, broken)
        shard = os.path.join(broken, 'ckpt.dcp-4', '__0_0.distcp')
        data = bytearray(open(shard, 'rb').read())
        if damage == 'truncate':
            data = data[:1000]
        else:                       # the same size, bytes changed inside: found only when DCP reads it
            data[100:-100] = bytes(len(data) - 200)
        open(shard, 'wb').write(bytes(data))
        before = snapshot(broken)
        r = run_cli(*TORCHRUN, '--nproc_per_node=2', 'train.py',
                    *tiny(bigram_data, broken, *common, '--fsdp=True', '--max_iters=6', '--init_from=resume'))
        line = one_error_line(r, 'ckpt.dcp-4')
        assert ('truncated' if damage == 'truncate' else 'damaged') in line, line
        after = snapshot(broken)
        assert {k: v for k, v in after.items() if k != 'config.json'} == {
            k: v for k, v in before.items() if k != 'config.json'}     # every checkpoint and shard as it was
        if damage == 'truncate':    # found before anything is written
            assert after == before


def test_a_chain_job_starting_on_an_evaluation_writes_best_pt_naming_the_shards_it_resumed(bigram_data, tmp_path):
    """Issue 36, case 5 under fsdp: job 1 stops at iteration 1 (an evaluation iteration, eval_interval=1), job 2
    evaluates it first and, as it improved, writes ckpt.pt and best.pt there without a second sharded save (the
    state is the one ckpt.pt's shards hold), then stops at 2: best.pt is iteration 1 and names ckpt.dcp-1, kept
    beside ckpt.pt's ckpt.dcp-2."""
    out = str(tmp_path / 'chain')
    args = tiny(bigram_data, out, '--fsdp=True', '--max_iters=3', '--eval_interval=1', '--warmup_iters=0',
                '--learning_rate=0.02', '--decay_lr=False', '--init_from=auto', '--max_minutes=1e-9')
    ranks(2, 'train.py', *args)
    written = os.stat(os.path.join(out, 'ckpt.dcp-1', '.metadata')).st_mtime_ns
    ranks(2, 'train.py', *args)
    assert os.stat(os.path.join(out, 'ckpt.dcp-1', '.metadata')).st_mtime_ns == written   # not saved again
    evals = {e['iter']: e['val_loss'] for e in map(json.loads, open(os.path.join(out, 'log.jsonl')))
             if e['event'] == 'eval'}
    assert sorted(evals) == [0, 1] and evals[1] < evals[0]
    best = torch.load(os.path.join(out, 'best.pt'), weights_only=False)
    assert best['iter_num'] == 1 and best['best_val_loss'] == evals[1] and best['sharded']['dir'] == 'ckpt.dcp-1'
    assert ckpt(out)['iter_num'] == 2 and ckpt(out)['sharded']['dir'] == 'ckpt.dcp-2'
    assert sorted(e for e in os.listdir(out) if e.startswith('ckpt.dcp')) == ['ckpt.dcp-1', 'ckpt.dcp-2']


DISK_FULL = '''import errno, os, sys
sys.path.insert(0, {root!r})
import torch.distributed.checkpoint.filesystem as filesystem
from harness import runs
import train
where, rank, calls = {where!r}, os.environ['RANK'], []

def full():
    raise OSError(errno.ENOSPC, 'No space left on device')
write_files, save = filesystem._write_files_from_queue, runs.torch.save

def write_files_on_a_full_disk(*a, **k):   # rank 1's shard of the second sharded save (iteration 4)
    calls.append(1)
    if len(calls) == 2 and rank == '1':
        full()
    return write_files(*a, **k)

def save_on_a_full_disk(obj, f, *a, **k):    # rank 0's ckpt.pt of iteration 4, after its shards were written
    if rank == '0' and isinstance(obj, dict) and obj.get('iter_num') == 4 and os.path.basename(
            str(getattr(f, 'name', ''))).startswith('ckpt.pt.'):   # torch.save itself: all_gather_object's pass through
        full()
    return save(obj, f, *a, **k)
if where == 'shards':
    filesystem._write_files_from_queue = write_files_on_a_full_disk
else:
    runs.torch.save = save_on_a_full_disk
sys.exit(train.main(sys.argv[1:]))
'''


@pytest.mark.parametrize('where', ['shards', 'ckpt.pt'])
def test_a_full_disk_during_an_fsdp_save_is_one_line_and_keeps_the_last_checkpoint(bigram_data, tmp_path, where):
    """Issue 36, case 21: the disk fills during the second sharded save (on rank 1), or while rank 0 writes ckpt.pt
    after it: one line on every rank's behalf, exit 2, ckpt.pt and the shards it names as the first save left them,
    no ckpt.dcp-*.tmp left; the same command continues once there is space (and removes the unnamed ckpt.dcp-4 that
    rank 0's failed ckpt.pt left)."""
    out, script = str(tmp_path / 'run'), tmp_path / 'full.py'
    script.write_text(DISK_FULL.format(root=ROOT, where=where))
    args = tiny(bigram_data, out, '--fsdp=True', '--max_iters=4', '--eval_interval=2', '--lr_decay_iters=4')
    r = run_cli(*TORCHRUN, '--nproc_per_node=2', str(script), *args)
    one_error_line(r, 'is full', 'ckpt.pt (iteration 2) is kept')
    assert ckpt(out)['iter_num'] == 2 and ckpt(out)['sharded']['dir'] == 'ckpt.dcp-2'
    assert os.path.isfile(os.path.join(out, 'ckpt.dcp-2', '.metadata'))
    assert not [e for e in os.listdir(out) if e.endswith('.tmp')], os.listdir(out)
    assert os.path.isdir(os.path.join(out, 'ckpt.dcp-4')) == (where == 'ckpt.pt')   # complete, named by no file
    if where == 'shards':
        return   # one resume (20 s of torchrun) is enough: the other case's, which has an unnamed folder to replace
    ranks(2, 'train.py', *args, '--init_from=resume')
    assert ckpt(out)['iter_num'] == 4
    assert sorted(e for e in os.listdir(out) if e.startswith('ckpt.dcp')) == ['ckpt.dcp-4']


def test_bad_launches_are_one_line(bigram_data, tmp_path, capsys, monkeypatch):
    base = tiny(bigram_data, str(tmp_path / 'x'), '--fsdp=True')
    assert train.main(base) == 2
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and 'torchrun' in err
    monkeypatch.setenv('RANK', '0')   # as under torchrun; refused before the rendezvous
    assert train.main(base + ['--optimizer=muon']) == 2
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and "optimizer='muon'" in err
    assert not os.path.exists(str(tmp_path / 'x'))


def test_reproduce_uses_fsdp_for_the_1p4b_rows_on_several_gpus(tmp_path):
    r = run_cli('reproduce.py', 'table2', '--rows', 'gpt2_1.4b', 'gpt2_350m', '--nproc', '8', '--dry_run',
                '--out', str(tmp_path))
    assert r.returncode == 0, r.stderr
    trains = [line for line in r.stdout.splitlines() if 'train.py' in line]
    assert len(trains) == 4
    assert all(('--fsdp=True' in line) == ('gpt2_1.4b' in line) for line in trains)
    r = run_cli('reproduce.py', 'table2', '--rows', 'gpt2_1.4b', '--dry_run', '--out', str(tmp_path))
    assert r.returncode == 0 and '--fsdp=True' not in r.stdout   # one process: nothing to shard


# train.main under torchrun, then what a rank's process still holds: the names of its native threads
EXIT_PROBE = '''import os, sys
sys.path.insert(0, {root!r})
import train
code = train.main(sys.argv[1:])
left = sorted(open('/proc/self/task/%s/comm' % t).read().strip() for t in os.listdir('/proc/self/task'))
print('rank', os.environ['RANK'], 'threads after main:', ' '.join(left), flush=True)
sys.exit(code)
'''


@pytest.mark.skipif(not os.path.isdir('/proc/self/task'), reason='reads the threads of the process from /proc (Linux)')
def test_no_thread_of_the_process_groups_outlives_main(bigram_data, tmp_path):
    """The abort after a successful fsdp run ('terminate called without an active exception', exit -6, under load):
    destroy_process_group left gloo's group alive, held by the finished run's device mesh (which DTensor's caches keep),
    so its worker threads (pt_gloo_runloop) and TCP loop (gloo_tcp_loop) ran into interpreter finalisation, where a
    worker releasing a finished collective's tensor needs the GIL and is ended mid-C++. devices.teardown joins them
    before main returns: no gloo thread may be left (before the fix: three on every rank, every time)."""
    script = tmp_path / 'probe.py'
    script.write_text(EXIT_PROBE.format(root=ROOT))
    r = ranks(2, str(script), *tiny(bigram_data, str(tmp_path / 'run'), '--fsdp=True'))
    lines = [x for x in r.stdout.splitlines() if 'threads after main:' in x]
    assert len(lines) == 2 and 'done: val ppl' in r.stdout, r.stdout[-2000:]
    assert not any('gloo' in x for x in lines), lines


# rank 1 killed (SIGKILL) in the middle of training; rank 0 blocks torchrun's SIGTERM so that it always meets the
# lost peer in its next collective (otherwise whether it is stopped first or sees the lost peer first is a race)
KILL_RANK_1 = '''import os, signal, sys
sys.path.insert(0, {root!r})
import train
if os.environ['RANK'] == '0':
    signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGTERM}})
step = train.optimisation_step
def killing_step(r, *args):
    if r.iter_num == 3 and os.environ['RANK'] == '1':
        os.kill(os.getpid(), signal.SIGKILL)
    return step(r, *args)
train.optimisation_step = killing_step
sys.exit(train.main(sys.argv[1:]))
'''

# the same, and rank 0 then receives SIGTERM as its teardown starts (torchrun's, as it stops the survivors): after its
# error line a signal must not raise (it did inside a finalizer: "Exception ignored in ... harness.entry.Stopped")
TERM_IN_TEARDOWN = KILL_RANK_1.replace("train.optimisation_step = killing_step", """train.optimisation_step = killing_step
teardown = train.teardown
def terminated_teardown():
    if os.environ['RANK'] == '0':
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGTERM}})
        os.kill(os.getpid(), signal.SIGTERM)
    teardown()
train.teardown = terminated_teardown""")

# every rank fails at the same step; rank 0 is slow to report it, so rank 1 would exit first
FAIL_EVERYWHERE = '''import os, sys, time
sys.path.insert(0, {root!r})
import train
from harness.train_config import TrainingError
report = train.report_error
def slow_report(text):
    if os.environ['RANK'] == '0':
        time.sleep(3)
    report(text)
train.report_error = slow_report
def failing_step(r, *args):
    raise TrainingError('injected failure at iteration %d' % r.iter_num)
train.optimisation_step = failing_step
sys.exit(train.main(sys.argv[1:]))
'''


def test_a_killed_rank_and_a_failure_on_every_rank_are_one_line(bigram_data, tmp_path):
    """A rank killed mid-training: the survivor's collective fails with gloo's 'Connection reset/closed by peer',
    which is one line naming the lost contact and how to continue (it was a traceback). Every rank failing at once
    with rank 0 slower to print: rank 1 waits for rank 0's line (devices.report_error) instead of exiting first and
    having torchrun stop rank 0 before it printed."""
    for name, script, words in (('killed', KILL_RANK_1, ('lost contact', '--init_from=resume')),
                                ('sigterm_in_teardown', TERM_IN_TEARDOWN, ('lost contact', '--init_from=resume')),
                                ('everywhere', FAIL_EVERYWHERE, ('injected failure at iteration 0',))):
        path = tmp_path / f'{name}.py'
        path.write_text(script.format(root=ROOT))
        r = run_cli(*TORCHRUN, '--nproc_per_node=2', str(path),
                    *tiny(bigram_data, str(tmp_path / name), '--fsdp=True', '--max_iters=8', '--eval_interval=100'))
        ranks_said = r.stderr.split('failed (exitcode: ')[0]   # before torchrun's own summary (and its traceback)
        lines = [x for x in r.stderr.splitlines() if x.startswith('error: ')]
        assert r.returncode != 0 and len(lines) == 1 and 'Traceback' not in ranks_said, r.stderr[-4000:]
        assert 'Exception ignored' not in ranks_said and 'Stopped' not in ranks_said, r.stderr[-4000:]
        assert all(w in lines[0] for w in words), lines[0]
