"""The pinned corpus (corpus.py, corpus_text.py): archive readers, markup readers, cleaning, dedup and split on
small archives made here, checked against hand-written text; fetch and resume failures; and the CPU subset built from the real
artifacts (in $CORPUS_CACHE, which .ci/run fills) against the sha256s and token counts in corpus_manifest.json."""
import gzip
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest

import corpus
import corpus_text
from corpus import CorpusError


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


# ----------------------------------------------------------------------------- readers

def test_rst_markup_is_stripped_to_its_prose():
    rst = """\
Title of the page
=================

.. _a-target:

A paragraph with a :class:`~django.db.models.Model`, a :doc:`link text </ref/x>`, ``literal``,
*emphasis*, **strong** and `a link <https://example.com>`_ [#]_ that wraps
over two lines.

.. code-block:: python

    print("dropped")

.. note:: The argument is prose.

   And so is the body.

Here is an example::

    x = 1  # dropped too

>>> 1 + 1
2

=====  =====
a      b
=====  =====
1      2
=====  =====

- first item
- second item
  continued

.. toctree::
   :maxdepth: 2

   intro
After.
"""
    assert corpus_text.rst_to_text(rst) == (
        "Title of the page\n\n"
        "A paragraph with a Model, a link text, literal, emphasis, strong and a link that wraps over two lines.\n\n"
        "The argument is prose.\n\nAnd so is the body.\n\n"
        "Here is an example:\n\n"
        "- first item\n- second item continued\n\n"
        "After.")


def test_html_is_stripped_to_its_prose():
    html = ("<html><head><title>t</title><style>p {x}</style></head><body><nav>Menu</nav>"
            "<h1>Heading &amp; more than five words<a class=headerlink>\u00b6</a></h1><p>One <b>bold</b>\nparagraph "
            "with <code>inline()</code> code.</p><pre>code()</pre>"
            "<div>Menu item</div><div>Short but a sentence.</div>"
            "<script>var x;</script><!-- note --><table><tr><td>cell</td></tr></table><ul><li>an item &eacute; of six words</li>"
            "<li>name</li></ul>"
            "</body></html>")
    assert corpus_text.html_to_text(html) == ("Heading & more than five words\n\nOne bold paragraph with inline() code.\n\n"
                                         "Short but a sentence.\n\nan item é of six words")


def test_gutenberg_header_and_footer_are_cut():
    text = ("The Project Gutenberg EBook of X\nlicence words\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\n"
            "Sing, O goddess.\n  The wrath.\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\nmore licence\n")
    assert corpus_text.normalise(corpus_text.plain_to_text(text)) == "Sing, O goddess.\n  The wrath."


def test_normalise_nfc_newlines_tabs_controls():
    assert corpus_text.normalise("Cafe\u0301\r\nline\t end  \r\n\n\n\nx\x00y\u200b\ufeff") == "Café\nline     end\n\nxy"


def test_kjv_verses_are_grouped_by_chapter():
    lines = [{"book": "Ruth", "chapter": c, "verse": v, "text": f"v{c}.{v}"} for c in (1, 2) for v in (1, 2)]
    docs = corpus_text.member_documents("kjv.jsonl", "\n".join(json.dumps(x) for x in lines).encode(), "kjv_jsonl")
    assert docs == [("kjv.jsonl#Ruth 1", "Ruth 1\n\n1 v1.1\n2 v1.2"), ("kjv.jsonl#Ruth 2", "Ruth 2\n\n1 v2.1\n2 v2.2")]


def test_wordnet_glosses_and_json_chapters():
    data = ("  1 This software and database is being provided\n"
            "00005930 03 n 01 dwarf 0 001 @ 00004475 n 0000 | a plant or animal that is atypically small  \n"
            "00977867 04 n 02 blitz 0 blitz_krieg 0 003 @ 00974725 n 0000 ;c 08215965 n 0000 | a swift offensive; "
            "\"the blitz\"  \n")
    assert corpus_text.member_documents("dict/data.noun", data.encode(), "wordnet") == [
        ("dict/data.noun#0", "dwarf: a plant or animal that is atypically small\n"
                             "blitz, blitz krieg: a swift offensive; \"the blitz\"")]
    chapter = json.dumps({"chapter": "1", "title": "Loomings.", "text": "Call me Ishmael."}).encode()
    assert corpus_text.member_documents("c1.json", chapter, "json_chapter") == [("c1.json", "Loomings.\n\nCall me Ishmael.")]


