"""The pinned corpus (pinned_corpus/build.py, pinned_corpus/text.py): archive readers, markup readers, cleaning, dedup and split on
small archives made here, checked against hand-written text; fetch and resume failures; and the CPU subset built from the real
artifacts (in $CORPUS_CACHE, which .ci/run fills) against the sha256s and token counts in pinned_corpus/manifest.json."""
import gzip
import hashlib
import io
import json
import lzma
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest

from pinned_corpus import build as pinned, text as corpus_text
from conftest import refused_writes
from pinned_corpus.build import CorpusError

pytestmark = pytest.mark.slow   # the pinned corpus, its real CPU subset among them


def tar_bytes(files: dict[str, bytes], mode="w:gz") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as t:
        for name, data in files.items():   # insertion order, not sorted: the reader must sort
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def ar_bytes(members: dict[str, bytes]) -> bytes:
    """An ar archive written from the format's definition (as dpkg-deb writes a .deb)."""
    out = b"!<arch>\n"
    for name, data in members.items():
        out += f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(data):<10}`\n".encode()
        out += data + (b"\n" if len(data) % 2 else b"")
    return out


def deb_bytes(files: dict[str, bytes], data_name="data.tar.xz") -> bytes:
    mode = "w:xz" if data_name.endswith(".xz") else "w"
    return ar_bytes({"debian-binary": b"2.0\n", "control.tar.xz": tar_bytes({"./control": b"Package: x\n"}, "w:xz"),
                     data_name: tar_bytes(files, mode)})


def source(tmp_path, sid, filename, data: bytes, include, fmt="text", **kw):
    (tmp_path / filename).write_bytes(data)
    return {"id": sid, "registry": "pypi", "name": sid, "version": "1", "filename": filename,
            "sha256": hashlib.sha256(data).hexdigest(), "subset": "cpu", "format": fmt, "include": include, **kw}


PROSE = ("The quick brown fox jumps over the lazy dog while the farmer watches from the porch of the old house. " * 3)


# ----------------------------------------------------------------------------- archives

def test_sdist_and_deb_members_come_in_sorted_order(tmp_path):
    files = {"pkg/b.txt": b"bee", "pkg/a.txt": b"ay", "pkg/sub/c.txt": "c\u00e9".encode()}
    (tmp_path / "x-1.tar.gz").write_bytes(tar_bytes(files))
    (tmp_path / "x_1_all.deb").write_bytes(deb_bytes({"./" + k: v for k, v in files.items()}))
    expected = sorted(files.items())
    assert list(pinned.archive_files(tmp_path / "x-1.tar.gz")) == expected
    assert list(pinned.archive_files(tmp_path / "x_1_all.deb")) == expected
    # an odd-sized member is padded in the ar archive; the next member must still be found
    assert pinned.ar_members(ar_bytes({"a": b"odd", "b": b"even"})) == {"a": b"odd", "b": b"even"}


def test_zstd_deb_and_truncated_archives_are_one_line_errors_naming_the_source(tmp_path):
    data = tar_bytes({"pkg/a.txt": PROSE.encode() * 50})
    src = source(tmp_path, "cut", "cut-1.tar.gz", data[:len(data) // 2], ["pkg/*.txt"])
    with pytest.raises(CorpusError, match=r"source cut: cut-1.tar.gz is truncated or corrupt .*fetch"):
        pinned.extract_source(src, tmp_path / "cut-1.tar.gz")
    src = source(tmp_path, "zst", "z_1_all.deb", deb_bytes({"./a.txt": b"x"}, "data.tar.zst"), ["*"])
    with pytest.raises(CorpusError, match=r"source zst: .*zstandard"):
        pinned.extract_source(src, tmp_path / "z_1_all.deb")


def test_documents_of_a_two_source_corpus(tmp_path):
    a = source(tmp_path, "a", "a-1.tar.gz", tar_bytes({"a-1/z.rst": f"Z\n=\n\n{PROSE}".encode(),
                                                     "a-1/y.rst": f"Y\n\n{PROSE}\n\nmore words".encode(),
                                                     "a-1/skip.py": PROSE.encode()}), ["a-1/*.rst"], "rst")
    b = source(tmp_path, "b", "b_1_all.deb", deb_bytes({"./usr/share/doc/b/x.html": f"<p>{PROSE}</p>".encode()}),
               ["usr/share/doc/*.html"], "html", registry="debian")
    docs = pinned.documents(sources=[a, b], cache=tmp_path, manifest={"sources": [a, b]}, count=len)
    # y.rst before z.rst (sorted); z.rst keeps "Z" and drops PROSE as a repeat; b's page is a copy of PROSE; y.rst
    # is its source's one unit, and half of it is more than 4% of the source: train
    y = f"Y\n\n{PROSE.strip()}\n\nmore words"
    assert docs == [("a:a-1/y.rst", "train", y)]


def prose(seed: int, words: int = 60) -> str:
    """A sentence of distinct made-up words (letters only) that no other seed's shares."""
    return " ".join("".join(chr(97 + b % 26) for b in hashlib.sha256(f"{seed}-{k}".encode()).digest()[:6])
                    for k in range(words)) + "."


def two_sources(tmp_path):
    texts = {f"a-1/{i:02d}.txt": f"Text {chr(65 + i)}. {prose(i)}" for i in range(30)}   # one of them goes to val
    a = source(tmp_path, "a", "a-1.tar.gz", tar_bytes({k: v.encode() for k, v in texts.items()}), ["a-1/*"])
    b = source(tmp_path, "b", "b-1.tar.gz", tar_bytes({"b/x.txt": prose(99, 200).encode()}), ["b/*"], subset="full")
    return {"sources": [a, b]}


def test_a_two_source_corpus_is_split_by_file_and_val_comes_last(tmp_path):
    manifest = two_sources(tmp_path)
    docs = pinned.documents("full", tmp_path, manifest, count=len)
    val = [d for d in docs if d[1] == "val"]
    # a: 30 files of ~430 characters, 4% of them is 516: one file (the first by sha256 of its unit name); b: one file
    first = min((f"a:a-1/{i:02d}.txt" for i in range(30)), key=lambda u: hashlib.sha256(u.encode()).digest())
    assert [d[0] for d in val] == [first] and docs[-1] == val[0] and len(docs) == 31


def test_the_archive_is_checked_by_its_content_and_names_the_first_document_that_differs(tmp_path, monkeypatch):
    manifest = two_sources(tmp_path)
    full = pinned.documents("full", tmp_path, manifest, count=len)
    train_by_hash = sorted((d for d in full if d[1] == "train"), key=lambda d: hashlib.sha256(d[2].encode()).digest())
    val = [d for d in full if d[1] == "val"]
    monkeypatch.setattr(pinned, "ARCHIVE_CHARS", sum(len(d[2]) for d in val + train_by_hash[:5]))
    docs = pinned.archive_documents(full)
    assert docs == val + train_by_hash[:5]   # all of val, then train by hash up to the cap
    path = tmp_path / "c.jsonl.xz"
    info = pinned.write_archive(path, docs)
    lines = b"".join(json.dumps({"id": i, "split": s, "text": t}, ensure_ascii=False).encode() + b"\n" for i, s, t in docs)
    assert lzma.decompress(path.read_bytes()) == lines
    assert info["content"]["sha256"] == hashlib.sha256(lines).hexdigest() and info["content"]["documents"] == 6
    manifest["archive"] = info
    assert pinned.documents("archive", manifest=manifest, archive=path) == docs
    # another compression of the same lines (preset 1, CRC32 check; xz -T2 where xz is installed) is accepted
    (tmp_path / "other.jsonl.xz").write_bytes(lzma.compress(lines, preset=1, check=lzma.CHECK_CRC32))
    assert pinned.documents("archive", manifest=manifest, archive=tmp_path / "other.jsonl.xz") == docs
    if shutil.which("xz"):
        with open(tmp_path / "t2.jsonl.xz", "wb") as f:
            subprocess.run(["xz", "-T2", "-c"], input=lines, stdout=f, check=True)
        assert pinned.documents("archive", manifest=manifest, archive=tmp_path / "t2.jsonl.xz") == docs
    # one edited document: refused in one line naming it (the third), with what to do
    edited = lines.replace(docs[2][2].encode(), docs[2][2].replace("Text", "Test").encode())
    (tmp_path / "e.jsonl.xz").write_bytes(lzma.compress(edited))
    with pytest.raises(CorpusError, match=rf"^corpus archive e.jsonl.xz is not the archive pinned_corpus/manifest.json pins: "
                                          rf"document 3 \({re.escape(docs[2][0])}\) differs .*copy the pinned file again"):
        pinned.documents("archive", manifest=manifest, archive=tmp_path / "e.jsonl.xz")
    (tmp_path / "short.jsonl.xz").write_bytes(lzma.compress(lines[:lines.rindex(b"{")]))
    with pytest.raises(CorpusError, match=r"it holds 5 documents, the pinned archive 6"):
        pinned.documents("archive", manifest=manifest, archive=tmp_path / "short.jsonl.xz")
    data = path.read_bytes()
    (tmp_path / "cut.jsonl.xz").write_bytes(data[:len(data) // 2])
    with pytest.raises(CorpusError, match=r"^corpus archive cut.jsonl.xz is truncated or corrupt .*copy it again"):
        pinned.documents("archive", manifest=manifest, archive=tmp_path / "cut.jsonl.xz")
    with pytest.raises(CorpusError, match=r"c.jsonl.xz exists: pass another --out"):
        pinned.write_archive(path, docs)

    def failing():   # an error while writing (here: the documents run out) leaves no temporary file
        yield docs[0]
        raise CorpusError("source b: gone")
    with pytest.raises(CorpusError, match="gone"):
        pinned.write_archive(tmp_path / "new" / "n.jsonl.xz", failing())
    assert list((tmp_path / "new").iterdir()) == []


def test_the_archive_command_never_edits_the_manifest_and_record_says_what_changed(tmp_path, monkeypatch, capsys):
    import corpus
    manifest = two_sources(tmp_path)
    written = []
    monkeypatch.setattr(pinned, "load_manifest", lambda path=None: json.loads(json.dumps(manifest)))
    monkeypatch.setattr(pinned, "write_manifest", lambda m, path=None: written.append(m))
    monkeypatch.setattr(pinned, "gpt2_count", lambda cache, manifest: len)
    corpus.main(["archive", "--out", str(tmp_path / "a.jsonl.xz"), "--cache", str(tmp_path)])
    out = capsys.readouterr().out
    assert written == [] and "it is not the archive pinned_corpus/manifest.json pins (nothing is pinned)" in out
    assert f"to pin this one, run python corpus.py record --subset archive --archive {tmp_path / 'a.jsonl.xz'}" in out
    monkeypatch.setattr(corpus, "gpt2", lambda: (lambda t: [ord(c) % 50000 for c in t], 50256))
    corpus.main(["record", "--subset", "archive", "--archive", str(tmp_path / "a.jsonl.xz")])
    out = capsys.readouterr().out
    assert len(written) == 1 and written[0]["archive"]["content"]["documents"] == 31
    assert "pinned_corpus/manifest.json: a new entry; archive content: 0 -> 31 documents" in out


def test_a_source_whose_text_changed_is_named_before_tokenising(tmp_path):
    manifest = two_sources(tmp_path)
    docs = pinned.documents("full", tmp_path, manifest, count=len)
    hashes = {sid: {split: hashlib.sha256(b"".join(t.encode() + b"\0" for i, s, t in docs
                                                  if i.startswith(sid + ":") and s == split)).hexdigest()
                    for split in ("train", "val")} for sid in ("a", "b")}
    manifest["subsets"] = {"full": {"sources": {sid: {split: {"text_sha256": h} for split, h in v.items()}
                                                for sid, v in hashes.items()}}}
    pinned.check_texts(docs, "full", manifest)
    changed = [(i, s, t + "!" if i.startswith("b:") else t) for i, s, t in docs]
    with pytest.raises(CorpusError, match=r"^source b \(b 1\) gives other (train|val) text than the manifest records"):
        pinned.check_texts(changed, "full", manifest)


# ----------------------------------------------------------------------------- fetch, resume

def test_fetch_downloads_checks_and_keeps_nothing_half_written(tmp_path, monkeypatch):
    remote = tmp_path / "remote"
    remote.mkdir()
    data = tar_bytes({"p/a.txt": PROSE.encode()})
    (remote / "p-1.tar.gz").write_bytes(data)
    src = {"id": "p", "filename": "p-1.tar.gz", "sha256": hashlib.sha256(data).hexdigest()}
    monkeypatch.setattr(pinned, "artifact_url", lambda s: (remote / s["filename"]).as_uri())
    cache = tmp_path / "cache"
    assert pinned.fetch(src, cache).read_bytes() == data
    assert sorted(os.listdir(cache)) == ["p-1.tar.gz"]


def test_a_sha256_that_disagrees_with_the_registry_names_the_manifest_or_the_cached_copy(tmp_path, monkeypatch):
    remote, cache = tmp_path / "remote", tmp_path / "cache"
    remote.mkdir()
    cache.mkdir()
    data = tar_bytes({"p/a.txt": PROSE.encode()})
    (remote / "p-1.tar.gz").write_bytes(data)
    real, edited = hashlib.sha256(data).hexdigest(), "e" * 64
    src = {"id": "p", "filename": "p-1.tar.gz", "sha256": real}
    monkeypatch.setattr(pinned, "artifact_url", lambda s: (remote / s["filename"]).as_uri())
    # the manifest's sha256 edited by hand, nothing cached: the download is refused, the manifest named with both
    # sha256s, nothing kept
    with pytest.raises(CorpusError) as e:
        pinned.fetch(dict(src, sha256=edited), cache)
    assert str(e.value) == (f"source p: pinned_corpus/manifest.json is wrong: it pins sha256 {edited} for p-1.tar.gz, the "
                            f"registry's file has {real} (downloaded, checked, not kept): restore the manifest's entry "
                            f"(git diff pinned_corpus/manifest.json shows an edit)")
    assert os.listdir(cache) == []
    # ... and with the registry's file cached (before: "move that file away", after which the download failed
    # too): the manifest is named, the cached file kept
    (cache / "p-1.tar.gz").write_bytes(data)
    with pytest.raises(CorpusError) as e:
        pinned.fetch(dict(src, sha256=edited), cache)
    assert str(e.value) == (f"source p: pinned_corpus/manifest.json is wrong: it pins sha256 {edited} for p-1.tar.gz, the "
                            f"registry's file and the cached copy {cache / 'p-1.tar.gz'} both have {real}: restore "
                            f"the manifest's entry (git diff pinned_corpus/manifest.json shows an edit); the cached file is "
                            f"the registry's, keep it")
    # a cached copy that is not the registry's file, which the manifest pins: the copy is named, and left in place
    other = hashlib.sha256(b"other").hexdigest()
    (cache / "p-1.tar.gz").write_bytes(b"other")
    with pytest.raises(CorpusError) as e:
        pinned.fetch(src, cache)
    assert str(e.value) == (f"source p: the cached copy is wrong: {cache / 'p-1.tar.gz'} has sha256 {other[:16]}..., "
                            f"the registry's p-1.tar.gz has the pinned {real[:16]}...: move the cached file away (it is "
                            f"left as it is) and run `python corpus.py fetch`")
    # neither: all three named
    with pytest.raises(CorpusError) as e:
        pinned.fetch(dict(src, sha256=edited), cache)
    assert str(e.value).startswith(f"source p: the manifest and the cached copy both disagree with the registry: it "
                                   f"pins sha256 {edited}, {cache / 'p-1.tar.gz'} has {other}, the registry's "
                                   f"p-1.tar.gz has {real}: ")
    # the registry unreachable: which one is wrong cannot be told, and the line says so
    monkeypatch.setattr(pinned, "artifact_url", lambda s: "http://127.0.0.1:9/p-1.tar.gz")
    with pytest.raises(CorpusError, match=r"^source p: the cached .*p-1.tar.gz has sha256 .*, the manifest pins .*, "
                                          r"and the registry's file could not be fetched to tell which is wrong"):
        pinned.fetch(src, cache)
    assert (cache / "p-1.tar.gz").read_bytes() == b"other" and os.listdir(cache) == ["p-1.tar.gz"]


def test_unreachable_registry_is_one_line_naming_the_source(tmp_path, monkeypatch):
    monkeypatch.setattr(pinned, "PYPI_JSON", "http://127.0.0.1:9/pypi/{name}/json")
    src = {"id": "django-docs", "registry": "pypi", "name": "django", "version": "1", "filename": "d-1.tar.gz",
           "sha256": "0" * 64}
    with pytest.raises(CorpusError, match=r"^source django-docs: cannot download d-1.tar.gz .*check the network, or "
                                          r"put the file"):
        pinned.fetch(src, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_full_disk_while_caching_an_extraction_is_one_line(tmp_path, monkeypatch):
    src = source(tmp_path, "a", "a-1.tar.gz", tar_bytes({"a/x.txt": PROSE.encode()}), ["a/*"])
    refused_writes(pinned, monkeypatch, OSError(28, "No space left on device"))
    with pytest.raises(CorpusError, match=r"^source a: cannot write .* \(No space left on device\): free disk space"):
        pinned.extracted(src, tmp_path)
    assert sorted(p.name for p in (tmp_path / "extracted").iterdir()) == []   # no partial file


def test_a_killed_run_resumes_without_redoing_finished_sources(tmp_path, monkeypatch):
    a = source(tmp_path, "a", "a-1.tar.gz", tar_bytes({"a/x.txt": PROSE.encode()}), ["a/*"])
    b = source(tmp_path, "b", "b-1.tar.gz", tar_bytes({"b/x.txt": ("Other words entirely. " * 20).encode()}), ["b/*"])
    calls, real = [], pinned.extract_source

    def counting(src, path):
        calls.append(src["id"])
        if src["id"] == "b" and calls.count("b") == 1:
            raise KeyboardInterrupt   # killed while extracting b
        return real(src, path)
    monkeypatch.setattr(pinned, "extract_source", counting)
    with pytest.raises(KeyboardInterrupt):
        list(pinned.documents(sources=[a, b], cache=tmp_path, manifest={}))
    assert sorted(p.name for p in (tmp_path / "extracted").iterdir()) == ["a.jsonl"]
    # a half-written file of b from some earlier crash is not taken for an extraction
    (tmp_path / "extracted" / "b.jsonl.tmp").write_text("{")
    docs = list(pinned.documents(sources=[a, b], cache=tmp_path, manifest={}))
    assert calls == ["a", "b", "b"] and [d[0] for d in docs] == ["a:a/x.txt", "b:b/x.txt"]
    # a changed extractor version redoes the extraction
    monkeypatch.setattr(pinned, "EXTRACT_VERSION", pinned.EXTRACT_VERSION + 1)
    assert list(pinned.documents(sources=[a, b], cache=tmp_path, manifest={})) == docs
    assert calls == ["a", "b", "b", "a", "b"]


# ----------------------------------------------------------------------------- the real CPU subset

def cpu_cache() -> Path | None:
    """The folder holding the CPU subset's artifacts: $CORPUS_CACHE (.ci/run fills it), else data/corpus_cache."""
    manifest = pinned.load_manifest()
    cache = pinned.default_cache()
    if not cache.is_absolute():
        cache = Path(pinned.__file__).parent.parent / cache
    have = all((cache / s["filename"]).exists() for s in pinned.subset_sources(manifest, "cpu"))
    if not have and os.environ.get("CI"):
        pytest.fail(f"CI must provide the CPU subset's artifacts in $CORPUS_CACHE ({cache}): see .ci/run")
    return cache if have else None


def test_cpu_subset_matches_the_manifest(tmp_path):
    cache = cpu_cache()
    if cache is None:
        pytest.skip("the CPU subset's artifacts are not downloaded: python corpus.py fetch --subset cpu")
    from harness.tokenizer import load_tokenizer
    tok = load_tokenizer("gpt2")
    manifest = pinned.load_manifest()
    docs = pinned.documents("cpu", cache, manifest, work=tmp_path)   # extracted afresh
    stats = pinned.measure(docs, [s["id"] for s in pinned.subset_sources(manifest, "cpu")], tok.encode,
                                  tok.eot_token)
    assert stats == manifest["subsets"]["cpu"]


def test_gpt2_ranks_come_from_the_pinned_sdist_member(tmp_path):
    ranks = b"IQ== 0\n"
    sdist = tar_bytes({"w-1/whisper/assets/gpt2.tiktoken": ranks, "w-1/setup.py": b""})
    (tmp_path / "w-1.tar.gz").write_bytes(sdist)
    tok = {"id": "gpt2-tokenizer", "filename": "w-1.tar.gz", "sha256": hashlib.sha256(sdist).hexdigest(),
           "member": "w-1/whisper/assets/gpt2.tiktoken", "member_sha256": hashlib.sha256(ranks).hexdigest()}
    assert pinned.gpt2_ranks(tmp_path, {"tokenizer": tok}).read_bytes() == ranks
    (tmp_path / "gpt2.tiktoken").unlink()
    with pytest.raises(CorpusError, match=r"^source gpt2-tokenizer: w-1.tar.gz does not hold w-1/whisper/assets/gpt2"):
        pinned.gpt2_ranks(tmp_path, {"tokenizer": dict(tok, member_sha256="0" * 64)})
    assert not (tmp_path / "gpt2.tiktoken").exists()


def test_prepare_pinned_writes_the_manifests_token_files_and_names_a_changed_source(tmp_path, monkeypatch, capsys,
                                                                                    gpt2_ranks):
    from harness import dataset
    import prepare_c4
    from harness.tokenizer import load_tokenizer
    manifest = two_sources(tmp_path)
    tok = load_tokenizer("gpt2")
    docs = pinned.documents("full", tmp_path, manifest)
    manifest["subsets"] = {"full": pinned.measure(docs, ["a", "b"], tok.encode, tok.eot_token)}
    monkeypatch.setattr(pinned, "load_manifest", lambda path=None: manifest)
    monkeypatch.setenv("CORPUS_CACHE", str(tmp_path))
    prepare_c4.main(["--source", "pinned", "--subset", "full", "--out_dir", str(tmp_path / "out"), "--num_proc", "1"])
    meta = dataset.load_meta(tmp_path / "out")
    assert {s: (v["sha256"], v["tokens"]) for s, v in meta["splits"].items()} == \
        {s: (v["sha256"], v["tokens"]) for s, v in manifest["subsets"]["full"]["splits"].items()}
    assert meta["args"]["manifest_sha256"] == pinned.manifest_sha256() and str(tmp_path) not in json.dumps(meta)
    # another tokenizer (a public model's): the same texts, checked against the manifest, in its ids
    prepare_c4.main(["--source", "pinned", "--subset", "full", "--tokenizer", "bytes", "--out_dir", str(tmp_path / "b")])
    bmeta = dataset.load_meta(tmp_path / "b")
    assert bmeta["args"]["tokenizer"] == "bytes" and bmeta["splits"]["train"]["sha256"] != meta["splits"]["train"]["sha256"]
    for split in ("train", "val"):
        ids = np.fromfile(tmp_path / "out" / f"{split}.bin", dtype=np.uint16)
        byte_ids = np.fromfile(tmp_path / "b" / f"{split}.bin", dtype=np.uint16)
        gpt2_docs = [tok.decode(d.tolist()) for d in np.split(ids, np.flatnonzero(ids == tok.eot_token) + 1)[:-1]]
        byte_docs = [bytes(d[:-1].astype(np.uint8)).decode() for d in np.split(byte_ids, np.flatnonzero(byte_ids == 256) + 1)[:-1]]
        assert byte_docs == [d[:-len("<|endoftext|>")] for d in gpt2_docs] and byte_docs
    manifest["subsets"]["full"]["sources"]["b"]["train"]["text_sha256"] = "0" * 64
    capsys.readouterr()
    with pytest.raises(SystemExit):
        prepare_c4.main(["--source", "pinned", "--subset", "full", "--out_dir", str(tmp_path / "out2")])
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [err[0]] and err[0].startswith("error: source b (b 1) gives other train text than the manifest")
    assert not (tmp_path / "out2" / "meta.json").exists()


def test_pinned_arguments_that_do_not_fit_are_one_line_errors(tmp_path, capsys):
    import prepare_c4
    for argv, expected in ((["--source", "installed_docstrings", "--subset", "cpu"], "--subset and --corpus_archive are for --source pinned"),
                           (["--source", "pinned", "--max_docs", "5"], "--source pinned takes only --subset"),
                           (["--source", "offline"], "--source offline is now called --source installed_docstrings"),
                           (["--source", "pinned", "--corpus_archive", str(tmp_path / "a.jsonl.xz")],
                            "--corpus_archive holds the archive subset: pass --subset archive")):
        with pytest.raises(SystemExit) as e:
            prepare_c4.main(argv + ["--out_dir", str(tmp_path / "o")])
        err = capsys.readouterr().err
        assert e.value.code == 2 and expected in err.strip().splitlines()[-1]
    with pytest.raises(SystemExit):   # another vocabulary must not land in data/pinned_cpu, GPT-2's folder
        prepare_c4.main(["--source", "pinned", "--tokenizer", "bytes"])
    assert "pass --out_dir too (the default data/pinned_cpu holds GPT-2 ids)" in capsys.readouterr().err
    from harness import dataset   # a missing pinned folder names the command that makes it (the main job's first error)
    with pytest.raises(ValueError, match=r"run python prepare_c4.py --source pinned --subset cpu --out_dir .*pinned_cpu$"):
        dataset.load_meta(tmp_path / "data" / "pinned_cpu")
    assert not (tmp_path / "o").exists()


def test_the_main_job_on_two_cpu_threads_trains_the_same_weights_twice(tmp_path):
    """Two processes of the main job's config on the CPU subset's bytes, two threads each: the same weights bit for bit
    after 3 steps. Without torch's deterministic algorithms (train.py turns them on for the CPU) the tied
    embedding's gradient differed in its last bits between runs, and the main job's val ppl in its 2nd decimal."""
    import subprocess
    import sys

    import torch
    cache = cpu_cache()
    if cache is None:
        pytest.skip("the CPU subset's artifacts are not downloaded: python corpus.py fetch --subset cpu")
    root = Path(pinned.__file__).parent.parent
    env = dict(os.environ, OMP_NUM_THREADS="2", CORPUS_CACHE=str(cache))
    run = lambda *a: subprocess.run([sys.executable, *a], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    r = run("prepare_c4.py", "--source", "pinned", "--tokenizer", "bytes", "--out_dir", str(tmp_path / "data"),
            "--num_proc", "1")
    assert r.returncode == 0, r.stderr[-2000:]
    weights = []
    for name in "ab":
        r = run("train.py", "config/main.py", f"--dataset={tmp_path / 'data'}", f"--out_dir={tmp_path / name}",
                "--max_iters=3", "--eval_interval=100", "--eval_tokens=4096", "--probe_docs=0", "--probe_interval=0",
                "--log_interval=1",
                "--compile=False")
        assert r.returncode == 0, r.stderr[-2000:]
        weights.append(torch.load(tmp_path / name / "ckpt.pt", map_location="cpu", weights_only=False)["model"])
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_find_archive_prefers_data_then_the_folder_itself(tmp_path):
    assert pinned.find_archive(tmp_path) is None
    (tmp_path / "corpus-archive.jsonl.xz").write_bytes(b"x")
    assert pinned.find_archive(tmp_path) == str(tmp_path / "corpus-archive.jsonl.xz")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "corpus-archive.jsonl.xz").write_bytes(b"y")
    assert pinned.find_archive(tmp_path) == str(tmp_path / "data" / "corpus-archive.jsonl.xz")


def test_the_markdown_table_and_the_record_changes_of_a_subset():
    import corpus
    rec = lambda docs, chars, tokens, h: {"documents": docs, "chars": chars, "tokens": tokens, "text_sha256": h}
    stats = {"sources": {"a": {"train": rec(3, 900, 200, "x"), "val": rec(1, 100, 20, "y"), "code_share": 0.1},
                         "b": {"train": rec(1, 1000, 300, "z"), "val": rec(0, 0, 0, "w"), "code_share": 0.0}},
             "splits": {"train": {"documents": 4, "tokens": 504, "sha256": "1" * 64},
                        "val": {"documents": 1, "tokens": 21, "sha256": "2" * 64}}}
    manifest = {"sources": [{"id": "a", "what": "A's manual", "registry": "pypi", "name": "a", "version": "1",
                             "licence": "MIT", "size": 2**20, "subset": "cpu"},
                            {"id": "b", "what": "B's book", "registry": "debian", "name": "b-doc", "version": "2-1",
                             "licence": "GPL-2+", "size": 2**21, "subset": "full"}]}
    assert corpus.markdown(stats, manifest, "full") == (
        "| b: B's book | debian `b-doc` 2-1 | GPL-2+ | 1 | 300 | 0.0% |\n"
        "| **full corpus** | 2 artifacts, 3.0 MiB | | 5 | **520** | 5.0% |")   # code: 0.1 * 1000 of 2000 characters
    old = json.loads(json.dumps(stats))
    stats["sources"]["a"]["val"]["text_sha256"] = "other"
    stats["splits"]["val"] = {"documents": 1, "tokens": 22, "sha256": "3" * 64}
    del stats["sources"]["b"]
    assert corpus.changes(old, stats) == [f"val.bin: 21 -> 22 tokens, sha256 {'2' * 16}... -> {'3' * 16}...",
                                          "source b removed", "source a: other text"]


def test_the_subsets_nest_and_the_laptop_subset_reads_only_its_sources(tmp_path):
    """cpu within laptop within full: a source marked cpu is in all three, one marked laptop in laptop and full, one
    marked full in full alone; documents('laptop') reads the first two (the third's artifact is not even opened)."""
    a = source(tmp_path, "a", "a-1.tar.gz", tar_bytes({"a/x.txt": prose(1).encode()}), ["a/*"])
    b = source(tmp_path, "b", "b-1.tar.gz", tar_bytes({"b/x.txt": prose(2).encode()}), ["b/*"], subset="laptop")
    c = source(tmp_path, "c", "c-1.tar.gz", tar_bytes({"c/x.txt": prose(3).encode()}), ["c/*"], subset="full")
    manifest = {"sources": [a, b, c]}
    assert [[s["id"] for s in pinned.subset_sources(manifest, name)] for name in ("cpu", "laptop", "full")] == [
        ["a"], ["a", "b"], ["a", "b", "c"]]
    (tmp_path / "c-1.tar.gz").write_bytes(b"not read")   # the laptop subset never reads c's artifact
    docs = pinned.documents("laptop", tmp_path, manifest, count=len)
    assert sorted({d[0].split(":")[0] for d in docs}) == ["a", "b"]
    with pytest.raises(CorpusError, match="unknown corpus subset 'tiny': use cpu, laptop, full, archive"):
        pinned.subset_sources(manifest, "tiny")
    from pinned_corpus import schema
    good = json.loads((Path(pinned.__file__).parent / "manifest.json").read_text())
    assert schema.problem(good) is None
    good["sources"][0]["subset"] = "tiny"
    assert 'subset" is "tiny", not "cpu" or "laptop" or "full"' in schema.problem(good)


def test_measure_pins_the_bytes_files_as_prepare_writes_them(tmp_path):
    """measure()'s bytes_splits: the sha256 and length of the uint16 file of each document's UTF-8 bytes followed by
    256, computed here by hand from the documents (non-ASCII text included)."""
    docs = [("a:1", "train", "héllo wörld"), ("a:2", "train", "plain"), ("a:3", "val", "naïve ✓")]
    stats = pinned.measure(docs, ["a"], lambda t: [ord(c) % 50000 for c in t], 50256)
    for split in ("train", "val"):
        ids = [x for _, s, t in docs if s == split for x in [*t.encode("utf-8"), 256]]
        want = np.array(ids, dtype=np.uint16)
        assert stats["bytes_splits"][split] == {"documents": sum(1 for d in docs if d[1] == split),
                                                "tokens": len(ids), "sha256": hashlib.sha256(want.tobytes()).hexdigest()}
