"""The on-disk dataset format (format 1, described in prepare_c4.py's docstring): writing a prepared folder
(prepare and its entry points prepare_c4 / prepare_installed_docstrings / prepare_wikitext2 /
prepare_bigram_backcopy; the pinned corpus's: pinned_corpus/prepare.py),
reading one (load_meta, iter_documents, eot_offsets), and resolve_dataset, the one rule that turns a dataset
argument into a folder.

    python -c "from harness import dataset; dataset.load_meta('data/c4')"   # check a prepared folder
"""
import hashlib
import inspect
import json
import os
import shlex
import sys
from itertools import islice
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from harness import provenance
from harness.fileio import (MARK, PrepareError, Progress, atomic_write, check_output, file_sha256, lock_folder,
                            read_json, release_lock, remove_temporaries, write_json, written_by)
from harness.sources import (MIN_DOC_CHARS, VAL_PERCENT, bigram_backcopy_documents, c4_texts, docstring_documents,
                             docstring_splits, find_c4_shards, wikitext_files, wikitext_texts)
from harness.tokenizer import Tokenizer, encode_stream, load_tokenizer


FORMAT = 1
SPLITS = ("train", "val")
# what a prepared folder holds: a command that reads it never writes over one of them (runs.read_paths)
DATA_FILES = ("meta.json", "train.bin", "val.bin", ".progress.json", ".verified.json")
# the defaults of Guo et al.'s Bigram-Backcopy task on Shakespeare (pinned_corpus/prepare.py's prepare_bb_shakespeare):
# prepare_c4.py's command line sets only val_docs, so a folder made with other settings has no command (prepare_command)
BB_SHAKESPEARE = {"doc_len": 256, "train_docs": 60_000, "val_docs": 500, "triggers": 3, "seed": 0}


def write_split(path: Path, texts: Iterable[str], tok: Tokenizer, num_proc: int,
                max_tokens: int | None = None, max_docs: int | None = None) -> dict:
    """Encode texts into path (via a new temporary file beside it, fileio.atomic_write, renamed when complete). Stops
    after max_docs documents or after the document that reaches max_tokens. Returns {"documents", "tokens",
    "sha256", "max_token_id"}."""
    progress = Progress(path.stem, max_tokens, max_docs or (len(texts) if isinstance(texts, list) else None))
    sha, docs, tokens, top = hashlib.sha256(), 0, 0, 0
    stream = encode_stream(texts, tok, num_proc)
    try:
        with atomic_write(path, "wb") as f:
            for lengths, ids in stream:
                keep = len(lengths)
                if max_docs is not None:
                    keep = min(keep, max_docs - docs)
                if max_tokens is not None:
                    keep = min(keep, int(np.searchsorted(np.cumsum(lengths), max_tokens - tokens)) + 1)
                kept = ids[:int(lengths[:keep].sum())]
                buf = kept.tobytes()
                top = max(top, int(kept.max())) if len(kept) else top
                f.write(buf)
                sha.update(buf)
                docs, tokens = docs + keep, tokens + len(buf) // ids.itemsize
                progress.update(docs, tokens)
                if (max_docs is not None and docs >= max_docs) or (max_tokens is not None and tokens >= max_tokens):
                    break
            stream.close()  # stop the workers and the source before the rename
            if docs == 0:
                raise PrepareError(f"{path.stem}: the source has no documents")
    except BaseException:
        stream.close()
        raise
    progress.done()
    if max_docs is not None and docs < max_docs:
        print(f"warning: {path.stem}: the source has only {docs:,} documents, fewer than the {max_docs:,} asked for; "
              f"{path.name} holds them all (meta.json records the count)", file=sys.stderr)
    if max_tokens is not None and tokens < max_tokens:
        print(f"warning: {path.stem}: the source has only {tokens:,} tokens, fewer than the {max_tokens:,} asked for; "
              f"{path.name} holds them all (meta.json records the count)", file=sys.stderr)
    return {"documents": docs, "tokens": tokens, "sha256": sha.hexdigest(), "max_token_id": top}


