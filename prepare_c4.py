"""
Tokenise C4 `en` (or an offline stand-in corpus, or WikiText-2) into the flat token files that train.py reads.

    python prepare_c4.py                               # C4 en streamed from the hub, GPT-2 BPE -> data/c4
    python prepare_c4.py --train_tokens 5e9 --num_proc 16
    python prepare_c4.py --data_files /path/to/c4/en   # local c4-train.*.json.gz / c4-validation.*.json.gz
    python prepare_c4.py --source offline              # no network: stand-in corpus -> data/offline
    python prepare_c4.py --tokenizer bytes             # or --tokenizer my_vocab.tiktoken
    python prepare_c4.py --source offline --tokenizer hf:HuggingFaceTB/SmolLM2-135M   # a model's own tokenizer
    python prepare_c4.py --source offline --tokenizer hf:path/to/model.Q4_1.gguf      # ... or a GGUF file's
    python prepare_c4.py --source bigram_backcopy      # synthetic task of the CPU miniature -> data/bigram_backcopy
    python prepare_c4.py --source wikitext2            # WikiText-2 raw from the hub -> data/wikitext2 (val = test)
    python prepare_c4.py --source wikitext2 --wikitext_dir wikitext-2-raw   # the raw files, no network
    python -c "import prepare_c4; prepare_c4.load_meta('data/c4')"   # check a prepared folder

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
                        tokens == file size / itemsize; sha256 is of the .bin file; max_token_id is its
                        largest token id (train.py checks the file against it; older folders lack it).
                        tokenizer_info (Tokenizer.record) lets analyze.py / train.py check that data and
                        model share a tokenizer: "probe" = the ids of PROBE_TEXT, compared between the two.
A folder without meta.json is not prepared data: splits are written to SPLIT.bin.tmp and renamed
when complete, and meta.json is written last. Finished splits are recorded in .progress.json, so
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
eval_quant.py prepend one per document at measurement time (--bos). auto (default for --source offline) =
gpt2 if a local copy exists, else bytes; it never goes to the network.

Tokenisation runs on --num_proc worker processes (default: cores - 1) in chunks of documents;
the main process reads the source and writes in order.

The offline stand-in (--source offline) is NOT C4: pydoc topics plus docstrings of the standard
library and installed packages, read from source with `ast` (nothing is imported). It is
deterministic for a given Python installation and meant for smoke tests without network.

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
"""
import argparse
import ast
import base64
import glob
import hashlib
import inspect
import json
import multiprocessing
import os
import re
import shlex
import signal
import sys
import sysconfig
import tempfile
import time
from collections import deque
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

FORMAT = 1
SPLITS = ("train", "val")
CHUNK_DOCS = 512  # documents per tokenisation task
EOT_TEXT = "<|endoftext|>"
# tiktoken's GPT-2 (r50k) split pattern, used for PATH.tiktoken vocabularies
GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
GPT2_FILES = (  # what tiktoken.get_encoding("gpt2") fetches
    "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
    "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
)
# GPT-2's BPE ranks as a tiktoken file (tiktoken's r50k_base; the same ids as its "gpt2" encoding)
R50K_URL = "https://openaipublic.blob.core.windows.net/encodings/r50k_base.tiktoken"
R50K_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
C4_SHARD = re.compile(r"c4-(train|validation)\..*\.json(\.gz)?")
MIN_DOC_CHARS = 200  # offline corpus: shorter docstrings are mostly one-liners
VAL_PERCENT = 2  # offline corpus: sha1(text) % 100 < 2 -> val
# WikiText-2 (raw): the file and the Hugging Face split of each of our splits; val is the TEST split
WIKITEXT_SPLITS = {"train": ("wiki.train.raw", "train"), "val": ("wiki.test.raw", "test")}
WIKITEXT_TITLE = re.compile(r"= [^=](.*[^=])? =")  # an article's title line; sections are "= = ... = ="


class PrepareError(Exception):
    """A problem the user can fix; the CLI prints it as one line `error: ...` and exits 2."""


# ----------------------------------------------------------------------------- tokenizers