def test_api_descriptions_keep_their_documentation_strings_under_their_names():
    service = {"version": "2.0", "metadata": {"endpointPrefix": "s3"},
               "documentation": "<p>Stores <code>objects</code> in buckets.</p>",
               "operations": {"PutObject": {"http": {"method": "PUT"}, "documentation":
                                            "<p>Adds an object to a bucket.</p><ul><li><p>Never partial.</p></li></ul>"}},
               "shapes": {"Key": {"type": "string", "enum": ["a"], "documentation": "<p>The name of the object.</p>"}}}
    assert corpus_text.member_documents("s3/service-2.json", json.dumps(service).encode(), "json_docs") == [
        ("s3/service-2.json", "Stores objects in buckets.\n\nPutObject\n\nAdds an object to a bucket.\n\n"
                              "Never partial.\n\nKey\n\nThe name of the object.")]
    discovery = {"description": "Manages sites.", "resources": {"sites": {"methods": {"get": {
        "description": "Gets a site.", "parameters": {"name": {"type": "string", "description": "Required. The site."}}}}}}}
    assert corpus_text.json_docs(json.dumps(discovery)) == "Manages sites.\n\nget\n\nGets a site.\n\nname\n\nRequired. The site."


def test_jsii_assembly_gives_readmes_and_api_summaries_without_examples():
    readme = ("# Buckets\n\nA [bucket](https://x/y) holds **objects**\nof any size.\n\n```ts\nnew Bucket(this, 'B');\n```\n\n"
              "Use `grantRead` to share it.")
    assembly = {"readme": {"markdown": readme},
                "types": {"lib.Bucket": {"name": "Bucket", "docs": {"summary": "An S3 bucket.", "example": "new Bucket()",
                                                                   "remarks": "Buckets are\nregional."},
                                         "properties": [{"name": "bucketName", "docs": {"default": "- generated",
                                                                                        "summary": "The bucket's name."}}]}}}
    assert corpus_text.member_documents(".jsii", json.dumps(assembly).encode(), "jsii") == [
        (".jsii", "Buckets\n\nA bucket holds objects of any size.\n\nUse grantRead to share it.\n\n"
                  "Bucket\n\nAn S3 bucket.\n\nBuckets are regional.\n\nbucketName\n\nThe bucket's name.")]


def test_man_pages_keep_prose_and_drop_synopsis_code_and_macros():
    page = (".\\\" a comment\n.de XX\n.nf\nmacro body\n..\n.TH QSORT 3 2023\n.SH NAME\nqsort \\- sort an array\n"
            ".SH SYNOPSIS\n.nf\n.B #include <stdlib.h>\n.fi\n.SH DESCRIPTION\nThe\n.BR qsort ()\nfunction sorts\n"
            "\\fIbase\\fP in place\\(em quickly.\n.PP\nSee\n.IR \"sort order\" .\n.EX\nqsort(a, n, 4, cmp);\n.EE\n"
            ".TP\n.B EINVAL\nBad \\[lq]size\\[rq].\n")
    assert corpus_text.member_documents("man3/qsort.3.gz", gzip.compress(page.encode()), "man") == [
        ("man3/qsort.3.gz", "NAME\n\nqsort - sort an array\n\nSYNOPSIS\n\nDESCRIPTION\n\nThe qsort() function sorts base in "
                            "place— quickly.\n\nSee sort order.\n\nEINVAL Bad “size”.")]