def prepare_command(args: dict, out_dir) -> str | None:
    """The prepare_c4.py command line that writes out_dir with these recorded arguments (meta.json "args"),
    or None when they cannot come from the command line (e.g. a call from Python with other settings)."""
    source, cmd = args.get("source"), ["python", "prepare_c4.py"]
    if source == "c4":
        cmd += ["--data_files", *args["data_files"]] if args.get("data_files") else []
        cmd += ["--tokenizer", args["tokenizer"], "--train_tokens", str(args["train_tokens"]),
                "--val_docs", str(args["val_docs"])]
    elif source in ("installed_docstrings", "offline"):   # "offline": its name before 2026-11-26
        cmd += ["--source", "installed_docstrings", "--tokenizer", args["tokenizer"]]
        cmd += [x for k in ("max_docs", "train_tokens", "val_docs") if args.get(k) for x in (f"--{k}", str(args[k]))]
    elif source == "pinned":   # the archive subset's file is not recorded (no paths): data/ARCHIVE_FILE is the default
        cmd += ["--source", "pinned", "--subset", args["subset"]]
        cmd += ["--tokenizer", args["tokenizer"]] if args.get("tokenizer", "gpt2") != "gpt2" else []
    elif source == "wikitext2":
        cmd += ["--source", "wikitext2"] + (["--wikitext_dir", args["wikitext_dir"]] if args.get("wikitext_dir") else [])
        cmd += ["--tokenizer", args["tokenizer"]]
        cmd += [x for k in ("train_tokens", "val_docs") if args.get(k) for x in (f"--{k}", str(args[k]))]
    elif source in ("bigram_backcopy", "bb_shakespeare"):   # the command line sets only val_docs; the rest: defaults
        defaults = (BB_SHAKESPEARE if source == "bb_shakespeare" else
                    {k: p.default for k, p in inspect.signature(prepare_bigram_backcopy).parameters.items()})
        if any(k not in defaults or args[k] != defaults[k] for k in args   # a key it does not know: no command
               if k not in ("source", "val_docs", "manifest_sha256")):
            return None
        cmd += ["--source", source, "--val_docs", str(args["val_docs"])]
    else:
        return None
    return shlex.join(cmd + ["--out_dir", str(out_dir)])


def prepare_again(d, args) -> str:
    """How to prepare folder d again: the recorded command, else a pointer to it."""
    command = prepare_command(args, d) if isinstance(args, dict) else None
    return (f"prepare it again: {command}" if command else
            f"prepare it again with the prepare_c4.py command that made it and --out_dir {d}")


def load_meta(data_dir) -> dict:
    """meta.json of a prepared folder, after checking the .bin files match it. Raises ValueError."""
    d = Path(data_dir)
    subset = d.name.removeprefix("pinned_")
    hint = (f"run python prepare_c4.py --source pinned --subset {subset}" if subset in ("cpu", "full", "archive") else
            "run python prepare_c4.py (or python prepare_c4.py --source pinned)")
    if not (d / "meta.json").is_file():
        progress = read_json(d / ".progress.json").get("args")
        if progress is not None:
            raise ValueError(f"{d} is not a prepared dataset yet (no meta.json: its preparation was interrupted); "
                             f"{prepare_again(d, progress)}")
        raise ValueError(f"{d} is not a prepared dataset (no meta.json): {hint} --out_dir {d}")
    try:
        meta = json.loads((d / "meta.json").read_text())
    except ValueError as e:
        raise ValueError(f"{d / 'meta.json'} is not valid JSON ({e}): {hint} --force --out_dir {d}") from None
    again = prepare_again(d, meta.get("args") if isinstance(meta, dict) else None)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{d / 'meta.json'}: unknown format {meta.get('format') if isinstance(meta, dict) else meta!r} "
                         f"(this code reads format {FORMAT}): {again} --force")
    if meta.get("dtype") not in ("uint16", "uint32"):
        raise ValueError(f"{d / 'meta.json'}: dtype {meta.get('dtype')!r} is not uint16 or uint32")
    itemsize = np.dtype(meta["dtype"]).itemsize
    for key in ("vocab_size", "eot_token"):
        if not isinstance(meta.get(key), int):
            raise ValueError(f"{d / 'meta.json'}: {key} missing or not an integer")
    if meta["dtype"] == "uint16" and meta["vocab_size"] > 2**16:
        raise ValueError(f"{d / 'meta.json'}: vocab_size {meta['vocab_size']} does not fit dtype uint16")
    for split in SPLITS:
        path = d / f"{split}.bin"
        tokens = ((meta.get("splits") or {}).get(split) or {}).get("tokens")
        if not isinstance(tokens, int):
            raise ValueError(f"{d / 'meta.json'}: no token count for the {split} split")
        if not path.is_file() or path.stat().st_size == 0:
            raise ValueError(f"{path} is missing or empty: {again}")
        size = path.stat().st_size
        if size % itemsize or size != tokens * itemsize:
            raise ValueError(f"{path} has {size} bytes but meta.json says {tokens} tokens of "
                             f"{meta['dtype']}: the file is truncated or stale, {again}")
    return meta


