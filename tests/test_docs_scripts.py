"""The scripts under docs/ (bb_onset.py, speed_public_model.py, probe_cost.py, front_figure.py) held to the top-level
scripts' standard (docs/guarantees.md, "How every script ends"), walked as a user walks them: a subprocess started
from the repository root or from docs/ itself. Each mistake is one line on stderr and a non-zero exit, never a
traceback; their inputs are this repository's wherever the command runs. No test loads a model or trains: each case
fails within seconds of the script's imports, or (bb_onset.py) draws its figure from a few committed log lines.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, write_dataset

DOCS = os.path.join(ROOT, 'docs')
PILOTS = os.path.join(DOCS, 'results', '2026-11-28-bb512')   # bb_onset.py's default RESULTS, with the committed figure
EMPTY = 'an empty path is not allowed (an unset shell variable?); give a path'


def run(script, *args, cwd=ROOT):
    """`python docs/SCRIPT ARGS` as a user types it in cwd (the script's path relative to it: `python SCRIPT` in
    docs/)."""
    path = os.path.relpath(os.path.join(DOCS, script), cwd)
    env = dict(os.environ, HF_HUB_OFFLINE='1', OMP_NUM_THREADS='1')   # a model name is looked up on this machine only
    return subprocess.run([sys.executable, path, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def said(r, code):
    """The one line r printed on stderr, after checking it exited with `code` and printed no traceback. An argparse
    error is the project's usual one line too: its usage (wrapped lines indented) comes before it."""
    assert 'Traceback' not in r.stderr and r.returncode == code, (r.returncode, r.stderr)
    lines = r.stderr.splitlines()
    if lines and lines[0].startswith('usage: '):
        lines = lines[1:]
        while lines and lines[0].startswith(' '):
            lines = lines[1:]
    assert len(lines) == 1, r.stderr
    return lines[0]


def unchanged(path):
    """(bytes, mtime) of a tracked file, to show a refused command wrote nothing over it."""
    with open(path, 'rb') as f:
        return f.read(), os.stat(path).st_mtime_ns


# ----------------------------------------------------------------------------- bb_onset.py
def pilot_log(tmp_path, run_name, lines):
    """RESULTS/pilots/<run_name>/log.jsonl under tmp_path holding `lines` (text, as written); returns RESULTS."""
    folder = tmp_path / 'results' / 'pilots' / run_name
    folder.mkdir(parents=True)
    (folder / 'log.jsonl').write_text(lines)
    return tmp_path / 'results'


def committed_log(run_name='bf16_s1337'):
    with open(os.path.join(PILOTS, 'pilots', run_name, 'log.jsonl')) as f:
        return f.read().splitlines(keepends=True)