@dataclass
class Tokenizer:
    name: str  # meta.json "tokenizer"
    vocab_size: int  # ids it can write, the document separator included
    eot_token: int  # the document separator written after every document
    encode: Callable[[str], Iterable[int]]  # text -> ids, special-token text encoded as ordinary text
    sha256: str | None = None  # fingerprint of the vocabulary file (.tiktoken, GGUF, tokenizer.json)
    bos_token: int | None = None  # the tokenizer's beginning-of-text token, if it has one
    eos_token: int | None = None  # its end-of-text token, if it has one
    add_bos: bool = False  # whether the tokenizer itself starts every text with bos_token (Llama-2)
    eot_text: str | None = None  # the separator as text, if it is a token of the vocabulary
    decode: Callable[[list[int]], str] | None = None  # ids -> text (sample.py); None where it cannot

    @property
    def dtype(self):
        return np.uint16 if self.vocab_size <= 2**16 else np.uint32

    def record(self) -> dict:
        """meta.json "tokenizer_info": enough to tell later whether data and a model share a tokenizer."""
        probe = None if self.name == "bigram_backcopy" else [int(i) for i in self.encode(PROBE_TEXT)]
        return {"name": self.name, "vocab_size": self.vocab_size, "eot_token": self.eot_token,
                "eot_text": self.eot_text, "bos_token": self.bos_token, "eos_token": self.eos_token,
                "add_bos": self.add_bos, "sha256": self.sha256, "probe": probe}


# Encoded with every tokenizer into meta.json ("probe"): two tokenizers that give the same ids here are taken to
# be the same. Digits after spaces, digit runs, contractions, capitals, runs of spaces, tabs, newlines, non-ASCII
# letters, an emoji and special-token text are where tokenizers of the same vocabulary tend to differ.
PROBE_TEXT = ("The year 2024 saw 1,234,567 visitors (up 89%); pi is 3.14159, e is 2.71828...\n"
              "  Don't they'll We'VE  x=42  ab12cd  ã é ß 日本語 🙂\t<|endoftext|> <s></s> <|im_start|>\n\n  end")


def tiktoken_cache_dir() -> str:
    """The folder tiktoken caches downloads in: $TIKTOKEN_CACHE_DIR, else $DATA_GYM_CACHE_DIR, else <tmp>/data-gym-cache."""
    cache = os.environ.get("TIKTOKEN_CACHE_DIR", os.environ.get("DATA_GYM_CACHE_DIR"))
    return os.path.join(tempfile.gettempdir(), "data-gym-cache") if cache is None else cache


def gpt2_cached() -> bool:
    """True if tiktoken's cache holds the GPT-2 vocabulary (vocab.bpe + encoder.json), so loading it needs no network."""
    cache = tiktoken_cache_dir()
    return bool(cache) and all(
        os.path.exists(os.path.join(cache, hashlib.sha1(url.encode()).hexdigest())) for url in GPT2_FILES)


def gpt2_ranks_file() -> str | None:
    """A local copy of GPT-2's BPE ranks (tiktoken's r50k_base file, sha256 R50K_SHA256): $GPT2_TIKTOKEN, else
    tiktoken's cached download of r50k_base. None when there is none. A $GPT2_TIKTOKEN that is not that file
    is an error."""
    env = os.environ.get("GPT2_TIKTOKEN")
    if env:
        if not os.path.isfile(env):
            raise PrepareError(f"GPT2_TIKTOKEN={env}: no such file")
        sha = hashlib.sha256(Path(env).read_bytes()).hexdigest()
        if sha != R50K_SHA256:
            raise PrepareError(f"GPT2_TIKTOKEN={env} has sha256 {sha[:12]}..., not GPT-2's BPE ranks "
                               f"(r50k_base, {R50K_SHA256[:12]}...): point it at gpt2.tiktoken / r50k_base.tiktoken")
        return env
    cached = os.path.join(tiktoken_cache_dir(), hashlib.sha1(R50K_URL.encode()).hexdigest())
    if tiktoken_cache_dir() and os.path.isfile(cached) and hashlib.sha256(Path(cached).read_bytes()).hexdigest() == R50K_SHA256:
        return cached
    return None


