"""The pinned corpus as prepared token folders (harness/dataset.py's format): the corpus itself (prepare_pinned) and
Guo et al.'s Bigram-Backcopy task on the characters of its Shakespeare (shakespeare_chain, prepare_bb_shakespeare).
prepare_c4.py --source pinned / bb_shakespeare and reproduce.py call these.

    python -c "from pinned_corpus import prepare; prepare.prepare_pinned()"   # = python prepare_c4.py --source pinned
"""
from itertools import islice
from pathlib import Path

import numpy as np

from harness.dataset import SPLITS, load_meta, prepare
from harness.fileio import PrepareError
from harness.sources import backcopy_documents, char_bigrams
from harness.tokenizer import Tokenizer, gpt2_ranks_file, load_tokenizer
from pinned_corpus import build as pinned


def prepare_pinned(out_dir=None, subset="cpu", corpus_archive=None, num_proc=1, force=False, tokenizer="gpt2") -> Path:
    """The pinned corpus (pinned_corpus/build.py, pinned_corpus/manifest.json) in GPT-2's ids (or another tokenizer's, for a public
    model). Each source's text is checked against the manifest before tokenising, each split's token file after
    (GPT-2 ids: the manifest records their sha256s); a difference is one line naming the source.
    corpus_archive: read the archive subset from this file (no network, no artifacts)."""
    manifest, cache = pinned.load_manifest(), pinned.default_cache()
    if corpus_archive is not None and subset != "archive":
        raise PrepareError("--corpus_archive holds the archive subset: pass --subset archive")
    if tokenizer in ("gpt2", "auto") and gpt2_ranks_file() is None:
        pinned.gpt2_ranks(cache, manifest)   # the pinned ranks, fetched from the registry (sha256-checked)
    tok = load_tokenizer(tokenizer)
    args = {"source": "pinned", "subset": subset, "manifest_sha256": pinned.manifest_sha256(),
            "tokenizer": tok.name, "tokenizer_sha256": tok.sha256}
    gpt2 = tok.name == "gpt2"
    source = f"pinned corpus, {subset} subset (pinned_corpus/manifest.json sha256 {args['manifest_sha256'][:16]}...)"
    description = ("NOT C4. English prose from pinned registry artifacts (pinned_corpus/manifest.json; docs/data.md): "
                   "documentation, books, speeches, dictionaries; markup stripped, duplicates removed; val = whole "
                   "files, about 4% of each source, ordered so that any prefix holds every source in proportion. "
                   "The same on every installation.")
    splits = {}

    def split_texts(split):
        if not splits:
            docs = list(pinned.documents(subset, cache, manifest, archive=corpus_archive and Path(corpus_archive)))
            pinned.check_texts(docs, subset, manifest)
            splits.update({s: [text for _, sp, text in docs if sp == s] for s in SPLITS})
        return splits[split]

    out = prepare(out_dir or f"data/pinned_{subset}", tok, args, source, description, True, split_texts,
                  {"train": (None, None), "val": (None, None)}, num_proc, force)
    if gpt2 or tok.name == "bytes":
        pinned.check_splits(load_meta(out)["splits"], subset, manifest, tok.name)
    return out



SHAKESPEARE_TEXTS = "/shksprdata/texts/"   # the plays and poems among the pinned 'shakespeare' source's files


def shakespeare_chain(cache: Path | None = None, triggers: int = 3) -> dict:
    """The statistics of Guo et al.'s Bigram-Backcopy task, from the characters of Shakespeare's plays and poems in
    the pinned corpus (the 'shakespeare' source, fetched and sha256-checked like every pinned artifact): the
    characters (ids 0..C-1, sorted), then <s> (id C, the document separator, at position 0 of every window) and a
    delimiter <d> (id C+1, never generated: Guo et al.'s vocabulary has it); `cond`, the character bigram frequencies
    (a character never followed by another gets the marginal), `first`, the marginal without the triggers, and the
    `triggers`, the most frequent characters."""
    manifest = pinned.load_manifest()
    cache = cache or pinned.default_cache()
    src = next(s for s in manifest["sources"] if s["id"] == "shakespeare")
    pinned.fetch(src, cache)
    texts = [text for name, text in pinned.extracted(src, cache) if SHAKESPEARE_TEXTS in name]
    chars, counts, unigram = char_bigrams(texts)
    c = len(chars)
    marginal = np.concatenate([unigram / unigram.sum(), [0.0, 0.0]])
    cond = np.zeros((c + 2, c + 2))
    rows = counts.sum(axis=1)
    cond[:c, :c] = np.where(rows[:, None] > 0, counts / np.maximum(rows, 1)[:, None], marginal[None, :c])
    cond[c:] = marginal   # <s> and <d>: never generated as the current token, given rows for completeness
    top = [int(i) for i in np.argsort(-marginal[:c], kind="stable")[:triggers]]
    first = marginal.copy()
    first[top] = 0
    return {"chars": chars, "cond": cond, "first": first / first.sum(), "triggers": top, "marginal": marginal}


def prepare_bb_shakespeare(out_dir="data/bb_shakespeare", doc_len=256, train_docs=60_000, val_docs=500, triggers=3,
                           seed=0, force=False) -> Path:   # the defaults: harness.dataset.BB_SHAKESPEARE
    """Guo et al.'s Bigram-Backcopy task on Shakespeare's characters (shakespeare_chain): every document is <s>
    followed by doc_len tokens, so that a training window of doc_len tokens with windows='document' is exactly one of
    their sequences (<s> at position 0). train and val are disjoint draws (one generator, val first). meta.json also
    records "triggers" (token ids; analyze.py reports attention from the other queries) and "chars"."""
    chain = shakespeare_chain(triggers=triggers)
    chars, c = chain["chars"], len(chain["chars"])
    tok = Tokenizer("bb_shakespeare", c + 2, c, lambda ids: ids,
                    decode=lambda ids: "".join(chars[i] if i < c else ("<s>", "<d>")[i - c] for i in ids))
    args = {"source": "bb_shakespeare", "doc_len": doc_len, "train_docs": train_docs, "val_docs": val_docs,
            "triggers": triggers, "seed": seed, "manifest_sha256": pinned.manifest_sha256()}
    docs = backcopy_documents(val_docs + train_docs, doc_len, chain["cond"], chain["first"], chain["triggers"], seed)
    shown = ", ".join(repr(chars[i]) for i in chain["triggers"])
    description = (f"NOT C4. Guo et al.'s Bigram-Backcopy task (2024): a Markov chain over the {c} characters of "
                   f"Shakespeare's plays and poems (the pinned corpus's 'shakespeare' source), {triggers} trigger "
                   f"tokens (the most frequent characters: {shown}) after which the token before the trigger comes "
                   f"again; every document is <s> (the separator, id {c}) and {doc_len} tokens; a delimiter <d> (id "
                   f"{c + 1}) is in the vocabulary but never generated; seed {seed}.")
    return prepare(out_dir, tok, args, "bb_shakespeare", description, True,
                   lambda split: islice(docs, val_docs if split == "val" else train_docs),
                   {"train": (None, train_docs), "val": (None, val_docs)}, 1, force,
                   extra={"triggers": chain["triggers"], "chars": chars})
