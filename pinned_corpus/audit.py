"""
The pinned corpus's quality report: `python corpus.py audit --subset cpu|full` (docs/data.md, "Audit").

    audit(docs, tokens, eval_tokens, max_chars) -> dict      report(result) -> str

docs are (doc_id, split, text) in the order of the split files prepare_c4.py writes (train, then val, each in its
file order), tokens the GPT-2 token count of each. It measures:
- per source: tokens (with the eot separator) and share of train, of val, and of the main job's evaluation slice
  (the first eval_tokens of val.bin, config/main.py), and the largest gap between a source's slice share and its
  train share;
- leakage: the share of val's word 13-gram positions whose 13-gram occurs in train, and the val documents over 80%
  covered by train;
- repetition: the share of word 13-gram positions (whole corpus, file order) that repeat an earlier one;
- near-duplicate document pairs across sources: a pair whose smaller document has at least half of its sampled
  13-grams (1 in SAMPLE) in the other;
- markup left in the text (MARKUP's patterns, counted per source) and paragraphs that are one bare identifier or
  URL;
- the code-like share (corpus_text.code_like), the longest document and the documents over max_chars;
- whitespace: per split, the share of its tokens in runs of at least WHITESPACE_RUN whitespace-only tokens (`runs`,
  per document: whitespace_run_tokens of its ids) and the lines indented by at least INDENTED spaces.
"""
import re
from collections import Counter

import numpy as np

from pinned_corpus.clean import gram_hashes
from pinned_corpus.text import URL, bare_identifier, code_like

SAMPLE = 8  # near-duplicate pairs compare the 13-grams whose hash is 0 modulo SAMPLE
MAX_POSTINGS = 64  # a sampled 13-gram in more documents than this is boilerplate, not evidence of a copy
NEAR = 0.5  # containment of the smaller document's sampled 13-grams that makes a pair near-duplicates
COVERED = 0.8  # a val document with more than this share of its 13-grams in train is reported
MARKUP = {  # name -> what is counted
    "backticks": re.compile(r"`"),
    ":role:": re.compile(r":[a-z][\w+.-]*(?::[\w+.-]+)*:`"),
    "backslashes": re.compile(r"\\"),
    "LaTeX commands": re.compile(r"\\[a-zA-Z]{2,}"),
    "OCR markers": re.compile(r"### (?:START|END):|\.tif\b|\[\[ed:|^p\.\d+:\d+$", re.M | re.I),
    "~word~ / _word_": re.compile(r"~[A-Za-z][^~\n]*~|(?<!\w)_[A-Za-z][^_\n]*?_(?!\w)"),
}
WHITESPACE_RUN = 4  # a run of at least this many whitespace-only tokens in a row is counted
INDENTED = 20  # a line indented by at least this many spaces is counted


def source_of(doc_id: str) -> str:
    return doc_id.split(":", 1)[0]


def shares(docs, tokens, eval_tokens) -> dict:
    """{source: {"train", "val", "eval"}} tokens with the eot separator; "eval" counts the first eval_tokens of val."""
    out: dict = {}
    left = eval_tokens
    for (doc_id, split, _), n in zip(docs, tokens):
        rec = out.setdefault(source_of(doc_id), {"train": 0, "val": 0, "eval": 0})
        rec[split] += n + 1
        if split == "val" and left > 0:
            rec["eval"] += min(n + 1, left)
            left -= n + 1
    return out


