"""
The pinned corpus's cleaning and split, on documents already extracted (pinned_corpus/build.py reads the artifacts and
calls these in order):

    drop_boilerplate(texts)     per source: paragraphs on most of its pages (navigation, headers) go
    pieces(text)                a text cut into documents of at most MAX_CHARS: between paragraphs, else lines,
                                else sentences, else words
    deduplicate(docs)           across sources, in manifest order: exact copies, long paragraphs seen before, and
                                documents mostly made of them go (the first occurrence stays)
    near_duplicates(grams)      ... and documents whose word 13-grams were mostly seen before (survives line numbers)
    split(...)                  val = whole units (a file, or an entry of a collection) chosen per source up to
                                VAL_SHARE of its characters, among the units that share few 13-grams with any other
    val_order(...)              val documents interleaved so that any prefix holds every source in proportion

Word 13-grams are taken over words made of letters only, lower-cased: numbers (line numbers, verse numbers, page
numbers) and punctuation do not change them, so an edition that numbers its lines is the same text as one that
does not. A word is hashed with BLAKE2b (8 bytes), a 13-gram by a polynomial over its words' hashes modulo 2^64:
the same numbers on every machine and Python (Python's own hash() of a string changes with every process).
"""
import hashlib
import re
from collections import Counter
from typing import Iterable, Iterator

import numpy as np

MAX_CHARS = 8_000  # longer texts become several documents (about 2,000 GPT-2 tokens: more than any context here)
MIN_CHARS = 200  # shorter documents are mostly headings, stubs and index pages
MIN_PARA_CHARS = 80  # a repeated paragraph this long is boilerplate or a copy; shorter ones ("Examples") may repeat
SEEN_SHARE = 0.5  # a document with more than this share of its characters in paragraphs seen before is a copy
BOILER_SHARE, BOILER_MIN = 0.2, 10  # a paragraph in >= 20% (and >= 10) of a source's files is page furniture
NEAR_SHARE = 0.5  # a document with more than this share of its word 13-grams seen before is a near duplicate
VAL_SHARE = 0.04  # val takes about this share of each source's characters
LEAK_MAX = 0.02  # a unit with more than this share of its 13-grams in any other unit stays in train
LOOK = 4  # val_order chooses among each source's next LOOK documents
COLLECTIONS = {"dictd", "jsii", "wordnet"}  # formats whose file is many independent entries: a document is a unit
GRAM = 13  # words per n-gram: long enough that a shared 13-gram is a copy, not a common phrase
WORD = re.compile(r"[^\W\d_]+")  # a run of letters (any script); digits and underscores split words
_PRIME = np.uint64(0x100000001B3)  # the polynomial's base (FNV's 64-bit prime)
_word_hash: dict[str, int] = {}


# ----------------------------------------------------------------------------- paragraphs and pieces

def paragraphs(text: str) -> list[str]:
    return [p for p in text.split("\n\n") if p.strip()]


def para_key(p: str) -> bytes:
    return hashlib.sha256(" ".join(p.lower().split()).encode()).digest()[:12]


