"""Where prepare_c4.py's documents come from: C4 shards (local or the hub), WikiText-2 articles, the docstrings
of this Python installation (pydoc topics and docstrings: installation-dependent text) and the synthetic Bigram-Backcopy task.
Each yields document texts (or token arrays) in a fixed order; harness/dataset.py writes them."""
import ast
import glob
import hashlib
import os
import re
import multiprocessing
import sysconfig
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from harness.fileio import PrepareError, Progress
from harness.tokenizer import CHUNK_DOCS, _ignore_sigint


C4_SHARD = re.compile(r"c4-(train|validation)\..*\.json(\.gz)?")
MIN_DOC_CHARS = 200  # installed docstrings: shorter docstrings are mostly one-liners
VAL_PERCENT = 2  # installed docstrings: sha1(text) % 100 < 2 -> val
# WikiText-2 (raw): the file and the Hugging Face split of each of our splits; val is the TEST split
WIKITEXT_SPLITS = {"train": ("wiki.train.raw", "train"), "val": ("wiki.test.raw", "test")}
WIKITEXT_TITLE = re.compile(r"= [^=](.*[^=])? =")  # an article's title line; sections are "= = ... = ="


def find_c4_shards(patterns: list[str]) -> dict[str, list[str]]:
    """Local C4 shards by split, sorted: folders (searched recursively), globs or files."""
    files = []
    for pattern in patterns:
        if os.path.isdir(pattern):
            found = sorted(str(p) for p in Path(pattern).rglob("c4-*.json*") if C4_SHARD.fullmatch(p.name))
            if not found:
                raise PrepareError(f"--data_files {pattern}: no c4-train.*.json.gz or c4-validation.*.json.gz files in it")
        else:
            found = sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))
            if not found:
                raise PrepareError(f"--data_files {pattern}: no such file")
            for p in found:
                if not C4_SHARD.fullmatch(os.path.basename(p)):
                    raise PrepareError(f"--data_files {p}: not a C4 shard name (c4-train.*.json.gz or c4-validation.*.json.gz)")
        files += found
    files = sorted(set(os.path.abspath(p) for p in files))
    shards = {split: [p for p in files if C4_SHARD.fullmatch(os.path.basename(p)).group(1) == c4_split]
              for split, c4_split in (("train", "train"), ("val", "validation"))}
    for split, c4_split in (("train", "train"), ("val", "validation")):
        if not shards[split]:
            raise PrepareError(f"--data_files: no c4-{c4_split}.*.json.gz shard among {' '.join(patterns)}")
    return shards


def c4_texts(split: str, shards: dict[str, list[str]] | None) -> Iterator[str]:
    """Texts of C4 en `split` ("train"/"val"), streamed from the hub (shards None) or local shards, one shard
    at a time in order (so that an unreadable shard is named in the error)."""
    import datasets
    c4_split = {"train": "train", "val": "validation"}[split]
    for shard in [None] if shards is None else shards[split]:
        where = f"the --data_files {c4_split} shard {shard}"
        try:
            if shard is None:
                ds = datasets.load_dataset("allenai/c4", "en", split=c4_split, streaming=True)
            else:
                ds = datasets.load_dataset("json", data_files={c4_split: [shard]}, split=c4_split, streaming=True)
            # only the text column, in batches: decoding every record's timestamp and url one by one
            # costs more than the JSON parsing
            for batch in ds.select_columns(["text"]).iter(batch_size=CHUNK_DOCS):
                if not all(isinstance(text, str) for text in batch["text"]):
                    raise PrepareError(f"C4 {c4_split} record without a 'text' string" + (f" in {shard}" if shard else "")
                                       + "; C4 shards are JSON lines with a 'text' field")
                yield from batch["text"]
        except PrepareError:
            raise
        except Exception as e:
            msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            if shard is None:
                raise PrepareError(f"cannot stream allenai/c4 from the Hugging Face hub ({msg}); without network "
                                   "pass --data_files DIR with local C4 shards, or --source pinned") from None
            raise PrepareError(f"cannot read {where} as C4 JSON lines ({msg}); the file is corrupt or not a C4 "
                               "shard: replace it and run the same command again") from None