def contains(sorted_unique: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Whether each of `values` is in `sorted_unique` (a sorted array without repeats)."""
    if not len(sorted_unique):
        return np.zeros(len(values), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_unique, values), len(sorted_unique) - 1)
    return sorted_unique[at] == values


def ngram_stats(docs) -> dict:
    """Leakage (val 13-grams in train), repetition, and near-duplicate pairs across sources."""
    grams = [gram_hashes(text) for _, _, text in docs]
    train = [g for g, (_, s, _) in zip(grams, docs) if s == "train"]
    train = np.unique(np.concatenate(train)) if train else np.zeros(0, np.uint64)
    val_positions, val_in_train, covered = 0, 0, []
    for g, (doc_id, split, _) in zip(grams, docs):
        if split != "val" or not len(g):
            continue
        hit = int(contains(train, g).sum())
        val_positions, val_in_train = val_positions + len(g), val_in_train + hit
        if hit > COVERED * len(g):
            covered.append(doc_id)
    every = np.concatenate(grams) if grams else np.zeros(0, np.uint64)
    repeated = len(every) - len(np.unique(every))
    return {"val_positions": val_positions, "val_in_train": val_in_train, "val_covered": covered,
            "positions": len(every), "repeated": repeated, "near_pairs": near_pairs(docs, grams)}


def near_pairs(docs, grams) -> list[tuple[str, str, float]]:
    """(doc_id, doc_id, containment) of the document pairs from different sources whose smaller document has at
    least NEAR of its sampled 13-grams in the other."""
    sampled = [np.unique(g[g % SAMPLE == 0]) for g in grams]
    size = np.array([len(s) for s in sampled])
    gram = np.concatenate(sampled) if sampled else np.zeros(0, np.uint64)
    doc = np.repeat(np.arange(len(sampled)), size)
    order = np.argsort(gram, kind="stable")
    gram, doc = gram[order], doc[order]
    starts = np.flatnonzero(np.r_[True, gram[1:] != gram[:-1]]) if len(gram) else np.zeros(0, int)
    lengths = np.diff(np.r_[starts, len(gram)])
    shared: Counter = Counter()
    src = [source_of(d[0]) for d in docs]
    useful = (lengths >= 2) & (lengths <= MAX_POSTINGS)
    for s, n in zip(starts[useful], lengths[useful]):
        ds = doc[s:s + n].tolist()
        for i, a in enumerate(ds):
            for b in ds[i + 1:]:
                if src[a] != src[b]:
                    shared[(a, b)] += 1
    out = []
    for (a, b), k in shared.items():
        smaller = min(size[a], size[b])
        if smaller >= 4 and k >= NEAR * smaller:
            out.append((docs[a][0], docs[b][0], k / smaller))
    return sorted(out)


def whitespace_ids(decode, n: int) -> np.ndarray:
    """blank[id]: whether token `id` (of ids 0..n-1) is whitespace only, its text all spaces, tabs or line breaks."""
    return np.array([decode([i]).isspace() for i in range(n)], dtype=bool)


def whitespace_run_tokens(ids, blank: np.ndarray) -> int:
    """How many of a document's token ids are in runs of at least WHITESPACE_RUN whitespace-only tokens in a row."""
    b = blank[np.asarray(ids, dtype=np.int64)].astype(np.int8)
    edges = np.flatnonzero(np.diff(np.r_[np.int8(0), b, np.int8(0)]))   # starts and ends of the runs, in turn
    lengths = edges[1::2] - edges[::2]
    return int(lengths[lengths >= WHITESPACE_RUN].sum())


def indented_lines(text: str) -> int:
    return sum(len(line) - len(line.lstrip(" ")) >= INDENTED for line in text.split("\n"))


def audit(docs, tokens, eval_tokens: int, max_chars: int, runs) -> dict:
    """The report's numbers (see the module docstring)."""
    markup = {name: Counter() for name in MARKUP}
    bare, bare_chars, code, chars = Counter(), Counter(), 0, 0
    whitespace = {s: {"run_tokens": 0, "indented_lines": 0} for s in ("train", "val")}
    for (doc_id, split, text), n in zip(docs, runs):
        whitespace[split]["run_tokens"] += n
        whitespace[split]["indented_lines"] += indented_lines(text)
    for doc_id, _, text in docs:
        sid = source_of(doc_id)
        for name, pattern in MARKUP.items():
            n = len(pattern.findall(text))
            if n:
                markup[name][sid] += n
        for p in text.split("\n\n"):
            if bare_identifier(p) or URL.fullmatch(p.strip()):
                bare[sid] += 1
                bare_chars[sid] += len(p)
        code += sum(len(line) for line in text.split("\n") if code_like(line))
        chars += len(text)
    longest = max(docs, key=lambda d: len(d[2]))
    return {"sources": shares(docs, tokens, eval_tokens), "eval_tokens": eval_tokens, "ngrams": ngram_stats(docs),
            "markup": {k: dict(v) for k, v in markup.items()}, "bare_identifiers": dict(bare),
            "bare_identifier_chars": dict(bare_chars), "chars": chars, "code_chars": code,
            "longest": (longest[0], len(longest[2])), "max_chars": max_chars,
            "over_cap": sum(len(t) > max_chars for _, _, t in docs), "documents": len(docs),
            "whitespace": whitespace}


def top(counter: dict, k=3) -> str:
    return ", ".join(f"{sid} {n:,}" for sid, n in sorted(counter.items(), key=lambda x: -x[1])[:k])


def report(a: dict) -> str:
    """The audit as text: the per-source table, then one line per measure."""
    src, tot = a["sources"], {s: sum(r[s] for r in a["sources"].values()) or 1 for s in ("train", "val", "eval")}
    rows = [f"{'source':<24} {'train tokens':>13} {'train':>6} {'val tokens':>11} {'val':>6} "
            f"{'eval slice':>10} {'eval':>6} {'gap':>6}"]
    gaps = {}
    for sid, r in src.items():
        share = {s: r[s] / tot[s] for s in tot}
        gaps[sid] = share["eval"] - share["train"]
        rows.append(f"{sid:<24} {r['train']:>13,} {share['train']:>6.1%} {r['val']:>11,} {share['val']:>6.1%} "
                    f"{r['eval']:>10,} {share['eval']:>6.1%} {gaps[sid]:>+6.1%}")
    worst = max(gaps, key=lambda s: abs(gaps[s]))
    n = a["ngrams"]
    pairs = Counter(tuple(sorted((p[0].split(":", 1)[0], p[1].split(":", 1)[0]))) for p in n["near_pairs"])
    rows += [
        f"eval slice: the first {a['eval_tokens']:,} tokens of val.bin; largest gap to the train share: {worst} "
        f"{gaps[worst]:+.1%} (target within ±3 points)",
        f"val 13-grams in train: {n['val_in_train']:,} of {n['val_positions']:,} positions "
        f"({n['val_in_train'] / max(n['val_positions'], 1):.2%}; target <= 1%); val documents over "
        f"{COVERED:.0%} covered by train: {len(n['val_covered'])}",
        f"13-gram positions that repeat an earlier one: {n['repeated'] / max(n['positions'], 1):.1%} of "
        f"{n['positions']:,}",
        f"near-duplicate pairs across sources (>= {NEAR:.0%} of the smaller one's sampled 13-grams): "
        f"{len(n['near_pairs']):,}" + (f"; most: {top(dict(pairs), 5)}" if pairs else ""),
    ]
    for name, counts in a["markup"].items():
        rows.append(f"{name}: {sum(counts.values()):,}" + (f" ({top(counts)})" if counts else ""))
    bare = a["bare_identifiers"]
    rows += [f"bare-identifier paragraphs: {sum(bare.values()):,}, {sum(a['bare_identifier_chars'].values()):,} "
             f"characters ({sum(a['bare_identifier_chars'].values()) / max(a['chars'], 1):.2%})"
             + (f" ({top(bare)})" if bare else ""),
             f"code-like characters: {a['code_chars'] / max(a['chars'], 1):.1%} of {a['chars']:,}",
             f"longest document: {a['longest'][0]}, {a['longest'][1]:,} characters; documents over the "
             f"{a['max_chars']:,}-character cap: {a['over_cap']:,} of {a['documents']:,}"]
    ws = a["whitespace"]
    rows.append(f"tokens in runs of >= {WHITESPACE_RUN} whitespace-only tokens: " + ", ".join(
        f"{s} {ws[s]['run_tokens']:,} of {tot[s]:,} ({ws[s]['run_tokens'] / tot[s]:.2%})" for s in ("train", "val"))
        + f"; lines indented >= {INDENTED} spaces: train {ws['train']['indented_lines']:,}, val "
          f"{ws['val']['indented_lines']:,}")
    return "\n".join(rows)