def eot_offsets(data, eot, chunk_tokens=1 << 22) -> Iterator[np.ndarray]:
    """Offsets of the eot tokens of a token array (e.g. a memmap), in order: one array per chunk read."""
    for lo in range(0, len(data), chunk_tokens):
        yield lo + np.flatnonzero(np.asarray(data[lo:lo + chunk_tokens]) == eot)


def iter_documents(data_dir, split="val", max_docs=None, chunk_tokens=1 << 22) -> Iterator[np.ndarray]:
    """Yield the documents of a prepared split in order, each as an int64 array of token ids without its
    end-of-text token. Streams the memmap in chunks: memory does not grow with the number of documents."""
    meta = load_meta(data_dir)
    data = np.memmap(Path(data_dir) / f"{split}.bin", dtype=meta["dtype"], mode="r")
    start, done = 0, 0
    for cuts in eot_offsets(data, meta["eot_token"], chunk_tokens):
        for cut in cuts:
            if max_docs is not None and done >= max_docs:
                return
            yield np.asarray(data[start:cut], dtype=np.int64)
            start, done = cut + 1, done + 1


def prepare(out_dir, tok: Tokenizer, args: dict, source: str, description: str, stand_in: bool,
            split_texts: Callable[[str], Iterable[str]], limits: dict, num_proc: int = 1, force: bool = False,
            extra: dict | None = None) -> Path:
    """Write both splits and meta.json into out_dir; finished work with the same args is kept.
    limits[split] = (max_tokens, max_docs); extra: more keys for meta.json (a synthetic task's triggers)."""
    try:   # a file, a path under a file, a name too long, a folder that cannot be written: one line, nothing made
        out = Path(check_output(str(out_dir), "--out_dir", folder=True, make=True))
    except ValueError as e:
        raise PrepareError(str(e)) from None
    other = written_by(out)   # fileio's rule: a folder another program marked is its output (train.py refuses it too)
    if other not in (None, "prepare_c4.py"):
        raise PrepareError(f"{out} is an output of {other} (its {MARK} says so): token files there would mix with "
                           f"its files (and train.py refuses such a folder); choose another --out_dir")
    try:   # one preparation per folder at a time: a second one would rename the first one's files away
        lock = lock_folder(out, wait=False)
    except BlockingIOError:
        raise PrepareError(f"{out} is being prepared by another process: wait for it to end, then run the same "
                           f"command again (or choose another --out_dir)") from None
    try:
        return prepare_locked(out, tok, args, source, description, stand_in, split_texts, limits, num_proc, force,
                              extra or {})
    finally:
        release_lock(lock)