def read_tiktoken_ranks(path: str) -> dict[bytes, int]:
    # parsed here rather than with tiktoken.load.load_tiktoken_bpe, which caches local files by path
    # name and would keep serving an old copy after the file is edited
    ranks = {}
    try:
        for line in Path(path).read_bytes().splitlines():
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token, validate=True)] = int(rank)
    except (OSError, ValueError) as e:
        raise PrepareError(f"--tokenizer {path}: not a tiktoken ranks file ({e})") from None
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise PrepareError(f"--tokenizer {path}: ranks must be 0..{len(ranks) - 1} without gaps or repeats")
    return ranks


def load_gpt2() -> Tokenizer:
    """GPT-2's tokenizer, the ids of tiktoken.get_encoding("gpt2"): from a local r50k_base ranks file (see
    gpt2_ranks_file), else tiktoken's cached vocab.bpe/encoder.json, else tiktoken's download."""
    import tiktoken
    path = gpt2_ranks_file()
    if path is not None:   # tiktoken's own definition of "gpt2" on the same ranks: eot 50256 after 50256 ranks
        ranks = read_tiktoken_ranks(path)
        enc = tiktoken.Encoding("gpt2", pat_str=GPT2_PAT, mergeable_ranks=ranks,
                                special_tokens={EOT_TEXT: len(ranks)}, explicit_n_vocab=len(ranks) + 1)
    else:
        try:
            enc = tiktoken.get_encoding("gpt2")
        except Exception as e:
            raise PrepareError(
                f"cannot load the GPT-2 vocabulary ({type(e).__name__}) and there is no local copy of its BPE ranks; "
                f"one ships in the openai-whisper source package: pip download --no-deps --no-binary :all: "
                f"openai-whisper==20250625 -d whisper_src && tar -xzf whisper_src/openai_whisper-20250625.tar.gz "
                f"-C whisper_src, then export GPT2_TIKTOKEN=$PWD/whisper_src/openai_whisper-20250625/whisper/assets/"
                f"gpt2.tiktoken (or put vocab.bpe and encoder.json in TIKTOKEN_CACHE_DIR, or pass --tokenizer bytes)") from None
    return Tokenizer("gpt2", enc.n_vocab, enc.eot_token, enc.encode_ordinary, R50K_SHA256 if path else None,
                     eos_token=enc.eot_token, eot_text=EOT_TEXT, decode=enc.decode)


def gguf_metadata(path: str) -> dict:
    """The scalar metadata of a GGUF file (strings, numbers, booleans; arrays and the reader's own GGUF.* header
    fields are skipped), read with the gguf package's GGUFReader (tensor data stays memory-mapped, unread).
    Raises ValueError for a file that is not GGUF."""
    import gguf
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:   # a wrong magic or version, a truncated header, an empty file
        raise ValueError(f"not a GGUF file ({type(e).__name__}: {e})") from None
    return {key: field.contents() for key, field in reader.fields.items()
            if not key.startswith("GGUF.") and field.types and field.types[0] != gguf.GGUFValueType.ARRAY}


# llama.cpp's pre-tokenizer types (GGUF "tokenizer.ggml.pre") that put every digit in its own piece before GPT-2's
# byte-level pattern. transformers' GGUF converter does not know them and keeps the byte-level pattern alone,
# so e.g. a space before a digit merges differently from the original tokenizer.
DIGIT_SPLIT_PRE = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b")


