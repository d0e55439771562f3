"""configurator.py: nanoGPT workflow with validation; config/ files describe the paper's sizes."""
import glob
import json
import re

import pytest
import torch

from configurator import ConfigError, load_config
from harness import train_config
from harness.runs import save_config
from model import GPT, GPTConfig

DEFAULTS = dict(learning_rate=1e-3, max_iters=100, optimizer='adamw', compile=True, betas=(0.9, 0.95), note=None)
CHOICES = dict(optimizer=('adamw', 'orthoadam'))


def test_files_then_overrides_in_order(tmp_path):
    a = tmp_path / 'a.py'
    a.write_text("import math\n_helper = 3\nmax_iters = 10 * _helper\nlearning_rate = math.sqrt(4e-6)\n")
    b = tmp_path / 'b.py'
    b.write_text("max_iters = 7\n")
    cfg = load_config(DEFAULTS, [str(a), str(b), '--optimizer=orthoadam', '--compile=False', '--learning_rate=1'])
    assert cfg == dict(DEFAULTS, max_iters=7, learning_rate=1.0, optimizer='orthoadam', compile=False)
    assert isinstance(cfg['learning_rate'], float)


def test_unknown_key_suggests_closest(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown config key 'learning_rat'.*did you mean learning_rate"):
        load_config(DEFAULTS, ['--learning_rat=1e-3'])
    f = tmp_path / 'typo.py'
    f.write_text("max_iter = 5\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'max_iter' in .*typo.py.*did you mean max_iters"):
        load_config(DEFAULTS, [str(f)])


@pytest.mark.parametrize('arg,msg', [
    ('--max_iters=1.5', r"'max_iters'.*expects int, got float 1.5"),
    ('--compile=yes', r"'compile'.*expects bool, got str 'yes'"),
    ('--max_iters=True', r"'max_iters'.*expects int, got bool"),
    ('--optimizer=adam', r"'optimizer'.*must be one of 'adamw', 'orthoadam', got 'adam'"),
    ('--max_iters', r"must look like --key=value"),
])
def test_bad_values_are_one_line_errors(arg, msg):
    with pytest.raises(ConfigError, match=msg):
        load_config(DEFAULTS, [arg], CHOICES)


def test_an_integer_may_be_written_as_a_whole_float_as_the_scripts_options_take_it(tmp_path):
    """--max_iters=1e1 was refused while the scripts' integer options (harness.fileio.number) take 1e5: one rule. A
    whole finite float is that integer, from the command line or a file; 1.5, inf and nan are not integers."""
    f = tmp_path / 'c.py'
    f.write_text("max_iters = 2e3\n")
    for argv, want in ((['--max_iters=1e1'], 10), (['--max_iters=2.0e3'], 2000), (['--max_iters=100_000'], 100_000),
                       ([str(f)], 2000)):
        cfg = load_config(DEFAULTS, argv)
        assert cfg['max_iters'] == want and type(cfg['max_iters']) is int, argv
    for text in ('1.5', '1e400', 'nan', '1e-1'):
        with pytest.raises(ConfigError, match="'max_iters'.*expects int"):
            load_config(DEFAULTS, [f'--max_iters={text}'])


def test_tuple_list_and_none_defaults():
    cfg = load_config(DEFAULTS, ['--betas=[0.9,0.99]', '--note=anything'])
    assert cfg['betas'] == (0.9, 0.99) and cfg['note'] == 'anything'


def test_missing_or_broken_file(tmp_path):
    with pytest.raises(ConfigError, match='not found'):
        load_config(DEFAULTS, [str(tmp_path / 'nope.py')])
    bad = tmp_path / 'bad.py'
    bad.write_text("max_iters = 1/0\n")
    with pytest.raises(ConfigError, match='ZeroDivisionError'):
        load_config(DEFAULTS, [str(bad)])


def test_save_config_round_trips(tmp_path):
    path = tmp_path / 'config.json'
    save_config(dict(DEFAULTS), str(path))
    assert json.loads(path.read_text())['max_iters'] == 100


@pytest.mark.parametrize('path', sorted(glob.glob('config/**/*.py', recursive=True)))
def test_config_files_are_valid_and_state_their_parameter_count(path):
    import train
    cfg = load_config(train_config.DEFAULTS, [path], train_config.CHOICES)
    claimed = re.search(r"num_params\(\) = ([\d,]+)", open(path).read())
    if claimed is None:
        return
    args = {k: cfg[k] for k in train_config.MODEL_KEYS}
    args['vocab_size'] = 50257
    with torch.device('meta'):
        assert GPT(GPTConfig(**args)).num_params() == int(claimed.group(1).replace(',', ''))


def test_include_takes_a_files_settings_relative_to_the_including_file(tmp_path):
    (tmp_path / 'sub').mkdir()
    (tmp_path / 'base.py').write_text("max_iters = 7\nlearning_rate = 0.5\n")
    (tmp_path / 'sub' / 'row.py').write_text("include('../base.py')\nlearning_rate = 0.25\n")
    cfg = load_config(DEFAULTS, [str(tmp_path / 'sub' / 'row.py')])
    assert (cfg['max_iters'], cfg['learning_rate']) == (7, 0.25)       # included, then the row's own value wins


def test_include_errors_name_the_file(tmp_path):
    (tmp_path / 'a.py').write_text("include('missing.py')\n")
    with pytest.raises(ConfigError, match=r"missing.py' not found \(included from"):
        load_config(DEFAULTS, [str(tmp_path / 'a.py')])
    (tmp_path / 'b.py').write_text("include('c.py')\n")
    (tmp_path / 'c.py').write_text("include('b.py')\n")
    with pytest.raises(ConfigError, match='includes itself'):
        load_config(DEFAULTS, [str(tmp_path / 'b.py')])
    (tmp_path / 'd.py').write_text("include('e.py')\n")
    (tmp_path / 'e.py').write_text("max_itres = 3\n")
    with pytest.raises(ConfigError, match="unknown config key 'max_itres'.*did you mean max_iters"):
        load_config(DEFAULTS, [str(tmp_path / 'd.py')])


def test_ranges_are_intervals_checked_for_defaults_files_and_overrides(tmp_path):
    from configurator import describe, in_range
    ranges = dict(learning_rate='(0, 1]', max_iters='[1, inf)')
    assert [in_range(x, '(0, 1]') for x in (0, 1e-9, 1, 1.0000001, float('nan'))] == [False, True, True, False, False]
    assert [in_range(x, '[1, inf)') for x in (0, 1, 10**12, float('inf'))] == [False, True, True, False]
    assert load_config(DEFAULTS, ['--learning_rate=1', '--max_iters=1'], CHOICES, ranges)['learning_rate'] == 1.0
    with pytest.raises(ConfigError, match=r"'learning_rate' in the command line must be in \(0, 1\], got 0.0"):
        load_config(DEFAULTS, ['--learning_rate=0'], CHOICES, ranges)
    f = tmp_path / 'c.py'
    f.write_text("max_iters = 0\n")
    with pytest.raises(ConfigError, match=r"'max_iters' in .*c.py must be in \[1, inf\), got 0"):
        load_config(DEFAULTS, [str(f)], CHOICES, ranges)
    with pytest.raises(ConfigError, match=r"'max_iters' in defaults"):
        load_config(dict(DEFAULTS, max_iters=0), [], CHOICES, ranges)
    text = describe(DEFAULTS, {'max_iters': 'iterations'}, CHOICES, ranges)
    assert "max_iters=100" in text and "iterations; in [1, inf)" in text and "one of 'adamw', 'orthoadam'" in text
