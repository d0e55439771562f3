"""
The pinned corpus's cleaning, on documents already extracted (pinned_corpus.py reads the artifacts): word 13-grams,
the fingerprint that near-duplicate removal, the split's leak check and corpus.py's audit share.

Word 13-grams are taken over words made of letters only, lower-cased: numbers (line numbers, verse numbers, page
numbers) and punctuation do not change them, so an edition that numbers its lines is the same text as one that
does not. A word is hashed with BLAKE2b (8 bytes), a 13-gram by a polynomial over its words' hashes modulo 2^64:
the same numbers on every machine and Python (Python's own hash() of a string changes with every process).
"""
import hashlib
import re

import numpy as np

GRAM = 13  # words per n-gram: long enough that a shared 13-gram is a copy, not a common phrase
WORD = re.compile(r"[^\W\d_]+")  # a run of letters (any script); digits and underscores split words
_PRIME = np.uint64(0x100000001B3)  # the polynomial's base (FNV's 64-bit prime)
_word_hash: dict[str, int] = {}


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
