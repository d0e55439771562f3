"""Validated nanoGPT-style configuration: defaults <- config files <- --key=value overrides.

    from configurator import load_config, ConfigError
    cfg = load_config(DEFAULTS, sys.argv[1:], choices={'optimizer': ('adamw', 'orthoadam')})

Config files are Python files whose top-level assignments set keys (names starting with '_' and
imported modules are ignored, so a file may compute values). A file may call include('base.py'),
relative to its own folder, to start from another file's settings and state only its differences.
Several files may be given; later ones win, then the overrides. Every key must exist in the defaults
(unknown keys are errors that suggest the closest known keys), every value must have the default's type (an int is accepted for a float;
for an int, a whole number written as a float, 1e5 or 2.0e3, as the scripts' integer options take it, but not 2.5;
a key whose default is None accepts anything), keys with choices must take one of them and keys with a range
must lie in it. A range is written as an interval: '[1, inf)' (>= 1), '(0, inf)' (> 0), '[0, 1)'.
"""
import ast
import difflib
import math
import os
import re
import types


class ConfigError(ValueError):
    """A one-line, user-facing configuration error."""


def _suggest(key, known):
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
    return f" (did you mean {', '.join(close)}?)" if close else f" (known keys: {', '.join(sorted(known))})"


def _parse_value(text):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text   # a bare word such as --optimizer=orthoadam is a string


def parse_range(spec):
    """'[1, inf)' -> (1.0, inf, True, False): lower, upper, whether each end is included."""
    m = re.fullmatch(r"\s*([\[(])\s*([^,\s]+)\s*,\s*([^\])\s]+)\s*([\])])\s*", spec)
    if not m:
        raise ValueError(f"range {spec!r} must look like '[0, 1)' or '(0, inf)'")
    return float(m.group(2)), float(m.group(3)), m.group(1) == '[', m.group(4) == ']'


def in_range(value, spec):
    lo, hi, lo_closed, hi_closed = parse_range(spec)
    if isinstance(value, float) and math.isnan(value):
        return False
    return (lo <= value if lo_closed else lo < value) and (value <= hi if hi_closed else value < hi)


def _check(key, value, defaults, choices, origin, ranges=None):
    if key not in defaults:
        raise ConfigError(f"unknown config key '{key}' in {origin}{_suggest(key, list(defaults))}")
    default = defaults[key]
    if default is not None:
        expected = type(default)
        ok = isinstance(value, expected) and not (isinstance(value, bool) and expected is not bool)
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if expected is int and isinstance(value, float) and math.isfinite(value) and value == int(value):
            value, ok = int(value), True   # --max_iters=1e4: one rule for integers (harness.fileio.number's)
        if expected is tuple and isinstance(value, list):
            value, ok = tuple(value), True
        if not ok:
            raise ConfigError(f"config key '{key}' in {origin} expects {expected.__name__}, "
                              f"got {type(value).__name__} {value!r}")
    if value == '' and isinstance(default, str) and default:   # e.g. --out_dir="$UNSET": never the default quietly
        raise ConfigError(f"config key '{key}' in {origin} is empty (an unset shell variable?); give a value, e.g. "
                          f"{default!r}")
    if key in choices and value not in choices[key]:
        raise ConfigError(f"config key '{key}' in {origin} must be one of {', '.join(map(repr, choices[key]))}, got {value!r}")
    if ranges and key in ranges and not in_range(value, ranges[key]):
        raise ConfigError(f"config key '{key}' in {origin} must be in {ranges[key]}, got {value!r}")
    return value


def read_config_file(path, _including=()):
    """Top-level assignments of a Python config file, as a dict. A file may call include('other.py')
    (a path relative to the including file's folder) to take that file's settings at that point."""
    if not os.path.isfile(path):
        where = f" (included from '{_including[-1]}')" if _including else ""
        raise ConfigError(f"config file '{path}' not found{where}")
    if os.path.abspath(path) in map(os.path.abspath, _including):
        raise ConfigError(f"config file '{path}' includes itself (through {' -> '.join(_including)})")
    namespace = {}

    def include(other):
        namespace.update(read_config_file(os.path.join(os.path.dirname(path), other), _including + (path,)))

    namespace['include'] = include
    with open(path) as f:
        source = f.read()
    try:
        exec(compile(source, path, 'exec'), namespace)
    except ConfigError:
        raise
    except Exception as e:  # a broken config file is a user error, reported on one line
        raise ConfigError(f"config file '{path}' failed: {type(e).__name__}: {e}") from None
    return {k: v for k, v in namespace.items()
            if not k.startswith('_') and not isinstance(v, (types.ModuleType, types.FunctionType, type))}


def load_config(defaults, argv, choices=None, ranges=None):
    """Resolve the configuration from `defaults` (dict), then files and --key=value items in `argv`.
    choices: key -> allowed values; ranges: key -> interval such as '[1, inf)'."""
    choices = choices or {}
    config = dict(defaults)
    for key in set(choices) | set(ranges or {}):
        _check(key, config[key], defaults, choices, 'defaults', ranges)
    for arg in argv:
        if arg.startswith('--'):
            key, sep, text = arg[2:].partition('=')
            if not sep:
                raise ConfigError(f"override '{arg}' must look like --key=value (--help lists the keys)")
            config[key] = _check(key, _parse_value(text), defaults, choices, 'the command line', ranges)
        else:
            for key, value in read_config_file(arg).items():
                config[key] = _check(key, value, defaults, choices, arg, ranges)
    return config


def describe(defaults, meanings, choices=None, ranges=None):
    """One line per key: its default, its meaning, and its allowed values or range (for --help)."""
    choices, ranges = choices or {}, ranges or {}
    width = max(len(f"{k}={v!r}") for k, v in defaults.items())
    lines = []
    for key, default in defaults.items():
        allowed = (f"; one of {', '.join(map(repr, choices[key]))}" if key in choices
                   else f"; in {ranges[key]}" if key in ranges else '')
        lines.append(f"  {f'{key}={default!r}':<{width}}  {meanings.get(key, '')}{allowed}")
    return '\n'.join(lines)