def wikitext_articles(lines: Iterable[str]) -> Iterator[str]:
    """WikiText's articles from the lines of a raw file: a title line " = Title = " starts an article (section
    headings are " = = Section = = "). Each line is stripped of surrounding whitespace, blank lines are dropped and
    the article's lines are joined with newlines, so the raw files and the Hugging Face rows give the same text."""
    article = []
    for line in lines:
        text = line.strip()
        if not text:
            continue
        if WIKITEXT_TITLE.fullmatch(text) and article:
            yield "\n".join(article)
            article = []
        article.append(text)
    if article:
        yield "\n".join(article)


def wikitext_files(folder: str) -> dict[str, Path]:
    """The raw file of each split in folder (checked before anything is written)."""
    files = {split: Path(folder) / name for split, (name, _) in WIKITEXT_SPLITS.items()}
    missing = [p.name for p in files.values() if not p.is_file()]
    if missing:
        raise PrepareError(f"--wikitext_dir {folder}: no {' or '.join(missing)} in it; it must hold the files of "
                           f"wikitext-2-raw-v1.zip (wiki.train.raw, wiki.valid.raw, wiki.test.raw)")
    return files


def wikitext_texts(split: str, folder: str | None) -> Iterator[str]:
    """Articles of WikiText-2 (raw) `split` ("train"/"val" = test), from the raw files in folder, or from the
    Hugging Face hub (Salesforce/wikitext, wikitext-2-raw-v1; one row per line of the raw file) when folder is None."""
    if folder is not None:
        with open(wikitext_files(folder)[split], encoding="utf-8") as f:
            yield from wikitext_articles(f)
        return
    import datasets
    try:
        rows = datasets.load_dataset("Salesforce/wikitext", "wikitext-2-raw-v1", split=WIKITEXT_SPLITS[split][1])
        lines = [row["text"] for row in rows]
    except Exception as e:
        msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        raise PrepareError(f"cannot load wikitext-2-raw-v1 from the Hugging Face hub ({msg[:200]}); without network "
                           f"pass --wikitext_dir DIR holding wiki.train.raw and wiki.test.raw (wikitext-2-raw-v1.zip)") from None
    yield from wikitext_articles(lines)


SKIP_DIRS = {"test", "tests", "__pycache__", "site-packages", "dist-packages", "idlelib", "turtledemo"}


def python_files(root: str) -> list[str]:
    """Sorted .py files under root, without test code."""
    out = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith(".") and not d.endswith("-info"))
        out += [os.path.join(folder, f) for f in sorted(files) if f.endswith(".py")
                and not f.startswith(("test_", "conftest")) and not f.endswith("_test.py")]
    return out


def docstrings(path: str) -> list[str]:
    """Module, class and function docstrings of one source file (parsed, not imported)."""
    try:
        tree = ast.parse(Path(path).read_bytes())
    except (SyntaxError, ValueError, UnicodeDecodeError, RecursionError, OSError):
        return []
    nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return [d for node in ast.walk(tree) if isinstance(node, nodes) and (d := ast.get_docstring(node))]


def docstring_documents(max_docs: int | None = None, num_proc: int = 1) -> list[str]:
    """Unique documents of >= MIN_DOC_CHARS characters, in a fixed order: pydoc topics, then docstrings of
    the standard library, then of site-packages. max_docs stops early (for tests)."""
    from pydoc_data.topics import topics
    seen, docs = set(), []

    def take(texts):
        for text in texts:
            text = text.strip()
            if len(text) >= MIN_DOC_CHARS and text not in seen:
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:  # lone surrogates in string literals
                    continue
                seen.add(text)
                docs.append(text)
                if max_docs is not None and len(docs) >= max_docs:
                    return True
        return False

    if take(topics[k] for k in sorted(topics)):
        return docs
    paths = sysconfig.get_paths()
    roots = [paths["stdlib"]] + sorted({paths["purelib"], paths["platlib"]})
    files = [f for root in roots if os.path.isdir(root) for f in python_files(root)]
    progress = Progress("installed docstrings: reading", target_docs=len(files), unit="files")
    pool = multiprocessing.Pool(num_proc, initializer=_ignore_sigint) if num_proc > 1 else None
    try:
        for i, texts in enumerate(pool.imap(docstrings, files, chunksize=16) if pool else map(docstrings, files)):
            progress.update(i + 1, 0)
            if take(texts):
                break
    finally:
        if pool:
            pool.terminate()
    progress.done(f"{len(docs):,} documents, {sum(map(len, docs)) / 1e6:.1f} M characters")
    return docs