def test_bb_onset_skips_the_line_a_killed_run_cut(tmp_path):
    """A log.jsonl whose last line a kill cut short (train.py appends a line per evaluation; a resumed run goes on
    after it) was a JSONDecodeError traceback. Now that line is skipped, as harness.recipe.run_state skips it, with
    one warning naming the file and the line, and the run is drawn from the rest."""
    lines = committed_log()
    results = pilot_log(tmp_path, 'bf16_s1337', ''.join(lines[:-1]) + lines[-1][:len(lines[-1]) // 2])
    out = tmp_path / 'onset.png'
    r = run('bb_onset.py', results, '--out', out)
    assert r.returncode == 0 and 'Traceback' not in r.stderr, r.stderr
    log = results / 'pilots' / 'bf16_s1337' / 'log.jsonl'
    assert r.stderr == f"bb_onset.py: warning: {log} line {len(lines)}: not JSON (cut by a killed run?), skipped\n"
    assert '| ours, seed 1337 (bf16) | 0.022 | 0.016 |' in r.stdout and out.stat().st_size > 0


def test_bb_onset_leaves_out_a_log_older_than_its_probe_key(tmp_path):
    """A log whose probes have no first_attn_mass_nontrigger (train.py's older probes) was a KeyError traceback. Now
    each such probe is skipped with one warning for the file; a run left without probes is left out of the table and
    the figure, the other runs drawn."""
    lines, probes = [], 0
    for line in committed_log():
        e = json.loads(line)
        if 'probe' in e:
            del e['probe']['first_attn_mass_nontrigger']
            probes += 1
        lines.append(json.dumps(e) + '\n')
    results = pilot_log(tmp_path, 'bf16_s1337', ''.join(lines))
    out = tmp_path / 'onset.png'
    r = run('bb_onset.py', results, '--out', out)
    assert r.returncode == 0 and 'Traceback' not in r.stderr, r.stderr
    log = results / 'pilots' / 'bf16_s1337' / 'log.jsonl'
    assert r.stderr == (f"bb_onset.py: warning: {log}: {probes} probes without first_attn_mass_nontrigger (a log older "
                        f"than that key), skipped; the run is left out\n")
    assert 'ours, seed 1337' not in r.stdout and '| Guo et al., released (seed 42) |' in r.stdout
    assert out.stat().st_size > 0


@pytest.mark.parametrize('bad, shown', [('25 abc 9.8 218s\n', '25 abc 9.8 218s'),   # not a number
                                        ('25 0.0203', '25 0.0203')])                 # cut short: two numbers
def test_bb_onset_names_the_file_and_line_of_a_bad_guo_log(tmp_path, bad, shown):
    """A line of guo_code/seed42.log that is not `step attention value-norm seconds` was a ValueError (or
    IndexError) traceback. Now one line names the file and the line, and nothing is drawn."""
    (tmp_path / 'results' / 'pilots').mkdir(parents=True)
    (tmp_path / 'results' / 'guo_code').mkdir()
    log = tmp_path / 'results' / 'guo_code' / 'seed42.log'
    log.write_text('0 0.0227 9.04 1s\n' + bad)
    out = tmp_path / 'onset.png'
    r = run('bb_onset.py', tmp_path / 'results', '--out', out)
    assert said(r, 1) == (f"bb_onset.py: error: {log} line 2: {shown!r} is not guo_ab.py's `step attention "
                          f"value-norm seconds`; remove that line (or run guo_ab.py again)")
    assert not out.exists()


def test_bb_onset_refuses_an_empty_out():
    """`--out ""` (an unset shell variable) quietly meant the default, RESULTS/onset.png: the committed figure was
    rewritten. Now it is refused as every script refuses an empty path (fileio.path_arg), and nothing is written."""
    before = unchanged(os.path.join(PILOTS, 'onset.png'))
    assert said(run('bb_onset.py', '--out', ''), 2) == f"bb_onset.py: error: argument --out: {EMPTY}"
    assert unchanged(os.path.join(PILOTS, 'onset.png')) == before


def test_bb_onset_finds_the_repository_s_results_from_docs(tmp_path):
    """`cd docs && python bb_onset.py` looked for docs/results/... under docs/ and said there was no pilots/ folder.
    The default RESULTS is now the repository's wherever the command runs: here it is found, and the one line is
    about the --out given (a path under a file), checked before anything is read or drawn."""
    (tmp_path / 'file').write_text('')
    r = run('bb_onset.py', '--out', tmp_path / 'file' / 'onset.png', cwd=DOCS)
    assert said(r, 1) == (f"bb_onset.py: error: --out {tmp_path / 'file' / 'onset.png'}: {tmp_path / 'file'} is a "
                          f"file, not a folder; choose another --out")


@pytest.mark.slow   # the whole figure again (~5 s of CPU, 12 s on a busy machine): a guard of the committed output
def test_bb_onset_from_docs_draws_the_committed_figure_byte_for_byte(tmp_path):
    """Run from docs/ with the default inputs, bb_onset.py draws the committed onset.png: the same bytes with the
    matplotlib that drew it (the PNG names it), the same pixels otherwise."""
    import numpy as np
    import matplotlib
    from PIL import Image
    out = tmp_path / 'onset.png'
    r = run('bb_onset.py', '--out', out, cwd=DOCS)
    assert r.returncode == 0 and r.stderr == '', r.stderr
    assert '| ours, seed 1337 (bf16) | 0.022 | 0.016 | 0.023 | 0.025 | 0.028 | 0.047 | 0.156 |' in r.stdout
    tracked = os.path.join(PILOTS, 'onset.png')
    if matplotlib.__version__ in Image.open(tracked).info.get('Software', ''):
        assert out.read_bytes() == open(tracked, 'rb').read()
    else:
        assert np.array_equal(np.asarray(Image.open(out)), np.asarray(Image.open(tracked)))


# ----------------------------------------------------------------------------- speed_public_model.py
def test_speed_public_model_without_arguments_prints_its_usage():
    """No arguments was an IndexError traceback (sys.argv[1]). Now argparse's usage and one error line."""
    r = run('speed_public_model.py')
    assert r.stderr.startswith('usage: speed_public_model.py ')
    assert said(r, 2) == "speed_public_model.py: error: the following arguments are required: model, data, n"


def test_speed_public_model_takes_1e5_as_its_document_count(tmp_path):
    """N was int(sys.argv[3]): 1e5 was a ValueError traceback. It is now fileio's rule for every integer option
    (100000, 100_000 or 1e5 alike): 1e5 passes, and the line is about what comes next, the data folder."""
    r = run('speed_public_model.py', 'MODEL.gguf', tmp_path / 'nodata', '1e5')
    assert said(r, 1).startswith(f"speed_public_model.py: error: {tmp_path / 'nodata'} is not a prepared dataset "
                                 f"(no meta.json): run python prepare_c4.py")


def test_speed_public_model_names_a_model_that_is_not_there(tmp_path):
    """A model that does not exist was model.load_hf's ValueError as a traceback, its one-line message inside. Now
    that message is the one line (the data folder checked first, both before anything is timed)."""
    data = write_dataset(str(tmp_path / 'data'), n_train=2000, n_val=500)
    r = run('speed_public_model.py', tmp_path / 'nope.gguf', data, 5)
    assert said(r, 1) == f"speed_public_model.py: error: GGUF file {tmp_path / 'nope.gguf'} not found"


def test_a_signal_while_a_docs_script_imports_torch_is_one_line(tmp_path):
    """early_exit_on_signal() comes before torch is imported: a SIGTERM (or Ctrl-C) in the seconds torch loads was a
    KeyboardInterrupt traceback (SIGINT) or no line at all (SIGTERM). Now it is the line run_script prints, and
    128 + the signal's number. The signal is sent once the process catches SIGTERM (/proc's SigCgt): the guard is in
    place, the imports under way."""
    proc = subprocess.Popen([sys.executable, os.path.join('docs', 'speed_public_model.py')], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))

    def catches_sigterm():
        try:
            with open(f'/proc/{proc.pid}/status') as f:
                mask = next(line.split()[1] for line in f if line.startswith('SigCgt:'))
        except (OSError, StopIteration):
            return False
        return bool(int(mask, 16) & (1 << (signal.SIGTERM - 1)))
    deadline = time.time() + 60
    while not catches_sigterm() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and err == "speed_public_model.py: stopped by SIGTERM\n", (proc.returncode, err)


# ----------------------------------------------------------------------------- probe_cost.py
def test_probe_cost_gpt2_130m_without_its_data_is_one_line():
    """`probe_cost.py --gpt2_130m` without data/pinned_cpu prepared was a ValueError traceback around a helpful
    message (how to prepare it). Now that message is the one line, before any model is built."""
    if os.path.isfile(os.path.join(ROOT, 'data', 'pinned_cpu', 'meta.json')):
        pytest.skip('data/pinned_cpu is prepared in this checkout: the case needs it absent')
    line = said(run('probe_cost.py', '--gpt2_130m'), 1)
    assert line.startswith("probe_cost.py: error: data/pinned_cpu is not a prepared dataset") and \
        'python prepare_c4.py --source pinned --subset cpu' in line, line


def test_probe_cost_runs_from_docs():
    """`cd docs && python probe_cost.py ../config/tiny_cpu.py ...` was `ModuleNotFoundError: No module named 'train'`
    (the working directory was put on sys.path, not the repository). Now train.py is found, reads the config the
    user named relative to docs/, and its own one line says what is wrong with the rest (no run: no timing line)."""
    r = run('probe_cost.py', '../config/tiny_cpu.py', '--no_such_key=1', cwd=DOCS)
    assert said(r, 2).startswith("error: unknown config key 'no_such_key' in the command line")
    assert r.stdout == ''


def test_probe_cost_help_is_its_own():
    """--help went to train.main: train.py's usage, then the timing line of a run that never was. Now it prints this
    script's own usage, from docs/ as from anywhere."""
    r = run('probe_cost.py', '--help', cwd=DOCS)
    assert r.returncode == 0 and r.stderr == '', r.stderr
    assert r.stdout.startswith("The cost of train.py's probe") and 'python docs/probe_cost.py --gpt2_130m' in r.stdout


# ----------------------------------------------------------------------------- front_figure.py
@pytest.mark.parametrize('args, option', [(['--out', ''], '--out'), ([''], 'folders')])
def test_front_figure_refuses_an_empty_path_from_docs(args, option):
    """An empty path (an unset shell variable) is refused as every script refuses it (fileio.path_arg), run from
    docs/ too, and the README's figure is not touched."""
    tracked = os.path.join(DOCS, 'figures', 'front.png')
    before = unchanged(tracked)
    assert said(run('front_figure.py', *args, cwd=DOCS), 2) == f"front_figure.py: error: argument {option}: {EMPTY}"
    assert unchanged(tracked) == before