def test_info_files_lose_node_headers_menus_and_code_but_keep_definitions():
    info = ("\x1f\nFile: g.info,  Node: Lists,  Next: Pairs,  Up: Top\n\n2.1 Lists\n=========\n\nA list is\nmade of pairs.\n\n"
            "* Menu:\n\n* Pairs::   Cons cells.\n\n     (define x (list 1 2))\n\n -- Procedure: length lst\n"
            "     Return the number of elements in LST.\n\n\x1f\nTag Table:\nNode: Top\x7f100\n")
    assert corpus_text.info_to_text(info) == ("2.1 Lists\n\nA list is made of pairs.\n\n"
                                              "-- Procedure: length lst Return the number of elements in LST.")


def test_dictd_entries_become_paragraphs_without_tags_and_pronunciations():
    data = ("00-database-info\n     This is GCIDE.\n\n"
            "Lapidate \\Lap\"i*date\\, v. t. [L. lapidatus, p. p. of lapidare,\n   fr. lapis stone.]\n"
            "   To stone. [Obs.]\n   [1913 Webster]\n\n"
            "Lapidation \\Lap`i*da\"tion\\, n.\n   The act of stoning.\n   [PJC]\n")
    assert corpus_text.member_documents("gcide.dict.dz", data.encode(), "dictd") == [(
        "gcide.dict.dz", "Lapidate, v. t. [L. lapidatus, p. p. of lapidare, fr. lapis stone.] To stone. [Obs.]\n\n"
                         "Lapidation, n. The act of stoning.")]


# ----------------------------------------------------------------------------- archives

def test_sdist_and_deb_members_come_in_sorted_order(tmp_path):
    files = {"pkg/b.txt": b"bee", "pkg/a.txt": b"ay", "pkg/sub/c.txt": "c\u00e9".encode()}
    (tmp_path / "x-1.tar.gz").write_bytes(tar_bytes(files))
    (tmp_path / "x_1_all.deb").write_bytes(deb_bytes({"./" + k: v for k, v in files.items()}))
    expected = sorted(files.items())
    assert list(corpus.archive_files(tmp_path / "x-1.tar.gz")) == expected
    assert list(corpus.archive_files(tmp_path / "x_1_all.deb")) == expected
    # an odd-sized member is padded in the ar archive; the next member must still be found
    assert corpus.ar_members(ar_bytes({"a": b"odd", "b": b"even"})) == {"a": b"odd", "b": b"even"}