def prepare_locked(out: Path, tok: Tokenizer, args: dict, source: str, description: str, stand_in: bool,
                   split_texts: Callable[[str], Iterable[str]], limits: dict, num_proc: int, force: bool,
                   extra: dict) -> Path:
    args = json.loads(json.dumps(args))
    meta_path, progress_path = out / "meta.json", out / ".progress.json"
    remove_temporaries(out, [*(f"{s}.bin" for s in SPLITS), meta_path.name, progress_path.name], "prepare_c4.py")
    old, progress = read_json(meta_path), read_json(progress_path)
    if not force and old.get("args") == args:
        try:
            load_meta(out)
            changed = [s for s in SPLITS if old["splits"][s].get("sha256")
                       and file_sha256(out / f"{s}.bin") != old["splits"][s]["sha256"]]
        except ValueError as e:
            print(f"{out}: {e}; preparing again", file=sys.stderr)
            old, progress = {}, {}
        else:
            if not changed:
                print(f"{out}: already prepared with these arguments", file=sys.stderr)
                return out
            print(f"{out}: the sha256 of {' and '.join(f'{s}.bin' for s in changed)} differs from meta.json's (changed "
                  f"after it was prepared); preparing it again", file=sys.stderr)
            progress = {"args": args, "splits": {s: old["splits"][s] for s in SPLITS if s not in changed}}
    if not force:
        for previous in (old.get("args"), progress.get("args") if progress.get("splits") else None):
            if previous is not None and previous != args:
                changed = ", ".join(f"{k}: {previous.get(k)!r} -> {args.get(k)!r}"
                                    for k in sorted(set(previous) | set(args)) if previous.get(k) != args.get(k))
                raise PrepareError(f"{out} holds data prepared with other arguments ({changed}); "
                                   "pass --force to overwrite it or choose another --out_dir")
    if not meta_path.exists() and not progress_path.exists():   # no record of a preparation: not ours to replace
        theirs = [n for n in ("train.bin", "val.bin") if (out / n).exists()]
        if theirs:
            raise PrepareError(f"{out} holds {' and '.join(theirs)} but no meta.json or .progress.json of a "
                               f"preparation (not written by prepare_c4.py): move them away or choose another --out_dir")
    if force or progress.get("args") != args:
        progress = {"args": args, "splits": {}}
    write_json(progress_path, progress)   # the record first: a run killed after it resumes, never finds files of no one
    meta_path.unlink(missing_ok=True)  # from here on the folder is "not prepared" until meta.json is back

    itemsize = np.dtype(tok.dtype).itemsize
    for split in ("val", "train"):  # val first: it is short and exercises the whole pipeline
        path, done = out / f"{split}.bin", progress["splits"].get(split)
        if done and path.is_file() and path.stat().st_size == done["tokens"] * itemsize:
            print(f"{split}: already written ({done['tokens']:,} tokens), skipping", file=sys.stderr)
            continue
        path.unlink(missing_ok=True)
        max_tokens, max_docs = limits[split]
        progress["splits"][split] = write_split(path, split_texts(split), tok, num_proc, max_tokens, max_docs)
        write_json(progress_path, progress)

    meta = {"format": FORMAT, "tokenizer": tok.name, "vocab_size": tok.vocab_size, "eot_token": tok.eot_token,
            "dtype": np.dtype(tok.dtype).name, "source": source, "stand_in_for_c4": stand_in,
            "description": description, "splits": {s: progress["splits"][s] for s in SPLITS}, "args": args,
            "tokenizer_info": tok.record(), **extra}
    meta["provenance"] = provenance.record(meta=meta)
    write_json(meta_path, meta)
    progress_path.unlink()
    return out


def prepare_c4(out_dir="data/c4", tokenizer="gpt2", data_files=None, train_tokens=100_000_000,
               val_docs=100_000, num_proc=1, force=False) -> Path:
    """C4 en: the first train_tokens tokens of train and val_docs documents of validation.
    data_files: local shard folders/globs/files, or None to stream from the hub."""
    if isinstance(data_files, (str, Path)):
        data_files = [data_files]
    data_files = [str(p) for p in data_files] if data_files else None
    shards = find_c4_shards(data_files) if data_files else None
    tok = load_tokenizer(tokenizer)
    args = {"source": "c4", "data_files": [os.path.abspath(p) for p in data_files] if data_files else None,
            "tokenizer": tok.name, "tokenizer_sha256": tok.sha256, "train_tokens": train_tokens, "val_docs": val_docs}
    if shards is None:
        source = "allenai/c4 en (hub, streamed)"
    else:
        folders = sorted({os.path.dirname(p) for s in shards.values() for p in s})
        source = (f"local shards: {len(shards['train'])} c4-train and {len(shards['val'])} c4-validation "
                  f"files in {', '.join(folders)}")
    description = (f"C4 en (Raffel et al., 2020). train: the train split in file order up to the document that "
                   f"reaches {train_tokens:,} tokens; val: the first {val_docs:,} documents of the validation "
                   f"split. Each document is followed by eot {tok.eot_token}.")
    return prepare(out_dir, tok, args, source, description, False,
                   lambda split: c4_texts(split, shards), {"train": (train_tokens, None), "val": (None, val_docs)},
                   num_proc, force)


def prepare_installed_docstrings(out_dir="data/installed_docstrings", tokenizer="auto", max_docs=None,
                                 train_tokens=None, val_docs=None, num_proc=1, force=False) -> Path:
    """The docstrings of this installation (its text, and so its numbers, change with the installed packages and
    the Python version: the pinned corpus is the one that is the same everywhere). tokenizer "auto" = gpt2.
    max_docs keeps only the first max_docs documents of the corpus (for tests)."""
    tok = load_tokenizer(tokenizer)
    args = {"source": "installed_docstrings", "tokenizer": tok.name, "tokenizer_sha256": tok.sha256,
            "max_docs": max_docs, "train_tokens": train_tokens, "val_docs": val_docs}
    version = ".".join(map(str, sys.version_info[:3]))
    source = (f"installed docstrings (depends on the installation): pydoc topics + stdlib and site-packages "
              f"docstrings (Python {version})")
    description = ("NOT C4. English prose from this Python installation, for runs without network: pydoc_data "
                   "topics and module/class/function docstrings of the standard library and installed packages "
                   f"(read with ast, nothing imported, test code skipped), >= {MIN_DOC_CHARS} characters, exact "
                   f"duplicates removed. sha1(text) % 100 < {VAL_PERCENT} goes to val, the rest to train; each "
                   "split is ordered by sha1. Deterministic for a given installation; another installation gives "
                   "other text.")
    splits = {}

    def split_texts(split):
        if not splits:
            splits.update(docstring_splits(docstring_documents(max_docs, num_proc)))
        return splits[split]

    return prepare(out_dir, tok, args, source, description, True, split_texts,
                   {"train": (train_tokens, None), "val": (None, val_docs)}, num_proc, force)


