"""The repository's layout rules (docs/architecture.md), read from the source with ast.

The code lives in rooms on floors. A room is a top-level file (a script, or one of the modules a researcher edits:
model.py, attention.py, orthoadam.py, configurator.py) or a package (harness/, pinned_corpus/, kernels/: its modules
together). An import from one room to another goes down a floor, never across or up: so no script imports another
script, a package imports no script, and the rooms form no circle. Inside a package the modules import one another
without a circle. No file is over MAX_FILE_LINES lines and no function over MAX_FUNCTION_LINES. At most
MAX_TOP_LEVEL Python files stand at the top level. The checker is tested on small made-up trees first, so that it is
known to fail.

    python tests/test_layout.py      # print the rooms, their floors and imports, then every violation
"""
import ast
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# what a user runs (the top-level ones; every .py file under tools/ and docs/ is a script too)
SCRIPTS = {'train.py', 'analyze.py', 'eval_quant.py', 'prepare_c4.py', 'reproduce.py', 'bench.py', 'sample.py',
           'export_hf.py', 'intervene.py', 'lm_eval_adapter.py', 'stream_eval.py', 'gpu_suite.py', 'corpus.py'}
SCRIPT_FOLDERS = ('tools', 'docs')
# every other room and its floor: a room imports only rooms on lower floors (scripts stand above them all)
FLOORS = {'pinned_corpus': 4,   # the pinned corpus's builder: uses the library's files and tokenizer to write folders
          'harness': 3,         # the library: files, data, devices, runs, measurement, tables, plots, provenance
          'model.py': 2, 'orthoadam.py': 2, 'configurator.py': 2,
          'attention.py': 1,
          'kernels': 0}         # the Triton kernels
SCRIPT_FLOOR = 5
# room -> room imports allowed as exceptions; an entry here must say why
KNOWN = {('docs/probe_cost.py', 'train.py')}   # it times train.py's own probe function by wrapping it in train.main
MAX_FILE_LINES = 700
MAX_FUNCTION_LINES = 120
MAX_TOP_LEVEL = 20


def python_files(root=ROOT, packages=None):
    """Every .py file of the tree that the rules cover, relative to root: the top level, the packages, tools/, docs/."""
    packages = sorted(p for p in FLOORS if not p.endswith('.py')) if packages is None else packages
    files = [f for f in os.listdir(root) if f.endswith('.py')]
    for folder in (*packages, *SCRIPT_FOLDERS):
        if os.path.isdir(os.path.join(root, folder)):
            files += [f'{folder}/{f}' for f in os.listdir(os.path.join(root, folder)) if f.endswith('.py')]
    return sorted(files)


def module_name(path):
    """'harness/fileio.py' -> 'harness.fileio', 'harness/__init__.py' -> 'harness', 'train.py' -> 'train'."""
    name = path[:-3].replace('/', '.')
    return name.removesuffix('.__init__')


def imports_of(source, modules):
    """The project modules (dotted names in `modules`) that a file's source imports anywhere: `import a.b`,
    `from a import b` (b a module of package a, else a itself) and `from a.b import c` (a function's own import
    counts too: it runs the other module as surely as one at the top)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f'{node.module}.{a.name}' if f'{node.module}.{a.name}' in modules else node.module
                     for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:   # 'harness.fileio.x' -> 'harness.fileio'
                name = name.rpartition('.')[0]
            if name:
                found.add(name)
    return found


def import_graph(root=ROOT, packages=None):
    """{file: set of files it imports} over python_files (a package's __init__ stands for the package)."""
    files = python_files(root, packages)
    by_module = {module_name(f): f for f in files}
    graph = {}
    for f in files:
        with open(os.path.join(root, f)) as fh:
            graph[f] = {by_module[m] for m in imports_of(fh.read(), set(by_module)) if by_module[m] != f}
    return graph


def room(path):
    """The room a file is in: its package, else the file itself."""
    head = path.split('/')[0]
    return path if head == path or head in SCRIPT_FOLDERS else head


def floor(path, scripts, floors):
    r = room(path)
    if r in scripts or r.split('/')[0] in SCRIPT_FOLDERS:
        return SCRIPT_FLOOR
    return floors.get(r)


def find_cycle(graph):
    """One import circle as a list of files (first == last), or None."""
    state = {}

    def visit(node, path):
        state[node] = 'open'
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 'open':
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt, path + [nxt])
                if cycle:
                    return cycle
        state[node] = 'done'
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start, [start])
            if cycle:
                return cycle
    return None