def transformers_tokenizer(spec: str):
    """The transformers tokenizer of a Hugging Face name or folder (local files only) or of a GGUF file (its embedded
    tokenizer, with the digit split of DIGIT_SPLIT_PRE restored). Raises PrepareError."""
    try:
        import transformers
    except ImportError:
        raise PrepareError(f"--tokenizer hf:{spec} needs transformers: pip install transformers") from None
    gguf = spec.endswith(".gguf")
    try:
        if gguf:
            if not os.path.isfile(spec):
                raise PrepareError(f"--tokenizer hf:{spec}: no such GGUF file")
            try:
                import gguf as _  # noqa: F401  (transformers reads the embedded tokenizer with it)
            except ImportError:
                raise PrepareError(f"--tokenizer hf:{spec}: reading a GGUF file's tokenizer needs the gguf package: "
                                   f"pip install gguf") from None
            path = os.path.abspath(spec)
            hf = transformers.AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
            pre = gguf_metadata(path).get("tokenizer.ggml.pre")
            if pre in DIGIT_SPLIT_PRE:
                from tokenizers import pre_tokenizers
                hf.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
                    pre_tokenizers.Digits(individual_digits=True),
                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
        else:
            hf = transformers.AutoTokenizer.from_pretrained(spec, local_files_only=True)
    except PrepareError:
        raise
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise PrepareError(f"--tokenizer hf:{spec}: no tokenizer for it on this machine ({type(e).__name__}: "
                           f"{first[:200]}); give a local folder with tokenizer files, a GGUF file, or a name in "
                           f"the Hugging Face cache (download once with network: python -c \"import transformers; "
                           f"transformers.AutoTokenizer.from_pretrained('{spec}')\")") from None
    return hf


def load_hf_tokenizer(spec: str) -> Tokenizer:
    """hf:NAME_OR_DIR or hf:FILE.gguf: a model's own tokenizer through transformers (local files only: the Hugging
    Face cache, a folder, or the tokenizer a GGUF file embeds). The document separator is <|endoftext|> if the
    vocabulary has it, else the tokenizer's EOS token, else a new id one past the vocabulary."""
    hf = transformers_tokenizer(spec)
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is not None:
        def encode(text):   # special-token text in a document is text, as with tiktoken's encode_ordinary
            backend.encode_special_tokens = True    # (transformers resets the flag on each of its own calls)
            return backend.encode(text, add_special_tokens=False).ids
        fingerprint = hashlib.sha256(backend.to_str().encode()).hexdigest()
    else:
        def encode(text):
            return hf.encode(text, add_special_tokens=False, split_special_tokens=True)
        fingerprint = None
    vocab = hf.get_vocab()
    size = max(len(hf), max(vocab.values()) + 1)
    eot, eot_text = (vocab[EOT_TEXT], EOT_TEXT) if EOT_TEXT in vocab else (hf.eos_token_id, hf.eos_token)
    if eot is None:
        eot, eot_text, size = size, None, size + 1
    with_specials = hf("a", add_special_tokens=True)["input_ids"]
    add_bos = hf.bos_token_id is not None and bool(with_specials) and with_specials[0] == hf.bos_token_id
    name = "hf:" + (os.path.abspath(spec) if os.path.exists(spec) else spec)
    return Tokenizer(name, size, eot, encode, fingerprint, hf.bos_token_id, hf.eos_token_id, add_bos, eot_text,
                     lambda ids: hf.decode([i for i in ids if i < len(hf)]))


def load_tokenizer(spec: str) -> Tokenizer:
    """spec: "gpt2", "bytes", "auto" (gpt2 if a local copy exists, else bytes), a path ending in .tiktoken, or
    hf:NAME_OR_DIR / hf:FILE.gguf (a model's own tokenizer)."""
    if spec == "auto":
        try:
            return load_tokenizer("gpt2" if gpt2_ranks_file() or gpt2_cached() else "bytes")
        except PrepareError as e:
            print(f"warning: {e}; using --tokenizer bytes", file=sys.stderr)
            return load_tokenizer("bytes")
    if spec == "bytes":
        return Tokenizer("bytes", 257, 256, lambda text: np.frombuffer(text.encode("utf-8"), np.uint8),
                         decode=lambda ids: b"".join(bytes([i]) if i < 256 else EOT_TEXT.encode() for i in ids)
                         .decode("utf-8", errors="replace"))
    if spec == "gpt2":
        return load_gpt2()
    if spec.startswith("hf:"):
        return load_hf_tokenizer(spec[3:])
    if spec.endswith(".tiktoken"):
        import tiktoken
        ranks = read_tiktoken_ranks(spec)
        enc = tiktoken.Encoding(Path(spec).stem, pat_str=GPT2_PAT, mergeable_ranks=ranks,
                                special_tokens={EOT_TEXT: len(ranks)})
        sha = hashlib.sha256(Path(spec).read_bytes()).hexdigest()
        return Tokenizer(str(Path(spec).resolve()), len(ranks) + 1, len(ranks), enc.encode_ordinary, sha,
                         eos_token=len(ranks), eot_text=EOT_TEXT, decode=enc.decode)
    raise PrepareError(f"--tokenizer {spec!r}: expected gpt2, bytes, hf:NAME_OR_DIR, hf:FILE.gguf or a path "
                       f"ending in .tiktoken")


