"""Every link of the README and docs/ to a file of the repository finds it, and every #anchor finds a heading of
its page, named as GitHub names them (lower case, punctuation but '-' and '_' dropped, spaces as '-', a repeated
heading's -1, -2)."""
import os
import re
from pathlib import Path

import pytest

from conftest import ROOT

PAGES = sorted(str(p.relative_to(ROOT)) for p in [Path(ROOT) / 'README.md', *Path(ROOT, 'docs').rglob('*.md')])
LINK = re.compile(r'\]\(([^)\s#]*)(?:#([^)\s]*))?\)')


def slug(heading):
    """GitHub's anchor of a heading: markup and punctuation dropped, spaces as hyphens."""
    text = re.sub(r'[^\w\- ]', '', heading.strip().lower())
    return text.replace(' ', '-')


def anchors(page):
    text = re.sub(r'```.*?```', '', Path(ROOT, page).read_text(), flags=re.S)   # a '#' line in code is no heading
    seen, out = {}, set()
    for heading in re.findall(r'^#{1,6} (.*)$', text, flags=re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f'{base}-{n}')
    return out


def test_the_slug_is_githubs():
    assert slug('The extreme-token phenomena on two CPU cores (`--scale laptop`)') == (
        'the-extreme-token-phenomena-on-two-cpu-cores---scale-laptop')
    assert slug('Table 5, the mitigations and where quantisation breaks, at the laptop scale') == (
        'table-5-the-mitigations-and-where-quantisation-breaks-at-the-laptop-scale')
    assert slug('What `E_m[κ_m,1]` means') == 'what-e_mκ_m1-means'


@pytest.mark.parametrize('page', PAGES)
def test_each_link_finds_its_file_and_heading(page):
    text = re.sub(r'```.*?```', '', Path(ROOT, page).read_text(), flags=re.S)
    broken = []
    for target, anchor in LINK.findall(text):
        if re.match(r'[a-z]+:', target):   # https:, mailto:
            continue
        path = os.path.normpath(os.path.join(os.path.dirname(page), target)) if target else page
        if path.startswith('..'):   # outside the repository (../shared beside a clone): not the docs' to keep
            continue
        if not os.path.exists(os.path.join(ROOT, path)):
            broken.append(f'{target}: no such file')
        elif anchor and path.endswith('.md') and anchor not in anchors(path):
            broken.append(f'{target}#{anchor}: no such heading in {path}')
    assert not broken, broken
