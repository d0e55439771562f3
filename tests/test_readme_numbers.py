"""The README's numbers against the results they came from. Every table above README.md's "## Setup" is a copy of
rows and columns of a table on a page it links in the paragraph just above it (a docs/ page or a committed results
file): the same column names, the same row labels. Each number of a README cell must equal the number at the same
place in that table, rounded to the README's digits, so a README that goes stale (a result measured again, the
README not updated, or the other way round) fails here, naming the cell. docs/tests.md says how to update both."""
import os
import re
from decimal import ROUND_HALF_UP, Decimal

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, 'README.md')
LINK = re.compile(r'\[[^\]]*\]\(([^)\s]+)\)')
NUMBER = re.compile(r'(?:(?<![\w.])-)?\d[\d,]*(?:\.\d+)?')      # a minus only where no word or number ends


def cells(line):
    """The cells of a Markdown table row; `\\|` is a pipe inside a cell."""
    parts = re.split(r'(?<!\\)\|', line.strip().strip('|'))
    return [p.strip().replace('\\|', '|') for p in parts]


def plain(text):
    """A cell as read: without emphasis, code marks and surplus spaces."""
    return ' '.join(text.replace('**', '').replace('`', '').replace('*', '').split())


def tables(lines):
    """Every Markdown table of `lines`: (index of its header line, header cells, {label: cells})."""
    found, i = [], 0
    while i + 1 < len(lines):
        if lines[i].lstrip().startswith('|') and re.fullmatch(r'\s*\|?[\s:|-]+\|?\s*', lines[i + 1]) and '-' in lines[i + 1]:
            head, rows, j = [plain(c) for c in cells(lines[i])], {}, i + 2
            while j < len(lines) and lines[j].lstrip().startswith('|'):
                row = cells(lines[j])
                rows[plain(row[0])] = row
                j += 1
            found.append((i, head, rows))
            i = j
        else:
            i += 1
    return found


def numbers(text):
    """The numbers of a cell as Decimals (thousands separators dropped), e.g. '14,743.8' and '1.004×'."""
    return [Decimal(n.replace(',', '')) for n in NUMBER.findall(plain(text))]


def mismatch(ours, theirs):
    """Why README cell `ours` does not say what source cell `theirs` says, or None. Numbers are compared in order,
    each of ours against theirs rounded to our digits; a cell without numbers is compared as text."""
    a, b = numbers(ours), numbers(theirs)
    if not a:
        return None if plain(ours) == plain(theirs) else f"'{plain(ours)}' where the source says '{plain(theirs)}'"
    if len(a) != len(b):
        return f"'{plain(ours)}' has {len(a)} number(s), the source's '{plain(theirs)}' {len(b)}"
    for x, y in zip(a, b):
        if y.quantize(Decimal(1).scaleb(x.as_tuple().exponent), rounding=ROUND_HALF_UP) != x:
            return f"{x} where the source says {y} ('{plain(theirs)}')"
    return None


def readme_tables():
    """The README's tables above Setup, each with the links of the paragraph above it."""
    with open(README, encoding='utf-8') as f:
        lines = f.read().split('\n')
    lines = lines[:next(i for i, line in enumerate(lines) if line.startswith('## Setup'))]
    out = []
    for start, head, rows in tables(lines):
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        caption = []
        while k >= 0 and lines[k].strip() and not lines[k].lstrip().startswith(('|', '#', '```')):
            caption.insert(0, lines[k])
            k -= 1
        out.append((start + 1, head, rows, LINK.findall(' '.join(caption))))
    return out


def source_table(head, rows, links):
    """The first table, on the pages the caption links, that has every column of `head` and every row label."""
    tried = []
    for link in links:
        path = os.path.normpath(os.path.join(ROOT, link.split('#')[0]))
        if link.startswith(('http:', 'https:')) or not os.path.isfile(path):
            continue
        tried.append(os.path.relpath(path, ROOT))
        with open(path, encoding='utf-8') as f:
            for _, their_head, their_rows in tables(f.read().split('\n')):
                if set(head) <= set(their_head) and set(rows) <= set(their_rows):
                    return os.path.relpath(path, ROOT), their_head, their_rows
    return None, tried, None