def tokenizer_mismatch(data: dict | None, model: dict | None) -> str | None:
    """Why data tokenised as `data` (a meta.json "tokenizer_info") does not fit a model whose tokenizer record is
    `model`; None when it fits or cannot be told (a record missing, or one without probe ids)."""
    if not data or not model or data.get("probe") is None or model.get("probe") is None:
        return None
    if data["probe"] != model["probe"]:
        return f"it was tokenised with {data.get('name')}, whose ids differ from {model.get('name')}'s on a test sentence"
    return None


def encode_chunk(texts: list[str], tok: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
    """Encode documents, each followed by eot. Returns (tokens per document incl. eot, flat tokens)."""
    ids = [np.asarray(tok.encode(t), dtype=np.int64) for t in texts]
    for x in ids:
        if (x == tok.eot_token).any():   # the separator inside a document would split it in two
            raise PrepareError(f"tokenizer {tok.name} produced the document separator {tok.eot_token} inside a "
                               f"document; it cannot separate documents")
    lengths = np.array([len(x) + 1 for x in ids], dtype=np.int64)
    out = np.empty(int(lengths.sum()), dtype=tok.dtype)
    pos = 0
    for x in ids:
        out[pos:pos + len(x)] = x
        out[pos + len(x)] = tok.eot_token
        pos += len(x) + 1
    return lengths, out


_worker_tok = None


def _ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is handled by the main process, which stops the pool


def _init_worker(spec: str):
    global _worker_tok
    _ignore_sigint()
    _worker_tok = load_tokenizer(spec)


def _encode_in_worker(texts):
    return encode_chunk(texts, _worker_tok)


def batched(items: Iterable, n: int) -> Iterator[list]:
    it = iter(items)
    while batch := list(islice(it, n)):
        yield batch


def encode_stream(texts: Iterable[str], tok: Tokenizer, num_proc: int):
    """encode_chunk over chunks of CHUNK_DOCS documents, in order, on num_proc processes.
    At most 2 * num_proc chunks are in flight, so a streamed source is read only as fast as it is used."""
    chunks = batched(texts, CHUNK_DOCS)
    if num_proc <= 1:
        for chunk in chunks:
            yield encode_chunk(chunk, tok)
        return
    with multiprocessing.Pool(num_proc, initializer=_init_worker, initargs=(tok.name,)) as pool:
        pending = deque()
        for chunk in chunks:
            pending.append(pool.apply_async(_encode_in_worker, (chunk,)))
            if len(pending) >= 2 * num_proc:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


# ----------------------------------------------------------------------------- C4 documents

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
                                   "pass --data_files DIR with local C4 shards, or --source offline") from None
            raise PrepareError(f"cannot read {where} as C4 JSON lines ({msg}); the file is corrupt or not a C4 "
                               "shard: replace it and run the same command again") from None


# ----------------------------------------------------------------------------- WikiText-2 documents

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


# ----------------------------------------------------------------------------- offline stand-in corpus

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


def offline_documents(max_docs: int | None = None, num_proc: int = 1) -> list[str]:
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
    progress = Progress("offline corpus: reading docstrings", target_docs=len(files), unit="files")
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


def offline_splits(docs: list[str]) -> dict[str, list[str]]:
    """Deterministic split by content hash; each split is ordered by hash, which mixes the sources."""
    keyed = sorted((hashlib.sha1(d.encode("utf-8")).hexdigest(), d) for d in docs)
    return {"train": [d for h, d in keyed if int(h, 16) % 100 >= VAL_PERCENT],
            "val": [d for h, d in keyed if int(h, 16) % 100 < VAL_PERCENT]}