def test_zstd_deb_and_truncated_archives_are_one_line_errors_naming_the_source(tmp_path):
    data = tar_bytes({"pkg/a.txt": PROSE.encode() * 50})
    src = source(tmp_path, "cut", "cut-1.tar.gz", data[:len(data) // 2], ["pkg/*.txt"])
    with pytest.raises(CorpusError, match=r"source cut: cut-1.tar.gz is truncated or corrupt .*fetch"):
        corpus.extract_source(src, tmp_path / "cut-1.tar.gz")
    src = source(tmp_path, "zst", "z_1_all.deb", deb_bytes({"./a.txt": b"x"}, "data.tar.zst"), ["*"])
    with pytest.raises(CorpusError, match=r"source zst: .*zstandard"):
        corpus.extract_source(src, tmp_path / "z_1_all.deb")


# ----------------------------------------------------------------------------- cleaning, split

def test_deduplicate_drops_copies_and_repeated_long_paragraphs():
    long_a, long_b, long_c = ("Alpha " * 20).strip(), ("Beta " * 20).strip(), ("Gamma " * 40).strip()
    short = "Examples"
    docs = [("s:1", f"{long_a}\n\n{short}\n\n{long_b}"),
            ("s:2", f"{long_a}\n\n{short}\n\n{long_b}"),          # exact copy: dropped
            ("s:3", f"{long_a}\n\n{long_b}\n\nshort new"),       # mostly copied: dropped
            ("s:4", f"{long_c}\n\n{short}\n\n{long_a}"),          # long_a repeated: that paragraph goes
            ("s:5", "tiny")]                                      # under MIN_CHARS
    assert list(corpus.deduplicate(iter(docs))) == [docs[0], ("s:4", f"{long_c}\n\n{short}")]


@pytest.mark.parametrize("n_files", [10, 11])
def test_paragraphs_on_most_pages_of_a_source_are_boilerplate(n_files):
    texts = [(f"p{i}", f"Navigation\n\nPage {i} says {i * 'x'}.\n\nNext") for i in range(n_files)]
    texts[0] = ("p0", "Only this.")
    cleaned = corpus.drop_boilerplate(texts)
    if n_files - 1 < corpus.BOILER_MIN:   # "Navigation" in 9 files: kept
        assert cleaned == texts
    else:   # in 10 of 11 files: dropped
        assert cleaned == [("p0", "Only this.")] + [(f"p{i}", f"Page {i} says {i * 'x'}.") for i in range(1, n_files)]


def test_split_is_by_the_first_byte_of_the_texts_sha256():
    texts = [f"document number {i}" for i in range(4000)]
    val = [t for t in texts if corpus.split_of(t) == "val"]
    assert val == [t for t in texts if hashlib.sha256(t.encode()).digest()[0] < 10]
    assert 0.03 < len(val) / len(texts) < 0.05


def test_long_texts_are_cut_between_paragraphs(monkeypatch):
    monkeypatch.setattr(corpus, "MAX_CHARS", 10)
    assert corpus.pieces("aaaa\n\nbbbb\n\ncccccccccccccc\n\nd") == ["aaaa\n\nbbbb", "cccccccccccccc", "d"]


def test_documents_of_a_two_source_corpus(tmp_path):
    a = source(tmp_path, "a", "a-1.tar.gz", tar_bytes({"a-1/z.rst": f"Z\n=\n\n{PROSE}".encode(),
                                                     "a-1/y.rst": f"Y\n\n{PROSE}\n\nmore words".encode(),
                                                     "a-1/skip.py": PROSE.encode()}), ["a-1/*.rst"], "rst")
    b = source(tmp_path, "b", "b_1_all.deb", deb_bytes({"./usr/share/doc/b/x.html": f"<p>{PROSE}</p>".encode()}),
               ["usr/share/doc/*.html"], "html", registry="debian")
    docs = list(corpus.documents(sources=[a, b], cache=tmp_path, manifest={"sources": [a, b]}))
    # y.rst before z.rst (sorted); z.rst keeps "Z" and drops PROSE as a repeat; b's page is a copy of PROSE
    y = f"Y\n\n{PROSE.strip()}\n\nmore words"
    assert [(i, t) for i, _, t in docs] == [("a:a-1/y.rst", y)]
    assert docs[0][1] == corpus.split_of(y)


def two_sources(tmp_path):
    texts = {f"a-1/{i:02d}.txt": f"Text number {i}. {PROSE} " * (i + 1) for i in range(30)}  # 2 of them go to val
    a = source(tmp_path, "a", "a-1.tar.gz", tar_bytes({k: v.encode() for k, v in texts.items()}), ["a-1/*"])
    b = source(tmp_path, "b", "b-1.tar.gz", tar_bytes({"b/x.txt": ("Other words entirely. " * 20).encode()}), ["b/*"],
               subset="full")
    return {"sources": [a, b]}


def test_archive_holds_the_first_documents_by_hash_and_is_checked(tmp_path, monkeypatch):
    manifest = two_sources(tmp_path)
    full = list(corpus.documents("full", tmp_path, manifest))
    by_hash = sorted(full, key=lambda d: hashlib.sha256(d[2].encode()).digest())
    budget = sum(len(d[2]) for d in by_hash[:5])
    monkeypatch.setattr(corpus, "ARCHIVE_CHARS", budget)
    assert list(corpus.documents("archive", tmp_path, manifest)) == by_hash[:5]
    info = corpus.write_archive(tmp_path / "c.jsonl.xz", tmp_path, manifest)
    assert info["sha256"] == hashlib.sha256((tmp_path / "c.jsonl.xz").read_bytes()).hexdigest()
    manifest["archive"] = info
    assert list(corpus.documents("archive", manifest=manifest, archive=tmp_path / "c.jsonl.xz")) == by_hash[:5]
    with pytest.raises(CorpusError, match=r"c.jsonl.xz exists: pass another --out"):
        corpus.write_archive(tmp_path / "c.jsonl.xz", tmp_path, manifest)
    data = (tmp_path / "c.jsonl.xz").read_bytes()
    (tmp_path / "cut.jsonl.xz").write_bytes(data[:len(data) // 2])
    with pytest.raises(CorpusError, match=r"^corpus archive cut.jsonl.xz has sha256 .*copy it again"):
        list(corpus.documents("archive", manifest=manifest, archive=tmp_path / "cut.jsonl.xz"))
    manifest["archive"]["sha256"] = hashlib.sha256((tmp_path / "cut.jsonl.xz").read_bytes()).hexdigest()
    with pytest.raises(CorpusError, match=r"^corpus archive cut.jsonl.xz is corrupt"):
        list(corpus.documents("archive", manifest=manifest, archive=tmp_path / "cut.jsonl.xz"))


def test_a_source_whose_text_changed_is_named_before_tokenising(tmp_path):
    manifest = two_sources(tmp_path)
    docs = list(corpus.documents("full", tmp_path, manifest))
    hashes = {sid: {split: hashlib.sha256(b"".join(t.encode() + b"\0" for i, s, t in docs
                                                  if i.startswith(sid + ":") and s == split)).hexdigest()
                    for split in ("train", "val")} for sid in ("a", "b")}
    manifest["subsets"] = {"full": {"sources": {sid: {split: {"text_sha256": h} for split, h in v.items()}
                                                for sid, v in hashes.items()}}}
    corpus.check_texts(docs, "full", manifest)
    changed = [(i, s, t + "!" if i.startswith("b:") else t) for i, s, t in docs]
    with pytest.raises(CorpusError, match=r"^source b \(b 1\) gives other (train|val) text than the manifest records"):
        corpus.check_texts(changed, "full", manifest)


# ----------------------------------------------------------------------------- fetch, resume

def test_fetch_downloads_checks_and_keeps_nothing_half_written(tmp_path, monkeypatch):
    remote = tmp_path / "remote"
    remote.mkdir()
    data = tar_bytes({"p/a.txt": PROSE.encode()})
    (remote / "p-1.tar.gz").write_bytes(data)
    src = {"id": "p", "filename": "p-1.tar.gz", "sha256": hashlib.sha256(data).hexdigest()}
    monkeypatch.setattr(corpus, "artifact_url", lambda s: (remote / s["filename"]).as_uri())
    cache = tmp_path / "cache"
    assert corpus.fetch(src, cache).read_bytes() == data
    # the registry's file changed: refused, nothing left in the cache
    changed = dict(src, filename="q-1.tar.gz")
    (remote / "q-1.tar.gz").write_bytes(data + b"x")
    with pytest.raises(CorpusError, match=r"^source p: the registry's q-1.tar.gz has sha256 .* the artifact changed"):
        corpus.fetch(changed, cache)
    assert sorted(os.listdir(cache)) == ["p-1.tar.gz"]
    # a cached copy that differs is named, and left where it is
    (cache / "p-1.tar.gz").write_bytes(b"other")
    with pytest.raises(CorpusError, match=r"^source p: .*p-1.tar.gz has sha256 .*move that file away"):
        corpus.fetch(src, cache)
    assert (cache / "p-1.tar.gz").read_bytes() == b"other"


def test_unreachable_registry_is_one_line_naming_the_source(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "PYPI_JSON", "http://127.0.0.1:9/pypi/{name}/json")
    src = {"id": "django-docs", "registry": "pypi", "name": "django", "version": "1", "filename": "d-1.tar.gz",
           "sha256": "0" * 64}
    with pytest.raises(CorpusError, match=r"^source django-docs: cannot download d-1.tar.gz .*check the network, or "
                                          r"put the file"):
        corpus.fetch(src, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_full_disk_while_caching_an_extraction_is_one_line(tmp_path, monkeypatch):
    src = source(tmp_path, "a", "a-1.tar.gz", tar_bytes({"a/x.txt": PROSE.encode()}), ["a/*"])
    real_open = open

    def full(path, mode="r", *args, **kw):
        if "w" in mode:
            raise OSError(28, "No space left on device")
        return real_open(path, mode, *args, **kw)
    monkeypatch.setattr(corpus, "open", full, raising=False)
    with pytest.raises(CorpusError, match=r"^source a: cannot write .* \(No space left on device\): free disk space"):
        corpus.extracted(src, tmp_path)
    assert sorted(p.name for p in (tmp_path / "extracted").iterdir()) == []


def test_a_killed_run_resumes_without_redoing_finished_sources(tmp_path, monkeypatch):
    a = source(tmp_path, "a", "a-1.tar.gz", tar_bytes({"a/x.txt": PROSE.encode()}), ["a/*"])
    b = source(tmp_path, "b", "b-1.tar.gz", tar_bytes({"b/x.txt": ("Other words entirely. " * 20).encode()}), ["b/*"])
    calls, real = [], corpus.extract_source

    def counting(src, path):
        calls.append(src["id"])
        if src["id"] == "b" and calls.count("b") == 1:
            raise KeyboardInterrupt   # killed while extracting b
        return real(src, path)
    monkeypatch.setattr(corpus, "extract_source", counting)
    with pytest.raises(KeyboardInterrupt):
        list(corpus.documents(sources=[a, b], cache=tmp_path, manifest={}))
    assert sorted(p.name for p in (tmp_path / "extracted").iterdir()) == ["a.jsonl"]
    # a half-written file of b from some earlier crash is not taken for an extraction
    (tmp_path / "extracted" / "b.jsonl.tmp").write_text("{")
    docs = list(corpus.documents(sources=[a, b], cache=tmp_path, manifest={}))
    assert calls == ["a", "b", "b"] and [d[0] for d in docs] == ["a:a/x.txt", "b:b/x.txt"]
    # a changed extractor version redoes the extraction
    monkeypatch.setattr(corpus, "EXTRACT_VERSION", corpus.EXTRACT_VERSION + 1)
    assert list(corpus.documents(sources=[a, b], cache=tmp_path, manifest={})) == docs
    assert calls == ["a", "b", "b", "a", "b"]


# ----------------------------------------------------------------------------- the real CPU subset

def cpu_cache() -> Path | None:
    """The folder holding the CPU subset's artifacts: $CORPUS_CACHE (.ci/run fills it), else data/corpus_cache."""
    manifest = corpus.load_manifest()
    cache = corpus.default_cache()
    if not cache.is_absolute():
        cache = Path(corpus.__file__).parent / cache
    have = all((cache / s["filename"]).exists() for s in corpus.subset_sources(manifest, "cpu"))
    if not have and os.environ.get("CI"):
        pytest.fail(f"CI must provide the CPU subset's artifacts in $CORPUS_CACHE ({cache}): see .ci/run")
    return cache if have else None


def test_cpu_subset_matches_the_manifest(tmp_path):
    cache = cpu_cache()
    if cache is None:
        pytest.skip("the CPU subset's artifacts are not downloaded: python corpus.py fetch --subset cpu")
    from tokenizer import load_tokenizer
    tok = load_tokenizer("gpt2")
    manifest = corpus.load_manifest()
    stats = corpus.measure("cpu", cache, tok.encode, tok.eot_token, manifest, work=tmp_path)  # extracted afresh
    assert stats == manifest["subsets"]["cpu"]


def test_gpt2_ranks_come_from_the_pinned_sdist_member(tmp_path):
    ranks = b"IQ== 0\n"
    sdist = tar_bytes({"w-1/whisper/assets/gpt2.tiktoken": ranks, "w-1/setup.py": b""})
    (tmp_path / "w-1.tar.gz").write_bytes(sdist)
    tok = {"id": "gpt2-tokenizer", "filename": "w-1.tar.gz", "sha256": hashlib.sha256(sdist).hexdigest(),
           "member": "w-1/whisper/assets/gpt2.tiktoken", "member_sha256": hashlib.sha256(ranks).hexdigest()}
    assert corpus.gpt2_ranks(tmp_path, {"tokenizer": tok}).read_bytes() == ranks
    (tmp_path / "gpt2.tiktoken").unlink()
    with pytest.raises(CorpusError, match=r"^source gpt2-tokenizer: w-1.tar.gz does not hold w-1/whisper/assets/gpt2"):
        corpus.gpt2_ranks(tmp_path, {"tokenizer": dict(tok, member_sha256="0" * 64)})
    assert not (tmp_path / "gpt2.tiktoken").exists()


def test_prepare_pinned_writes_the_manifests_token_files_and_names_a_changed_source(tmp_path, monkeypatch, capsys,
                                                                                    gpt2_ranks):
    import dataset
    import prepare_c4
    from tokenizer import load_tokenizer
    manifest = two_sources(tmp_path)
    tok = load_tokenizer("gpt2")
    manifest["subsets"] = {"full": corpus.measure("full", tmp_path, tok.encode, tok.eot_token, manifest)}
    monkeypatch.setattr(corpus, "load_manifest", lambda path=None: manifest)
    monkeypatch.setenv("CORPUS_CACHE", str(tmp_path))
    prepare_c4.main(["--source", "pinned", "--subset", "full", "--out_dir", str(tmp_path / "out"), "--num_proc", "1"])
    meta = dataset.load_meta(tmp_path / "out")
    assert {s: (v["sha256"], v["tokens"]) for s, v in meta["splits"].items()} == \
        {s: (v["sha256"], v["tokens"]) for s, v in manifest["subsets"]["full"]["splits"].items()}
    assert meta["args"]["manifest_sha256"] == corpus.manifest_sha256() and str(tmp_path) not in json.dumps(meta)
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
    import dataset   # a missing pinned folder names the command that makes it (the main job's first error)
    with pytest.raises(ValueError, match=r"run python prepare_c4.py --source pinned --subset cpu --out_dir .*pinned_cpu$"):
        dataset.load_meta(tmp_path / "data" / "pinned_cpu")
    assert not (tmp_path / "o").exists()


def test_the_main_job_on_two_cpu_threads_trains_the_same_weights_twice(tmp_path):
    """Two processes of the main job's config on the CPU subset, two threads each: the same weights bit for bit
    after 3 steps. Without torch's deterministic algorithms (train.py turns them on for the CPU) the tied
    embedding's gradient differed in its last bits between runs, and the main job's val ppl in its 2nd decimal."""
    import subprocess
    import sys

    import torch
    cache = cpu_cache()
    if cache is None:
        pytest.skip("the CPU subset's artifacts are not downloaded: python corpus.py fetch --subset cpu")
    root = Path(corpus.__file__).parent
    env = dict(os.environ, OMP_NUM_THREADS="2", CORPUS_CACHE=str(cache))
    run = lambda *a: subprocess.run([sys.executable, *a], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    r = run("prepare_c4.py", "--source", "pinned", "--out_dir", str(tmp_path / "data"), "--num_proc", "1")
    assert r.returncode == 0, r.stderr[-2000:]
    weights = []
    for name in "ab":
        r = run("train.py", "config/main.py", f"--dataset={tmp_path / 'data'}", f"--out_dir={tmp_path / name}",
                "--max_iters=3", "--eval_interval=100", "--eval_tokens=4096", "--probe_docs=0", "--log_interval=1")
        assert r.returncode == 0, r.stderr[-2000:]
        weights.append(torch.load(tmp_path / name / "ckpt.pt", map_location="cpu", weights_only=False)["model"])
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_find_archive_prefers_data_then_the_folder_itself(tmp_path):
    assert corpus.find_archive(tmp_path) is None
    (tmp_path / "corpus-archive.jsonl.xz").write_bytes(b"x")
    assert corpus.find_archive(tmp_path) == str(tmp_path / "corpus-archive.jsonl.xz")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "corpus-archive.jsonl.xz").write_bytes(b"y")
    assert corpus.find_archive(tmp_path) == str(tmp_path / "data" / "corpus-archive.jsonl.xz")