def compare(head, rows, their_head, their_rows):
    """Every disagreement between a README table and its source table, one line each."""
    problems = []
    for label, row in rows.items():
        theirs = their_rows[label]
        for name, cell in zip(head[1:], row[1:]):
            k = their_head.index(name)
            why = mismatch(cell, theirs[k] if k < len(theirs) else '')
            if why:
                problems.append(f"row '{label}', column '{name}': {why}")
    return problems


README_TABLES = readme_tables()


def test_the_readme_has_results_tables():
    assert len(README_TABLES) >= 3, "the README's results tables above Setup were not found"


@pytest.mark.parametrize('line,head,rows,links', README_TABLES, ids=[f'README line {t[0]}' for t in README_TABLES])
def test_each_readme_table_says_what_its_source_says(line, head, rows, links):
    source, their_head, their_rows = source_table(head, rows, links)
    assert source, (f"README line {line}: no table with the columns {head} and the rows {list(rows)} on the pages "
                    f"linked just above it ({', '.join(their_head) or 'no link to a file of this repository'})")
    problems = compare(head, rows, their_head, their_rows)
    assert not problems, f"README line {line} against {source}: " + '; '.join(problems)


# ----------------------------------------------------------------------------- the comparison itself, by hand

def test_a_number_is_compared_at_the_readmes_digits():
    assert mismatch('14,744', '14,743.8') is None and mismatch('14,743.8', '14,743.8') is None
    assert mismatch('**2.9**', '2.9') is None and mismatch('1.004×', '1.004×') is None
    assert mismatch('`done: val ppl 332.78 at iteration 400`', 'done: val ppl 332.78 at iteration 400') is None
    assert mismatch('332.77', '332.78') == "332.77 where the source says 332.78 ('332.78')"
    assert mismatch('14,743.9', '14,743.8') is not None and mismatch('0.50', '0.503') is None
    assert mismatch('0.93-0.97×', '0.93-0.97×') is None and mismatch('0.93-0.98×', '0.93-0.97×') is not None
    assert mismatch('-0.01', '0.01') is not None and mismatch('+233.35', '+233.35') is None
    assert mismatch('yes', 'yes') is None and mismatch('yes', 'no') is not None
    assert mismatch('3.9', '3.93 (a fused kernel 1.2)') is not None   # a number left out is a different cell


def test_a_table_is_found_by_its_columns_and_rows_and_a_stale_cell_is_named(tmp_path):
    page = tmp_path / 'page.md'
    page.write_text('| model | PPL | First Attn | tokens/s |\n| --- | ---: | ---: | ---: |\n'
                    '| a, **pinned** (200 documents) | 32.47 | 0.503 | 1,000 |\n| b | 17.4 | 0.105 | 9 |\n',
                    encoding='utf-8')
    readme = ['see [the page](%s#anchor) and [elsewhere](https://example.org)' % page, '',
              '| model | First Attn | PPL |', '| --- | --- | --- |', '| a, pinned (200 documents) | 0.503 | 32.5 |']
    (line, head, rows, links), = [(s + 1, h, r, LINK.findall(readme[0])) for s, h, r in tables(readme)]
    source, their_head, their_rows = source_table(head, rows, links)
    assert source and compare(head, rows, their_head, their_rows) == []
    rows['a, pinned (200 documents)'][2] = '32.48'
    assert compare(head, rows, their_head, their_rows) == [
        "row 'a, pinned (200 documents)', column 'PPL': 32.48 where the source says 32.47 ('32.47')"]
    rows['c'] = ['c', '0.1', '1']
    assert source_table(head, rows, links)[0] is None    # a row the source does not have: no source table
