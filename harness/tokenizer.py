"""The tokenizers prepare_c4.py writes data with and the scripts check data against: gpt2 (GPT-2's BPE, read
offline from a local ranks file), bytes, PATH.tiktoken and hf:NAME_OR_DIR / hf:FILE.gguf (a model's own), each as
a Tokenizer whose record() goes into meta.json; and encode_stream, which encodes documents on worker processes.
prepare_c4.py's docstring says where each vocabulary is read from."""
import base64
import hashlib
import multiprocessing
import os
import signal
import tempfile
from collections import deque
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from harness.fileio import PrepareError, corpus_cache


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
        probe = None if self.name in SYNTHETIC else [int(i) for i in self.encode(PROBE_TEXT)]
        return {"name": self.name, "vocab_size": self.vocab_size, "eot_token": self.eot_token,
                "eot_text": self.eot_text, "bos_token": self.bos_token, "eos_token": self.eos_token,
                "add_bos": self.add_bos, "sha256": self.sha256, "probe": probe}


SYNTHETIC = ("bigram_backcopy", "bb_shakespeare")   # token ids of a generated task: no text to encode

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
    """A local copy of GPT-2's BPE ranks (tiktoken's r50k_base file, sha256 R50K_SHA256): $GPT2_TIKTOKEN, else the
    pinned copy that `python corpus.py fetch` extracts from the openai-whisper sdist (fileio.corpus_cache():
    $CORPUS_CACHE, else data/corpus_cache here or in the repository; /gpt2.tiktoken), else tiktoken's cached download
    of r50k_base. None when there is none.
    A $GPT2_TIKTOKEN that is not that file is an error."""
    env = os.environ.get("GPT2_TIKTOKEN")
    if env:
        if not os.path.isfile(env):
            raise PrepareError(f"GPT2_TIKTOKEN={env}: no such file")
        sha = hashlib.sha256(Path(env).read_bytes()).hexdigest()
        if sha != R50K_SHA256:
            raise PrepareError(f"GPT2_TIKTOKEN={env} has sha256 {sha[:12]}..., not GPT-2's BPE ranks "
                               f"(r50k_base, {R50K_SHA256[:12]}...): point it at gpt2.tiktoken / r50k_base.tiktoken")
        return env
    pinned = str(corpus_cache() / "gpt2.tiktoken")
    cached = os.path.join(tiktoken_cache_dir(), hashlib.sha1(R50K_URL.encode()).hexdigest())
    for path in (pinned, cached):
        if os.path.isfile(path) and hashlib.sha256(Path(path).read_bytes()).hexdigest() == R50K_SHA256:
            return path
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
                f"cannot load the GPT-2 vocabulary ({type(e).__name__}) and there is no local copy of its BPE ranks: "
                f"run `python corpus.py fetch`, which downloads the pinned openai-whisper 20250625 sdist (sha256-"
                f"checked) and extracts its gpt2.tiktoken into data/corpus_cache/; or pip download --no-deps "
                f"--no-binary :all: openai-whisper==20250625 -d whisper_src && tar -xzf whisper_src/openai_whisper-"
                f"20250625.tar.gz -C whisper_src, then export GPT2_TIKTOKEN=$PWD/whisper_src/openai_whisper-20250625/"
                f"whisper/assets/gpt2.tiktoken") from None
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
    name = "hf:" + (portable_path(spec) if os.path.exists(spec) else spec)
    return Tokenizer(name, size, eot, encode, fingerprint, hf.bos_token_id, hf.eos_token_id, add_bos, eot_text,
                     lambda ids: hf.decode([i for i in ids if i < len(hf)]))


def portable_path(path: str) -> str:
    """A tokenizer file's name as recorded in meta.json, checkpoints and JSON outputs: relative to the working
    directory (no absolute path in an output file; the sha256 or probe ids identify the vocabulary itself)."""
    return os.path.relpath(path)


def load_tokenizer(spec: str) -> Tokenizer:
    """spec: "gpt2" ("auto" is the same: it once fell back to bytes, so that one command gave two models),
    "bytes", a path ending in .tiktoken, or hf:NAME_OR_DIR / hf:FILE.gguf (a model's own tokenizer). A tokenizer
    that cannot be loaded is an error, never a silent change of tokenizer."""
    if spec == "auto":
        return load_gpt2()
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
        return Tokenizer(portable_path(spec), len(ranks) + 1, len(ranks), enc.encode_ordinary, sha,
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