def long_functions(source, limit=MAX_FUNCTION_LINES):
    """(name, lines) of every function or method longer than limit lines (decorators not counted)."""
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit]


def violations(root=ROOT, scripts=SCRIPTS, floors=None, known=frozenset(), max_top=MAX_TOP_LEVEL):
    """Every broken rule, one line each (room imports listed in `known` excepted)."""
    floors = FLOORS if floors is None else floors
    packages = sorted(p for p in floors if not p.endswith('.py'))
    graph, found = import_graph(root, packages), []
    for f in sorted(graph):
        if floor(f, scripts, floors) is None:
            found.append(f"{f} is in no room: name it a script or give it a floor (FLOORS)")
    for a in sorted(graph):
        for b in sorted(graph[a]):
            fa, fb = floor(a, scripts, floors), floor(b, scripts, floors)
            if room(a) == room(b) or fa is None or fb is None or (room(a), room(b)) in known:
                continue
            if fb >= fa:
                kind = 'script' if fa == SCRIPT_FLOOR else f'floor {fa}'
                what = 'script' if fb == SCRIPT_FLOOR else f'floor {fb}'
                found.append(f"{a} ({kind}) imports {b} ({what}): an import goes down a floor")
    cycle = find_cycle(graph)
    if cycle:
        found.append('import circle: ' + ' -> '.join(cycle))
    top = [f for f in graph if '/' not in f]
    if len(top) > max_top:
        found.append(f"{len(top)} Python files at the top level (> {max_top}): a library module belongs in a package")
    for f in sorted(graph):
        with open(os.path.join(root, f)) as fh:
            source = fh.read()
        if source.count('\n') > MAX_FILE_LINES:
            found.append(f"{f} has {source.count(chr(10))} lines (> {MAX_FILE_LINES})")
        found += [f"{f}: {name}() has {n} lines (> {MAX_FUNCTION_LINES})" for name, n in long_functions(source)]
    return found


# ----------------------------------------------------------------------------- the checker on made-up trees
def write(tmp_path, files):
    for name, source in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(source)
    return str(tmp_path)


FLAT = {'lib.py': 1}


def test_checker_finds_a_script_importing_a_script(tmp_path):
    root = write(tmp_path, {'a.py': 'import b\n', 'b.py': 'from lib import x\n', 'lib.py': 'x = 1\n'})
    assert violations(root, {'a.py', 'b.py'}, FLAT) == ['a.py (script) imports b.py (script): an import goes down a floor']
    root = write(tmp_path, {'a.py': 'def f():\n    from b import y\n'})   # an import inside a function counts
    assert violations(root, {'a.py', 'b.py'}, FLAT) == ['a.py (script) imports b.py (script): an import goes down a floor']
    assert violations(root, {'a.py', 'b.py'}, FLAT, known={('a.py', 'b.py')}) == []