# ----------------------------------------------------------------------------- writing a split

def duration(seconds: float) -> str:
    s = int(max(seconds, 0))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{max(seconds, 0):.1f}s"


class Progress:
    """A status line on stderr every ~2 s: documents, tokens, tokens/s and an ETA."""

    def __init__(self, label, target_tokens=None, target_docs=None, unit="docs"):
        self.label, self.target_tokens, self.target_docs, self.unit = label, target_tokens, target_docs, unit
        self.t0 = self.last = time.time()
        self.docs = self.tokens = 0

    def update(self, docs, tokens):
        self.docs, self.tokens = docs, tokens
        if time.time() - self.last >= 2.0:
            self.last = time.time()
            print(f"{self.label}: {self.line()}", file=sys.stderr, flush=True)

    def line(self, eta=True):
        dt = max(time.time() - self.t0, 1e-9)
        text = f"{self.docs:,}" + (f"/{self.target_docs:,}" if self.target_docs else "") + f" {self.unit}"
        if self.tokens:
            text += f", {self.tokens:,} tokens, {self.tokens / dt:,.0f} tokens/s"
        else:
            text += f", {self.docs / dt:,.1f} {self.unit}/s"
        text += f", {duration(dt)}"
        if eta and self.target_tokens and self.tokens:
            text += f", ETA {duration((self.target_tokens - self.tokens) * dt / self.tokens)}"
        elif eta and self.target_docs and self.docs:
            text += f", ETA {duration((self.target_docs - self.docs) * dt / self.docs)}"
        return text

    def done(self, extra=""):
        print(f"{self.label}: done, {self.line(eta=False)}" + (f"; {extra}" if extra else ""), file=sys.stderr, flush=True)


def write_split(path: Path, texts: Iterable[str], tok: Tokenizer, num_proc: int,
                max_tokens: int | None = None, max_docs: int | None = None) -> dict:
    """Encode texts into path (via path.tmp, renamed when complete). Stops after max_docs documents or
    after the document that reaches max_tokens. Returns {"documents", "tokens", "sha256", "max_token_id"}."""
    tmp = path.with_name(path.name + ".tmp")
    progress = Progress(path.stem, max_tokens, max_docs or (len(texts) if isinstance(texts, list) else None))
    sha, docs, tokens, top = hashlib.sha256(), 0, 0, 0
    stream = encode_stream(texts, tok, num_proc)
    try:
        with open(tmp, "wb") as f:
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
        os.replace(tmp, path)
    except BaseException:
        stream.close()
        tmp.unlink(missing_ok=True)
        raise
    progress.done()
    if max_docs is not None and docs < max_docs:
        print(f"warning: {path.stem}: the source has only {docs:,} documents, fewer than the {max_docs:,} asked for; "
              f"{path.name} holds them all (meta.json records the count)", file=sys.stderr)
    if max_tokens is not None and tokens < max_tokens:
        print(f"warning: {path.stem}: the source has only {tokens:,} tokens, fewer than the {max_tokens:,} asked for; "
              f"{path.name} holds them all (meta.json records the count)", file=sys.stderr)
    return {"documents": docs, "tokens": tokens, "sha256": sha.hexdigest(), "max_token_id": top}


