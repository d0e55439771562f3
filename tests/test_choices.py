"""One source per choice list, and the docs name every choice. The allowed values of a config key live in the module
that implements them (model.CHOICES, optimizers.OPTIMIZERS, orthoadam.ROTATIONS and AXES, eval_quant's scheme names),
with what the rest of the code needs to know about each (attention.EAGER: the variants no fused kernel computes);
train.py's validation and --help and reproduce.py's time estimate read them. A value added there without its
documentation fails here, naming the page and the row that miss it. (The checks of what each choice computes are in
test_attention.py,
test_model.py, test_train_step.py, test_orthoadam.py and test_eval_quant.py.)"""
import os
import re

import attention
import eval_quant
import model
import orthoadam
from harness import optimizers, train_config
from conftest import ROOT


def doc(name):
    return open(os.path.join(ROOT, 'docs', name), encoding='utf-8').read()


def config_key_rows():
    """{key: its row} of docs/training.md's "Config keys" table."""
    text = doc('training.md')
    table = text[text.index('## Config keys'):]
    rows = {}
    for row in table[:table.index('\n#')].splitlines():
        cells = row.strip().strip('|').split('|')
        for key in re.findall(r'`(\w+)`', cells[0]) if row.startswith('| `') else []:
            rows[key] = row
    return rows


def test_config_choices_are_the_implementing_modules_lists():
    for key, allowed in model.CHOICES.items():
        assert train_config.CHOICES[key] is allowed, key
    assert train_config.CHOICES['optimizer'] is optimizers.OPTIMIZERS
    assert train_config.CHOICES['orthoadam_rotation'] is orthoadam.ROTATIONS
    assert train_config.CHOICES['orthoadam_axes'] is orthoadam.AXES
    assert set(attention.EAGER) <= set(model.CHOICES['attn']), 'attention.EAGER names a variant model.CHOICES lacks'
    assert set(optimizers.DECOUPLED_WEIGHT_DECAY) <= set(optimizers.OPTIMIZERS)


def test_training_md_names_every_value_of_every_choice_key():
    """Each key with choices has a row in docs/training.md naming every value as 'value' (attn's values are the rows
    of docs/mitigations.md instead, checked below)."""
    rows = config_key_rows()
    for key, allowed in train_config.CHOICES.items():
        if key == 'attn':
            assert 'mitigations.md' in rows[key]
            continue
        missing = [v for v in allowed if f"'{v}'" not in rows[key]]
        assert not missing, f"docs/training.md's row of {key} does not name {missing} ({key}'s choices): describe them there"


def test_mitigations_md_has_a_row_per_attention_and_names_the_eager_ones():
    text = doc('mitigations.md')
    table = text[text.index('| row |'):text.index('\n\n', text.index('| row |'))]
    missing = [a for a in model.CHOICES['attn'] if a != 'softmax' and f"`attn='{a}'`" not in table]
    assert not missing, f"docs/mitigations.md's table has no row for attn={missing} (model.CHOICES): add one"
    eager = text[text.index('- **Eager**'):text.index('- **The analysis path**')]
    named = re.findall(r"`(\w+)`", eager.split(':', 1)[1])
    assert named == list(attention.EAGER), f"docs/mitigations.md's Eager line names {named}, attention.EAGER is {attention.EAGER}"


def test_quantisation_docs_name_every_scheme():
    """docs/quantisation.md's table and eval_quant.py's docstring table describe every scheme name parse_scheme takes."""
    page, docstring = doc('quantisation.md'), eval_quant.__doc__
    for name in eval_quant.ACTIVATION_SCHEMES:
        assert f'| `{name}` |' in page, f"docs/quantisation.md has no row for the scheme {name}"
        assert re.search(rf'^    {name} ', docstring, re.M), f"eval_quant.py's docstring has no row for the scheme {name}"
    for method in eval_quant.WEIGHT_METHODS:
        assert f'`{method}<b>' in page, f"docs/quantisation.md does not describe the weight-only method {method}"
        assert f'{method}<b>' in docstring, f"eval_quant.py's docstring does not describe the weight-only method {method}"
        eval_quant.parse_scheme(f'{method}4g2')   # and the name parses