def test_checker_finds_an_import_going_up_and_a_room_with_no_floor(tmp_path):
    floors = {'pkg': 1, 'core.py': 2}
    root = write(tmp_path, {'s.py': 'from pkg import m\n', 'pkg/__init__.py': '', 'pkg/m.py': 'import core\n',
                            'core.py': 'x = 1\n'})
    assert violations(root, {'s.py'}, floors) == ['pkg/m.py (floor 1) imports core.py (floor 2): an import goes down '
                                                  'a floor']
    (tmp_path / 'pkg' / 'm.py').write_text('from pkg.n import y\n')   # inside a package: no floor to cross
    (tmp_path / 'pkg' / 'n.py').write_text('y = 1\n')
    assert violations(root, {'s.py'}, floors) == []
    (tmp_path / 'stray.py').write_text('')
    assert violations(root, {'s.py'}, floors) == ['stray.py is in no room: name it a script or give it a floor (FLOORS)']
    (tmp_path / 'pkg' / 'n.py').write_text('import s\n')   # a package importing a script
    assert violations(root, {'s.py', 'stray.py'}, floors) == [
        'pkg/n.py (floor 1) imports s.py (script): an import goes down a floor',
        'import circle: pkg/m.py -> pkg/n.py -> s.py -> pkg/m.py']


def test_checker_finds_an_import_circle(tmp_path):
    floors = {'pkg': 1}
    root = write(tmp_path, {'s.py': 'import pkg.a\n', 'pkg/__init__.py': '', 'pkg/a.py': 'from pkg import b\n',
                            'pkg/b.py': 'import os\nfrom pkg.c import z\n', 'pkg/c.py': 'from pkg.a import w\n'})
    assert violations(root, {'s.py'}, floors) == ['import circle: pkg/a.py -> pkg/b.py -> pkg/c.py -> pkg/a.py']
    (tmp_path / 'pkg' / 'c.py').write_text('import numpy\n')   # the circle broken: nothing left to report
    assert violations(root, {'s.py'}, floors) == []


def test_checker_finds_long_files_functions_and_a_crowded_top_level(tmp_path):
    body = '\n'.join(f'    x{i} = {i}' for i in range(MAX_FUNCTION_LINES))   # def line + 120 = 121 lines
    floors = {'lib.py': 1, 'big.py': 1}
    root = write(tmp_path, {'lib.py': f'def long():\n{body}\n', 'big.py': 'x = 1\n' * (MAX_FILE_LINES + 1)})
    assert violations(root, set(), floors) == [f'big.py has {MAX_FILE_LINES + 1} lines (> {MAX_FILE_LINES})',
                                               f'lib.py: long() has {MAX_FUNCTION_LINES + 1} lines (> '
                                               f'{MAX_FUNCTION_LINES})']
    assert violations(root, set(), floors, max_top=1)[0] == ('2 Python files at the top level (> 1): a library '
                                                             'module belongs in a package')


# ----------------------------------------------------------------------------- the repository
def test_every_script_and_room_exists():
    assert SCRIPTS | {f for f in FLOORS if f.endswith('.py')} <= set(os.listdir(ROOT))
    assert all(os.path.isfile(os.path.join(ROOT, p, '__init__.py')) for p in FLOORS if not p.endswith('.py'))


def test_repository_layout():
    assert violations(known=KNOWN) == []


def test_known_exceptions_still_exist():
    graph = import_graph()
    assert all(b in graph.get(a, ()) for a, b in KNOWN), 'an exception was fixed: remove it from KNOWN'


if __name__ == '__main__':
    graph = import_graph()
    for f in sorted(graph, key=lambda f: (-(floor(f, SCRIPTS, FLOORS) or 0), f)):
        print(f"floor {floor(f, SCRIPTS, FLOORS)} {f:28s} -> {', '.join(sorted(graph[f])) or '-'}")
    problems = violations(known=KNOWN)
    if KNOWN:
        print(f"known exception(s), see KNOWN: {', '.join(f'{a} -> {b}' for a, b in sorted(KNOWN))}")
    print('\n'.join(problems) if problems else 'layout ok: every import goes down a floor (no script imports a '
          f'script), no import circle, {sum("/" not in f for f in graph)} Python files at the top level (<= '
          f'{MAX_TOP_LEVEL}), no file over {MAX_FILE_LINES} lines, no function over {MAX_FUNCTION_LINES}')
    sys.exit(1 if problems else 0)