def file_sha256(path: Path) -> str:
    """sha256 of a file, read in chunks (a progress line every ~2 s on big files)."""
    sha, size, chunk = hashlib.sha256(), path.stat().st_size, 1 << 26
    progress = Progress(f"checking sha256 of {path}", target_docs=(size + chunk - 1) // chunk, unit="chunks")
    with open(path, "rb") as f:
        while block := f.read(chunk):
            sha.update(block)
            progress.update(progress.docs + 1, 0)
    return sha.hexdigest()


def write_json(path, obj, indent=2):
    """Write obj as JSON atomically: a temporary file beside path, then a rename."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=indent) + "\n")
    os.replace(tmp, path)


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def prepare_command(args: dict, out_dir) -> str | None:
    """The prepare_c4.py command line that writes out_dir with these recorded arguments (meta.json "args"),
    or None when they cannot come from the command line (e.g. a call from Python with other settings)."""
    source, cmd = args.get("source"), ["python", "prepare_c4.py"]
    if source == "c4":
        cmd += ["--data_files", *args["data_files"]] if args.get("data_files") else []
        cmd += ["--tokenizer", args["tokenizer"], "--train_tokens", str(args["train_tokens"]),
                "--val_docs", str(args["val_docs"])]
    elif source == "offline":
        cmd += ["--source", "offline", "--tokenizer", args["tokenizer"]]
        cmd += [x for k in ("max_docs", "train_tokens", "val_docs") if args.get(k) for x in (f"--{k}", str(args[k]))]
    elif source == "wikitext2":
        cmd += ["--source", "wikitext2"] + (["--wikitext_dir", args["wikitext_dir"]] if args.get("wikitext_dir") else [])
        cmd += ["--tokenizer", args["tokenizer"]]
        cmd += [x for k in ("train_tokens", "val_docs") if args.get(k) for x in (f"--{k}", str(args[k]))]
    elif source == "bigram_backcopy":   # the command line sets only val_docs; the rest must be the defaults
        defaults = inspect.signature(prepare_bigram_backcopy).parameters
        if any(args.get(k) != defaults[k].default for k in args if k not in ("source", "val_docs")):
            return None
        cmd += ["--source", "bigram_backcopy", "--val_docs", str(args["val_docs"])]
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
    hint = "run python prepare_c4.py (or python prepare_c4.py --source offline)"
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
            split_texts: Callable[[str], Iterable[str]], limits: dict, num_proc: int = 1, force: bool = False) -> Path:
    """Write both splits and meta.json into out_dir; finished work with the same args is kept.
    limits[split] = (max_tokens, max_docs)."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise PrepareError(f"--out_dir {out} is a file, not a folder; choose another --out_dir")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PrepareError(f"cannot create --out_dir {out} ({e.strerror}: {e.filename}); choose another --out_dir") from None
    args = json.loads(json.dumps(args))
    meta_path, progress_path = out / "meta.json", out / ".progress.json"
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
    if force or progress.get("args") != args:
        progress = {"args": args, "splits": {}}
    meta_path.unlink(missing_ok=True)  # from here on the folder is "not prepared" until meta.json is back
    write_json(progress_path, progress)

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
            "tokenizer_info": tok.record()}
    write_json(meta_path, meta)
    progress_path.unlink()
    return out


# ----------------------------------------------------------------------------- entry points

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


def prepare_offline(out_dir="data/offline", tokenizer="auto", max_docs=None, train_tokens=None, val_docs=None,
                    num_proc=1, force=False) -> Path:
    """The offline stand-in corpus. tokenizer "auto" = gpt2 if its vocabulary is cached, else bytes.
    max_docs keeps only the first max_docs documents of the corpus (for tests)."""
    tok = load_tokenizer(tokenizer)
    args = {"source": "offline", "tokenizer": tok.name, "tokenizer_sha256": tok.sha256, "max_docs": max_docs,
            "train_tokens": train_tokens, "val_docs": val_docs}
    version = ".".join(map(str, sys.version_info[:3]))
    source = f"offline stand-in corpus: pydoc topics + stdlib and site-packages docstrings (Python {version})"
    description = ("NOT C4. English prose from this Python installation, for runs without network: pydoc_data "
                   "topics and module/class/function docstrings of the standard library and installed packages "
                   f"(read with ast, nothing imported, test code skipped), >= {MIN_DOC_CHARS} characters, exact "
                   f"duplicates removed. sha1(text) % 100 < {VAL_PERCENT} goes to val, the rest to train; each "
                   "split is ordered by sha1. Deterministic for a given installation.")
    splits = {}

    def split_texts(split):
        if not splits:
            splits.update(offline_splits(offline_documents(max_docs, num_proc)))
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