def prepare_wikitext2(out_dir="data/wikitext2", tokenizer="gpt2", wikitext_dir=None, train_tokens=None,
                      val_docs=None, num_proc=1, force=False) -> Path:
    """WikiText-2 (raw): train = wiki.train.raw, val = wiki.test.raw (the split its perplexity is reported on),
    one document per article. wikitext_dir: a folder with the raw files, or None for the Hugging Face hub."""
    if wikitext_dir is not None:
        wikitext_files(wikitext_dir)
    tok = load_tokenizer(tokenizer)
    args = {"source": "wikitext2", "wikitext_dir": os.path.abspath(wikitext_dir) if wikitext_dir else None,
            "tokenizer": tok.name, "tokenizer_sha256": tok.sha256, "train_tokens": train_tokens, "val_docs": val_docs}
    source = (f"WikiText-2 raw files in {os.path.abspath(wikitext_dir)}" if wikitext_dir else
              "Salesforce/wikitext wikitext-2-raw-v1 (hub)")
    description = ("WikiText-2, raw (Merity et al., 2016). train: wiki.train.raw; val: wiki.test.raw, the TEST split "
                   "(where WikiText-2 perplexity is reported; wiki.valid.raw is not used). One document per article "
                   "(a title line ' = Title = ' starts one); lines stripped, blank lines dropped, joined by newlines; "
                   "no detokenisation (' @-@ ' and the spaces around punctuation stay). Each document is followed "
                   f"by eot {tok.eot_token}.")
    return prepare(out_dir, tok, args, source, description, False, lambda split: wikitext_texts(split, wikitext_dir),
                   {"train": (train_tokens, None), "val": (None, val_docs)}, num_proc, force)


def prepare_bigram_backcopy(out_dir="data/bigram_backcopy", vocab=64, triggers=12, alpha=0.1, doc_len=256,
                            train_docs=40_000, val_docs=500, seed=0, force=False) -> Path:
    """The synthetic Bigram-Backcopy task as a prepared dataset (token ids 0..vocab-1, eot = vocab).
    train and val are disjoint draws of the same chain (one generator, val first)."""
    tok = Tokenizer("bigram_backcopy", vocab + 1, vocab, lambda ids: ids)
    args = {"source": "bigram_backcopy", "vocab": vocab, "triggers": triggers, "alpha": alpha, "doc_len": doc_len,
            "train_docs": train_docs, "val_docs": val_docs, "seed": seed}
    docs = bigram_backcopy_documents(val_docs + train_docs, doc_len, vocab, triggers, alpha, seed)
    description = (f"NOT C4. Synthetic Bigram-Backcopy task (Guo et al., 2024): {vocab} tokens, Dirichlet({alpha}) "
                   f"bigram rows, {triggers} trigger tokens after which the token before the trigger is copied; "
                   f"documents of {doc_len} tokens, seed {seed}.")
    return prepare(out_dir, tok, args, "bigram_backcopy", description, True,
                   lambda split: islice(docs, val_docs if split == "val" else train_docs),
                   {"train": (None, train_docs), "val": (None, val_docs)}, 1, force)


def resolve_dataset(dataset) -> str:
    """The folder a dataset argument names: a bare name such as 'c4' or 'pinned_cpu' is data/<name> (relative to the
    working directory, where train.py has always looked); anything with a path separator ('data/pinned_cpu',
    '/abs/path', './mine') is that path as given. A bare name that is no folder under data/ but is a folder here
    is that folder."""
    dataset = os.fspath(dataset)
    if os.path.isabs(dataset) or os.sep in dataset or (os.altsep and os.altsep in dataset):
        return dataset
    under_data = os.path.join('data', dataset)
    if not os.path.isdir(under_data) and os.path.isdir(dataset):
        return dataset
    return under_data
