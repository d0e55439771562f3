"""The repository's layout rules (docs/architecture.md), read from the source with ast: no script imports another
script, the imports between top-level files form no circle, no file is over MAX_FILE_LINES lines and no function
over MAX_FUNCTION_LINES. The checker is tested on small made-up graphs first, so that it is known to fail.

    python tests/test_layout.py      # print the import graph and every violation
"""
import ast
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# what a user runs; everything else at the top level is a library module that scripts import
SCRIPTS = {'train.py', 'analyze.py', 'eval_quant.py', 'prepare_c4.py', 'reproduce.py', 'bench.py', 'sample.py',
           'export_hf.py', 'intervene.py', 'lm_eval_adapter.py', 'stream_eval.py', 'gpu_suite.py', 'corpus.py'}
# script -> script imports allowed as exceptions (none today; an entry here must say why)
KNOWN = set()
MAX_FILE_LINES = 700
MAX_FUNCTION_LINES = 120


def top_level_files(root=ROOT):
    return sorted(f for f in os.listdir(root) if f.endswith('.py'))


def imports_of(source, modules):
    """The top-level modules (names without .py, in `modules`) that a file's source imports anywhere (a function's
    own import counts too: it runs the other module as surely as one at the top)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name.split('.')[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module.split('.')[0]]
        else:
            continue
        found.update(n for n in names if n in modules)
    return found


def import_graph(root=ROOT):
    """{file: set of files it imports} over the top-level .py files."""
    files = top_level_files(root)
    modules = {f[:-3] for f in files}
    graph = {}
    for f in files:
        with open(os.path.join(root, f)) as fh:
            graph[f] = {m + '.py' for m in imports_of(fh.read(), modules) if m + '.py' != f}
    return graph


def script_imports(graph, scripts):
    """Edges from a script to another script."""
    return sorted((a, b) for a, targets in graph.items() if a in scripts for b in targets if b in scripts)


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


def violations(root=ROOT, scripts=SCRIPTS, known=frozenset()):
    """Every broken rule, one line each (script imports listed in `known` excepted)."""
    graph, found = import_graph(root), []
    found += [f"script {a} imports script {b}" for a, b in script_imports(graph, scripts) if (a, b) not in known]
    cycle = find_cycle(graph)
    if cycle:
        found.append('import circle: ' + ' -> '.join(cycle))
    for f in top_level_files(root):
        with open(os.path.join(root, f)) as fh:
            source = fh.read()
        if source.count('\n') > MAX_FILE_LINES:
            found.append(f"{f} has {source.count(chr(10))} lines (> {MAX_FILE_LINES})")
        found += [f"{f}: {name}() has {n} lines (> {MAX_FUNCTION_LINES})" for name, n in long_functions(source)]
    return found


# ----------------------------------------------------------------------------- the checker on made-up inputs
def write(tmp_path, files):
    for name, source in files.items():
        (tmp_path / name).write_text(source)
    return str(tmp_path)


def test_checker_finds_a_script_importing_a_script(tmp_path):
    root = write(tmp_path, {'a.py': 'import b\n', 'b.py': 'from lib import x\n', 'lib.py': 'x = 1\n'})
    assert violations(root, {'a.py', 'b.py'}) == ['script a.py imports script b.py']
    root = write(tmp_path, {'a.py': 'def f():\n    from b import y\n'})   # an import inside a function counts
    assert violations(root, {'a.py', 'b.py'}) == ['script a.py imports script b.py']


def test_checker_finds_an_import_circle(tmp_path):
    root = write(tmp_path, {'s.py': 'import lib1\n', 'lib1.py': 'import lib2\n', 'lib2.py': 'import lib3, os\n',
                            'lib3.py': 'from lib1 import z\n'})
    assert violations(root, {'s.py'}) == ['import circle: lib1.py -> lib2.py -> lib3.py -> lib1.py']
    (tmp_path / 'lib3.py').write_text('import numpy\n')   # the circle broken: nothing left to report
    assert violations(root, {'s.py'}) == []


def test_checker_finds_long_files_and_functions(tmp_path):
    body = '\n'.join(f'    x{i} = {i}' for i in range(MAX_FUNCTION_LINES))   # def line + 120 = 121 lines
    root = write(tmp_path, {'lib.py': f'def long():\n{body}\n', 'big.py': 'x = 1\n' * (MAX_FILE_LINES + 1)})
    assert violations(root, set()) == [f'big.py has {MAX_FILE_LINES + 1} lines (> {MAX_FILE_LINES})',
                                       f'lib.py: long() has {MAX_FUNCTION_LINES + 1} lines (> {MAX_FUNCTION_LINES})']


# ----------------------------------------------------------------------------- the repository
def test_every_script_exists():
    assert SCRIPTS <= set(top_level_files())


def test_repository_layout():
    assert violations(known=KNOWN) == []


def test_known_exceptions_still_exist():
    assert KNOWN <= set(script_imports(import_graph(), SCRIPTS)), 'an exception was fixed: remove it from KNOWN'


if __name__ == '__main__':
    graph = import_graph()
    for f in sorted(graph):
        kind = 'script ' if f in SCRIPTS else 'library'
        print(f"{kind} {f:20s} -> {', '.join(sorted(graph[f])) or '-'}")
    problems = violations(known=KNOWN)
    if KNOWN:
        print(f"known exception(s), see KNOWN: {', '.join(f'{a} -> {b}' for a, b in sorted(KNOWN))}")
    print('\n'.join(problems) if problems else 'layout ok: no script imports a script, no import circle, '
          f'no file over {MAX_FILE_LINES} lines, no function over {MAX_FUNCTION_LINES}')
    sys.exit(1 if problems else 0)