def docstring_splits(docs: list[str]) -> dict[str, list[str]]:
    """Deterministic split by content hash; each split is ordered by hash, which mixes the sources."""
    keyed = sorted((hashlib.sha1(d.encode("utf-8")).hexdigest(), d) for d in docs)
    return {"train": [d for h, d in keyed if int(h, 16) % 100 >= VAL_PERCENT],
            "val": [d for h, d in keyed if int(h, 16) % 100 < VAL_PERCENT]}


def char_bigrams(texts: list[str]) -> tuple[str, np.ndarray, np.ndarray]:
    """(the characters of `texts`, sorted; counts[a, b] of character b following character a within a text; the
    count of each character)."""
    chars = sorted(set().union(*map(set, texts)))
    index = {c: i for i, c in enumerate(chars)}
    counts, unigram = np.zeros((len(chars), len(chars)), dtype=np.int64), np.zeros(len(chars), dtype=np.int64)
    for text in texts:
        ids = np.fromiter((index[c] for c in text), dtype=np.int64, count=len(text))
        np.add.at(counts, (ids[:-1], ids[1:]), 1)
        unigram += np.bincount(ids, minlength=len(chars))
    return "".join(chars), counts, unigram


def backcopy_documents(n_docs, doc_len, cond, first, triggers, seed, chunk=4096):
    """Documents of Guo et al.'s Bigram-Backcopy task as their paper and released code define it: the first token
    drawn from `first` (the unigram marginal with the triggers removed), every next token from the Markov chain `cond`
    (rows: the current token), except that after a trigger token the token before the trigger comes again. cond
    (V x V) and first (V) are probabilities; triggers are token ids. Documents are generated `chunk` at a time, one
    position for the whole chunk per step (vectorised: seconds for millions of tokens). Yields int64 arrays of
    doc_len tokens, deterministic for a seed and chunk."""
    rng = np.random.default_rng(seed)
    cdf, first_cdf = np.cumsum(cond, axis=1), np.cumsum(first)
    cdf[:, -1] = first_cdf[-1] = 1.0
    is_trigger = np.zeros(len(first), dtype=bool)
    is_trigger[list(triggers)] = True
    for start in range(0, n_docs, chunk):
        n = min(chunk, n_docs - start)
        docs = np.empty((n, doc_len), dtype=np.int64)
        docs[:, 0] = np.searchsorted(first_cdf, rng.random(n), side="right")
        for t in range(1, doc_len):
            cur = docs[:, t - 1]
            markov = (cdf[cur] <= rng.random(n)[:, None]).sum(axis=1)
            docs[:, t] = np.where(is_trigger[cur], docs[:, t - 2], markov) if t >= 2 else markov
        yield from docs


def bigram_backcopy_documents(n_docs, doc_len, vocab, triggers, alpha, seed):
    """Documents of the Bigram-Backcopy task (Guo et al., 2024, "Active-dormant attention heads"): a
    Markov chain over `vocab` tokens whose rows are Dirichlet(alpha) draws (fixed by seed), except that
    after one of the `triggers` trigger tokens the next token copies the token before the trigger. A
    head solving the copy has nothing to do at non-trigger positions, which is where attention sinks form
    in 1-3 layer models. Yields int64 arrays of doc_len tokens; the first token is never a trigger."""
    rng = np.random.default_rng(seed)
    trans = rng.dirichlet(np.full(vocab, alpha), size=vocab)
    cdf = np.cumsum(trans, axis=1)
    cdf[:, -1] = 1.0
    is_trigger = np.zeros(vocab, dtype=bool)
    is_trigger[rng.choice(vocab, size=triggers, replace=False)] = True
    starts = np.flatnonzero(~is_trigger)
    for _ in range(n_docs):
        doc = np.empty(doc_len, dtype=np.int64)
        doc[0] = rng.choice(starts)
        u = rng.random(doc_len)
        for t in range(1, doc_len):
            prev = doc[t - 1]
            doc[t] = doc[t - 2] if is_trigger[prev] and t >= 2 else min(np.searchsorted(cdf[prev], u[t]), vocab - 1)
        yield doc