def drop_boilerplate(texts: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Without the paragraphs that recur in at least BOILER_SHARE of a source's files (and in BOILER_MIN or more):
    navigation, headers and footers of generated pages."""
    counts = Counter(k for _, text in texts for k in {para_key(p) for p in paragraphs(text)})
    limit = max(BOILER_MIN, BOILER_SHARE * len(texts))
    return [(doc_id, "\n\n".join(p for p in paragraphs(text) if counts[para_key(p)] < limit)) for doc_id, text in texts]


CUTS = (("\n", re.compile(r"\n")), (" ", re.compile(r"(?<=[.!?])\s+")), (" ", re.compile(r"\s+")))


def cut(text: str, limit: int, level: int = 0) -> list[str]:
    """One paragraph in parts of at most `limit` characters, packed greedily: cut at line breaks, a line too long
    at sentence ends, a sentence too long at spaces, a word too long anywhere."""
    if len(text) <= limit:
        return [text]
    if level == len(CUTS):
        return [text[i:i + limit] for i in range(0, len(text), limit)]
    joiner, at = CUTS[level]
    out, cur = [], ""
    for unit in at.split(text):
        if not unit:
            continue
        if len(unit) > limit:
            if cur:
                out.append(cur)
            *whole, cur = cut(unit, limit, level + 1)   # the tail of a cut unit is packed on with the next ones
            out += whole
        elif cur and len(cur) + len(joiner) + len(unit) > limit:
            out.append(cur)
            cur = unit
        else:
            cur = cur + joiner + unit if cur else unit
    return out + [cur] if cur else out


def pieces(text: str, limit: int | None = None) -> list[str]:
    """The text as documents of at most `limit` (MAX_CHARS) characters: whole paragraphs packed greedily, a longer
    paragraph cut (cut) into parts of its own."""
    limit = limit or MAX_CHARS
    parts, cur = [], ""
    for block in (b for p in text.split("\n\n") for b in cut(p, limit)):
        if cur and len(cur) + 2 + len(block) > limit:
            parts.append(cur)
            cur = block
        else:
            cur = cur + "\n\n" + block if cur else block
    return parts + [cur] if cur else parts


# ----------------------------------------------------------------------------- duplicates

def deduplicate(docs: Iterable[tuple[str, str]]) -> Iterator[tuple[str, str]]:
    """Drop exact duplicates, long paragraphs seen before, and documents that are mostly copies (in input order:
    the first occurrence stays)."""
    seen_docs, seen_paras = set(), set()
    for doc_id, text in docs:
        h = hashlib.sha256(text.encode()).digest()
        if h in seen_docs:
            continue
        seen_docs.add(h)
        paras = paragraphs(text)
        keys = [para_key(p) if len(p) >= MIN_PARA_CHARS else None for p in paras]
        prior = [k is not None and k in seen_paras for k in keys]
        copied = sum(len(p) for p, c in zip(paras, prior) if c)
        seen_paras.update(k for k in keys if k is not None)
        if copied > SEEN_SHARE * len(text):
            continue
        if copied:
            text = "\n\n".join(p for p, c in zip(paras, prior) if not c)
        if len(text) >= MIN_CHARS:
            yield doc_id, text


def word_hashes(text: str) -> np.ndarray:
    """The 64-bit hashes of the words of `text` (letters only, lower-cased), in order."""
    out = []
    for w in WORD.findall(text.lower()):
        h = _word_hash.get(w)
        if h is None:
            h = _word_hash[w] = int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little")
        out.append(h)
    return np.array(out, dtype=np.uint64)


def gram_hashes(text: str, n: int = GRAM) -> np.ndarray:
    """The 64-bit hashes of the word n-grams of `text`, one per position (empty when it has fewer than n words)."""
    w = word_hashes(text)
    if len(w) < n:
        return np.zeros(0, dtype=np.uint64)
    m = len(w) - n + 1
    h = np.zeros(m, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(n):
            h = h * _PRIME + w[j:j + m]
    return h


def gram_runs(grams: list[np.ndarray], owner: np.ndarray):
    """All positions sorted by 13-gram (stable: in document order within one 13-gram), with for each position its
    owner (owner[d] for document d) and the first and last owner of its 13-gram's run."""
    doc = np.repeat(np.arange(len(grams)), [len(g) for g in grams])
    gram = np.concatenate(grams) if grams else np.zeros(0, np.uint64)
    order = np.argsort(gram, kind="stable")
    gram, who = gram[order], owner[doc[order]]
    starts = np.flatnonzero(np.r_[True, gram[1:] != gram[:-1]]) if len(gram) else np.zeros(0, np.int64)
    lengths = np.diff(np.r_[starts, len(gram)])
    return (doc[order], who, np.repeat(np.minimum.reduceat(who, starts) if len(who) else who, lengths),
            np.repeat(np.maximum.reduceat(who, starts) if len(who) else who, lengths))


def near_duplicates(grams: list[np.ndarray]) -> set[int]:
    """The documents (indices, in corpus order) with more than NEAR_SHARE of their 13-gram positions holding a
    13-gram that an earlier document holds (whether or not that one was kept: the first occurrence stays)."""
    doc, who, first, _ = gram_runs(grams, np.arange(len(grams)))
    seen = np.bincount(doc[first < who], minlength=len(grams))
    sizes = np.array([len(g) for g in grams])
    return set(np.flatnonzero(seen > NEAR_SHARE * np.maximum(sizes, 1)).tolist())


# ----------------------------------------------------------------------------- split

def unit_of(doc_id: str, fmt: str) -> str:
    """The split unit of a document: its file (or the reader's record: a Bible chapter), so that every part of it
    is in one split; for a collection of independent entries (a dictionary, a jsii assembly) each document."""
    return doc_id if fmt in COLLECTIONS else re.sub(r"#part\d+$", "", doc_id)


def shared_shares(grams: list[np.ndarray], unit: np.ndarray) -> np.ndarray:
    """Per unit: the share of its 13-gram positions whose 13-gram occurs in another unit too."""
    doc, who, lo, hi = gram_runs(grams, unit)
    n_units = int(unit.max()) + 1 if len(unit) else 0
    shared = np.bincount(who[lo != hi], minlength=n_units)
    total = np.bincount(who, minlength=n_units)
    return shared / np.maximum(total, 1)


def choose_val(units: list[tuple[str, str, int]], eligible: set[str]) -> set[str]:
    """The val units: (source, unit, characters) taken per source in sha256(unit) order, each eligible unit that
    keeps the source's val nearest VAL_SHARE of its characters (one whose half would pass it is skipped)."""
    target = Counter()
    for sid, _, chars in units:
        target[sid] += VAL_SHARE * chars
    have, val = Counter(), set()
    for sid, u, chars in sorted(units, key=lambda x: (x[0], hashlib.sha256(x[1].encode()).digest())):
        if u in eligible and have[sid] + chars / 2 < target[sid]:
            val.add(u)
            have[sid] += chars
    return val


def val_order(val: list[tuple[str, str]], sizes: list[int], weight: dict[str, float]) -> list[int]:
    """The order of the val documents (source, text) with `sizes` (tokens): each next document is, among the next
    LOOK documents of every source in sha256(text) order, the one that leaves the largest gap between a source's
    share of the documents placed so far and its share of train (`weight`, normalised) smallest. So every prefix
    holds each source nearly in proportion; a source whose documents are large next to its share comes in once the
    prefix is long enough to hold one."""
    sources = sorted({s for s, _ in val})
    col = {s: k for k, s in enumerate(sources)}
    w = np.array([weight[s] for s in sources], dtype=np.float64)
    w /= w.sum()
    queues: dict[str, list[int]] = {s: [] for s in sources}
    for i in sorted(range(len(val)), key=lambda i: (val[i][0], hashlib.sha256(val[i][1].encode()).digest())):
        queues[val[i][0]].append(i)
    have, total, order = np.zeros(len(sources)), 0.0, []
    while len(order) < len(val):
        cand = [(s, j) for s in sources for j in range(min(LOOK, len(queues[s])))]
        rows = np.arange(len(cand))
        size = np.array([sizes[queues[s][j]] for s, j in cand], dtype=np.float64)
        after = total + size
        gap = have[None, :] - w[None, :] * after[:, None]   # tokens over (+) or under (-) each share
        gap[rows, [col[s] for s, _ in cand]] += size
        k = int(np.argmin(np.abs(gap).max(axis=1) / after))   # the first of equals: sources in sorted order
        s, j = cand[k]
        order.append(queues[s].pop(j))
        have[col[s]] += size[k]
        total += size[k]
    return order


def split(docs: list[tuple[str, str]], grams: list[np.ndarray], formats: dict[str, str],
          count) -> list[tuple[str, str, str]]:
    """(doc_id, split, text) of the cleaned documents (doc_id = source:file..., with their 13-grams and each
    source's format): train in their order, then val in val_order. val is chosen by choose_val among the units
    with at most LEAK_MAX of their 13-gram positions shared with another unit. count: text -> tokens."""
    sources = [d.split(":", 1)[0] for d, _ in docs]
    units = [unit_of(d, formats[s]) for (d, _), s in zip(docs, sources)]
    index = {u: k for k, u in enumerate(dict.fromkeys(units))}
    share = shared_shares(grams, np.array([index[u] for u in units], dtype=np.int64))
    chars = Counter()
    for (_, text), s, u in zip(docs, sources, units):
        chars[(s, u)] += len(text)
    val_units = choose_val([(s, u, n) for (s, u), n in chars.items()], {u for u, k in index.items()
                                                                       if share[k] <= LEAK_MAX})
    train = [(d, "train", t) for (d, t), u in zip(docs, units) if u not in val_units]
    val = [(d, t, s) for (d, t), s, u in zip(docs, sources, units) if u in val_units]
    sizes = [count(t) for _, t, _ in val]
    train_chars, val_chars, val_tokens = Counter(), Counter(), Counter()
    for d, _, t in train:
        train_chars[d.split(":", 1)[0]] += len(t)
    for (_, t, s), n in zip(val, sizes):
        val_chars[s] += len(t)
        val_tokens[s] += n
    weight = {s: train_chars[s] * val_tokens[s] / val_chars[s] for s in val_chars}   # train share, in tokens
    order = val_order([(s, t) for _, t, s in val], sizes, weight)
    return train + [(val[i][0], "val", val[i][1]) for i in order]