def count(text: str) -> int:
    """argparse type: a positive count, written 100000, 100_000 or 1e5."""
    try:
        n = int(text) if re.fullmatch(r"[\d_]+", text) else int(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if n <= 0 or (not re.fullmatch(r"[\d_]+", text) and n != float(text)):
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return n


def main(argv=None):
    p = argparse.ArgumentParser(description="Tokenise C4 en (or an offline stand-in) for train.py.",
                                epilog="Output format: see the module docstring.")
    p.add_argument("--source", choices=("c4", "offline", "wikitext2", "bigram_backcopy"), default="c4",
                   help="c4: C4 en from the hub or --data_files (default); offline: stand-in corpus, no network; "
                        "wikitext2: WikiText-2 raw (val = its test split) from the hub or --wikitext_dir; "
                        "bigram_backcopy: the synthetic task of the CPU miniature")
    p.add_argument("--data_files", nargs="+", metavar="GLOB_OR_DIR",
                   help="local C4 shards (c4-train.*.json.gz, c4-validation.*.json.gz) instead of the hub")
    p.add_argument("--wikitext_dir", metavar="DIR",
                   help="--source wikitext2: a folder with wiki.train.raw and wiki.test.raw instead of the hub")
    p.add_argument("--tokenizer", help="gpt2 | bytes | auto | PATH.tiktoken | hf:NAME_OR_DIR | hf:FILE.gguf "
                   "(default gpt2; auto for offline)")
    p.add_argument("--train_tokens", type=count, help="train split size in tokens (default 100_000_000 for c4, "
                   "all for offline); stops after the document that reaches it")
    p.add_argument("--val_docs", type=count, help="val split size in documents (default 100000 for c4, all for offline)")
    p.add_argument("--max_docs", type=count, help="offline only: use the first N documents of the corpus")
    p.add_argument("--num_proc", type=count, default=max(1, (os.cpu_count() or 1) - 1),
                   help="tokenisation processes (default: all cores but the one reading the source)")
    p.add_argument("--out_dir", help="output folder (default data/<source>: data/c4, data/offline, data/wikitext2, ...)")
    p.add_argument("--force", action="store_true", help="overwrite a folder prepared with other arguments")
    a = p.parse_args(argv)
    if a.source == "offline" and a.data_files:
        p.error("--data_files reads C4 shards; it cannot be combined with --source offline")
    if a.source in ("c4", "wikitext2") and a.max_docs:
        p.error("--max_docs is for --source offline; use --train_tokens / --val_docs")
    if a.source == "wikitext2" and a.data_files:
        p.error("--data_files reads C4 shards; WikiText-2's raw files go in --wikitext_dir")
    if a.wikitext_dir and a.source != "wikitext2":
        p.error("--wikitext_dir is for --source wikitext2")
    t0 = time.time()
    try:
        if a.source == "bigram_backcopy":
            if a.data_files or a.wikitext_dir or a.tokenizer or a.max_docs or a.train_tokens:
                p.error("--source bigram_backcopy takes only --val_docs, --out_dir and --force")
            out = prepare_bigram_backcopy(a.out_dir or "data/bigram_backcopy", val_docs=a.val_docs or 500, force=a.force)
        elif a.source == "wikitext2":
            out = prepare_wikitext2(a.out_dir or "data/wikitext2", a.tokenizer or "gpt2", a.wikitext_dir,
                                    a.train_tokens, a.val_docs, a.num_proc, a.force)
        elif a.source == "offline":
            out = prepare_offline(a.out_dir or "data/offline", a.tokenizer or "auto", a.max_docs,
                                  a.train_tokens, a.val_docs, a.num_proc, a.force)
        else:
            out = prepare_c4(a.out_dir or "data/c4", a.tokenizer or "gpt2", a.data_files,
                             a.train_tokens or 100_000_000, a.val_docs or 100_000, a.num_proc, a.force)
    except PrepareError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)
    except KeyboardInterrupt:
        print("interrupted: finished splits are kept; run the same command again to resume", file=sys.stderr)
        raise SystemExit(130)
    meta = load_meta(out)
    sizes = ", ".join(f"{s} {meta['splits'][s]['documents']:,} docs / {meta['splits'][s]['tokens']:,} tokens"
                      for s in SPLITS)
    print(f"{out}: {meta['tokenizer']} ({meta['dtype']}), {sizes}; {time.time() - t0:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
