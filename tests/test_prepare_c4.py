"""prepare_c4.py on small C4-format shards written here, through the real datasets and tiktoken code.

    python -m pytest -q tests/test_prepare_c4.py
"""
import base64
import gzip
import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import tiktoken

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import prepare_c4  # noqa: E402
from harness import dataset, fileio, measure, runs, sources, tokenizer as tokenizer_lib, train_config
from harness.entry import run_script

pytestmark = pytest.mark.slow   # data preparation through datasets and tiktoken

TRAIN = [  # two train shards
    [f"Document {i} of the first shard: the thing in the evening is interesting. " * (1 + i % 4) for i in range(9)]
    + ["naïve café — 日本語のテキスト, emoji 🙂 and\nnew\nlines\n", "literal <|endoftext|> inside a document"],
    [f"Second shard document {i}; there were other things happening." * (1 + i % 3) for i in range(7)],
]
VAL = [f"Validation document number {i}, with the ending -ing." * (1 + i % 2) for i in range(6)]
MERGES = [b"th", b"the", b" the", b"in", b"ing", b" in", b"er", b"en", b" a"]


def write_shard(path, texts):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t, "timestamp": "2019-04-25T12:57:54Z", "url": "https://example.com/x"}) + "\n")


@pytest.fixture
def shards(tmp_path):
    d = tmp_path / "c4" / "en"
    d.mkdir(parents=True)
    for i, texts in enumerate(TRAIN):
        write_shard(d / f"c4-train.{i:05d}-of-00002.json.gz", texts)
    write_shard(d / "c4-validation.00000-of-00001.json.gz", VAL)
    return d


@pytest.fixture
def vocab(tmp_path):
    """A small byte-level BPE with the GPT-2 split pattern, written as a .tiktoken file."""
    ranks = {bytes([i]): i for i in range(256)}
    for m in MERGES:
        ranks[m] = len(ranks)
    enc = tiktoken.Encoding("tiny", pat_str=tokenizer_lib.GPT2_PAT, mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": len(ranks)})
    path = tmp_path / "tiny.tiktoken"
    path.write_bytes(b"".join(base64.b64encode(t) + b" " + str(r).encode() + b"\n" for t, r in ranks.items()))
    return path, enc


def read_docs(out, split, eot):
    """Token ids of each document in SPLIT.bin (split on eot; every document ends with eot)."""
    meta = json.loads((out / "meta.json").read_text())
    ids = np.fromfile(out / f"{split}.bin", dtype=meta["dtype"])
    assert ids[-1] == eot
    cuts = np.flatnonzero(ids == eot)
    return [ids[a + 1:b].tolist() for a, b in zip(np.r_[-1, cuts[:-1]], cuts)]


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def run_main(args, capsys):
    """main(args) expected to fail: returns (exit code, stderr)."""
    with pytest.raises(SystemExit) as e:
        prepare_c4.main(args)
    return e.value.code, capsys.readouterr().err


def test_local_shards_tiktoken_end_to_end(shards, vocab, tmp_path):
    path, enc = vocab
    out = tmp_path / "out"
    prepare_c4.main(["--data_files", str(shards), "--tokenizer", str(path), "--out_dir", str(out), "--num_proc", "1"])
    meta = dataset.load_meta(out)
    eot = len(MERGES) + 256
    assert meta["vocab_size"] == eot + 1 and meta["eot_token"] == eot and meta["dtype"] == "uint16"
    assert meta["tokenizer"] == os.path.relpath(path) and not os.path.isabs(meta["tokenizer"]) and meta["format"] == 1 and meta["stand_in_for_c4"] is False
    assert meta["source"].startswith("local shards: 2 c4-train and 1 c4-validation")
    assert meta["args"]["tokenizer_sha256"] == sha256(path) and meta["args"]["val_docs"] == 100_000
    for split, texts in (("train", TRAIN[0] + TRAIN[1]), ("val", VAL)):
        expected = [enc.encode_ordinary(t) for t in texts]
        assert read_docs(out, split, eot) == expected
        info = meta["splits"][split]
        assert info["documents"] == len(texts)
        assert info["tokens"] == sum(len(x) + 1 for x in expected) == os.path.getsize(out / f"{split}.bin") // 2
        assert info["sha256"] == sha256(out / f"{split}.bin")
    assert not list(out.glob("*.tmp")) and not (out / ".progress.json").exists()


def test_worker_processes_keep_order(shards, vocab, tmp_path, monkeypatch):
    monkeypatch.setattr(tokenizer_lib, "CHUNK_DOCS", 2)
    metas = [dataset.load_meta(dataset.prepare_c4(tmp_path / f"out{n}", str(vocab[0]), [str(shards)], num_proc=n))
             for n in (1, 2)]
    assert metas[0]["splits"] == metas[1]["splits"]


def test_bytes_round_trip_and_bounds(shards, tmp_path, monkeypatch):
    monkeypatch.setattr(tokenizer_lib, "CHUNK_DOCS", 3)  # the bound falls in a later chunk
    texts = TRAIN[0] + TRAIN[1]
    lengths = np.cumsum([len(t.encode()) + 1 for t in texts])
    bound = int(lengths[4]) - 5  # inside document 4: documents 0..4 are kept
    out = dataset.prepare_c4(tmp_path / "out", "bytes", [str(shards / "c4-*.json.gz")],
                                train_tokens=bound, val_docs=2)
    meta = dataset.load_meta(out)
    assert meta["splits"]["train"] == {"documents": 5, "tokens": int(lengths[4]), "sha256": sha256(out / "train.bin"),
                                      "max_token_id": 256}
    assert meta["splits"]["val"]["documents"] == 2 and meta["vocab_size"] == 257 and meta["eot_token"] == 256
    train = read_docs(out, "train", 256)
    assert [bytes(x).decode() for x in train] == texts[:5]
    assert [bytes(x).decode() for x in read_docs(out, "val", 256)] == VAL[:2]
    # a bound exactly at the end of a document stops there
    out = dataset.prepare_c4(tmp_path / "out2", "bytes", [str(shards)], train_tokens=int(lengths[6]), val_docs=1)
    assert dataset.load_meta(out)["splits"]["train"]["documents"] == 7


def test_hub_path_streams_allenai_c4(shards, tmp_path, monkeypatch):
    import datasets
    real_load, calls = datasets.load_dataset, []

    def fake_load(path, name=None, split=None, streaming=False, **kw):
        calls.append((path, name, split, streaming))
        assert (path, name, streaming) == ("allenai/c4", "en", True)
        files = sorted(str(p) for p in shards.glob(f"c4-{split}.*.json.gz"))
        return real_load("json", data_files={split: files}, split=split, streaming=True)

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    hub = dataset.load_meta(dataset.prepare_c4(tmp_path / "hub", "bytes"))
    assert sorted(c[2] for c in calls) == ["train", "validation"]
    assert hub["source"] == "allenai/c4 en (hub, streamed)" and hub["args"]["data_files"] is None
    monkeypatch.setattr(datasets, "load_dataset", real_load)
    local = dataset.load_meta(dataset.prepare_c4(tmp_path / "local", "bytes", [str(shards)]))
    assert hub["splits"] == local["splits"]


def test_no_network_error(tmp_path, monkeypatch, capsys):
    import datasets

    def offline(*a, **kw):
        raise ConnectionError("Couldn't reach 'allenai/c4' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    code, err = run_main(["--tokenizer", "bytes", "--out_dir", str(tmp_path / "o"), "--num_proc", "1"], capsys)
    line = err.strip().splitlines()[-1]
    assert code == 2 and line.startswith("error: cannot stream allenai/c4")
    assert "--data_files" in line and "--source pinned" in line
    assert not (tmp_path / "o" / "meta.json").exists() and not (tmp_path / "o" / "val.bin").exists()


def test_gpt2_vocabulary_unavailable(tmp_path, monkeypatch, capsys):
    def no_vocab(name):
        raise ConnectionError("Failed to resolve 'openaipublic.blob.core.windows.net'")

    monkeypatch.setattr(tiktoken, "get_encoding", no_vocab)
    monkeypatch.delenv("GPT2_TIKTOKEN", raising=False)              # no local copy of the ranks either
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty_cache"))
    monkeypatch.setenv("CORPUS_CACHE", str(tmp_path / "empty_corpus_cache"))   # nor the pinned copy
    for spec in ("gpt2", "auto"):   # auto is gpt2: no silent fallback to bytes, which would train another model
        code, err = run_main(["--tokenizer", spec, "--out_dir", str(tmp_path / "o")], capsys)
        assert code == 2 and err.count("\n") == 1 and err.startswith("error: cannot load the GPT-2 vocabulary")
        assert "python corpus.py fetch" in err and "GPT2_TIKTOKEN" in err


def test_gpt2_ranks_are_found_in_the_corpus_cache(tmp_path, monkeypatch, gpt2_ranks):
    ranks = gpt2_ranks
    monkeypatch.delenv("GPT2_TIKTOKEN")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "empty_cache"))
    monkeypatch.setenv("CORPUS_CACHE", str(tmp_path))
    assert tokenizer_lib.gpt2_ranks_file() is None
    (tmp_path / "gpt2.tiktoken").write_bytes(open(ranks, "rb").read())
    assert tokenizer_lib.gpt2_ranks_file() == str(tmp_path / "gpt2.tiktoken")
    (tmp_path / "gpt2.tiktoken").write_bytes(b"IQ== 0\n")   # another file of that name is not GPT-2's
    assert tokenizer_lib.gpt2_ranks_file() is None


def test_bad_shards_are_one_line_errors(tmp_path, capsys):
    def fails(files, expected):
        d = tmp_path / f"case{len(list(tmp_path.iterdir()))}"
        d.mkdir()
        for name, content in files.items():
            (d / name).write_bytes(content)
        code, err = run_main(["--data_files", str(d), "--tokenizer", "bytes", "--out_dir", str(d / "out")], capsys)
        last = err.strip().splitlines()[-1]
        assert code == 2 and last.startswith("error: ") and expected in last, err
        assert not (d / "out" / "meta.json").exists()

    val = gzip.compress(json.dumps({"text": "a validation document"}).encode() + b"\n")
    fails({"c4-train.00000-of-00001.json.gz": gzip.compress(b"this is not json\n"),
           "c4-validation.00000-of-00001.json.gz": val}, "as C4 JSON lines")
    fails({"c4-train.00000-of-00001.json.gz": gzip.compress(b'{"content": "no text field"}\n'),
           "c4-validation.00000-of-00001.json.gz": gzip.compress(b'{"content": "no text field"}\n')}, "'text'")
    fails({"c4-train.00000-of-00001.json.gz": b'{"text": "not gzipped"}\n',
           "c4-validation.00000-of-00001.json.gz": val}, "as C4 JSON lines")
    fails({"shard.jsonl": b'{"text": "x"}\n'}, "no c4-train.*.json.gz")
    fails({"c4-train.00000-of-00001.json.gz": val}, "no c4-validation")
    code, err = run_main(["--data_files", str(tmp_path / "missing*.json.gz"), "--tokenizer", "bytes"], capsys)
    assert code == 2 and "no such file" in err
    (tmp_path / "notes.json.gz").write_bytes(val)
    code, err = run_main(["--data_files", str(tmp_path / "notes.json.gz"), "--tokenizer", "bytes"], capsys)
    assert code == 2 and "not a C4 shard name" in err


def test_interruption_leaves_nothing_loadable_then_resumes(shards, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tokenizer_lib, "CHUNK_DOCS", 2)
    real_encode, encoded = tokenizer_lib.encode_chunk, []

    def interrupt_in_train(texts, tok):
        if texts[0] in TRAIN[0][2:]:  # the second chunk of the train split
            raise KeyboardInterrupt
        encoded.extend(texts)
        return real_encode(texts, tok)

    monkeypatch.setattr(tokenizer_lib, "encode_chunk", interrupt_in_train)
    out = tmp_path / "out"
    args = ["--data_files", str(shards), "--tokenizer", "bytes", "--out_dir", str(out), "--num_proc", "1"]
    with pytest.raises(SystemExit) as e:   # as `python prepare_c4.py` runs it: through the scripts' entry point
        run_script(prepare_c4.main, args, note=prepare_c4.STOPPED)
    err = capsys.readouterr().err
    assert e.value.code == 130 and err.splitlines()[-1] == f"prepare_c4.py: stopped by SIGINT; {prepare_c4.STOPPED}"
    assert sorted(p.name for p in out.iterdir()) == [".progress.json", "val.bin"]  # val finished, train did not
    with pytest.raises(ValueError, match="no meta.json"):
        dataset.load_meta(out)

    def counting(texts, tok):
        encoded.extend(texts)
        return real_encode(texts, tok)

    encoded.clear()
    monkeypatch.setattr(tokenizer_lib, "encode_chunk", counting)
    prepare_c4.main(args)
    assert encoded == TRAIN[0] + TRAIN[1]  # val was not encoded again
    fresh = dataset.prepare_c4(tmp_path / "fresh", "bytes", [str(shards)])
    assert dataset.load_meta(out)["splits"] == dataset.load_meta(fresh)["splits"]


def test_rerun_skips_and_changed_arguments_need_force(shards, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    args = ["--data_files", str(shards), "--tokenizer", "bytes", "--out_dir", str(out), "--num_proc", "1"]
    prepare_c4.main(args)
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    calls = []
    monkeypatch.setattr(tokenizer_lib, "encode_chunk", lambda *a: calls.append(1))
    prepare_c4.main(args)
    assert calls == [] and {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == mtimes
    code, err = run_main(args + ["--train_tokens", "100"], capsys)
    assert code == 2 and "train_tokens: 100000000 -> 100" in err and "--force" in err
    monkeypatch.undo()
    prepare_c4.main(args + ["--train_tokens", "100", "--force"])
    meta = dataset.load_meta(out)
    assert meta["args"]["train_tokens"] == 100  # document 0 has 73 tokens, document 1 crosses 100
    assert meta["splits"]["train"]["documents"] == 2
    assert meta["splits"]["train"]["tokens"] == sum(len(t.encode()) + 1 for t in TRAIN[0][:2])


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_a_folder_another_program_marked_is_refused(shards, tmp_path, capsys, force):
    """prepare_c4.py wrote its token files into an export_hf.py folder (its .written-by names export_hf.py), which
    train.py then refused; fileio's rule: a marked folder is its program's. One line, nothing written, --force too."""
    out = tmp_path / "export"
    out.mkdir()
    (out / "config.json").write_text("{}")
    fileio.mark_folder(str(out), "export_hf.py", files=True)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    code, err = run_main(["--data_files", str(shards), "--tokenizer", "bytes", "--out_dir", str(out), *force], capsys)
    assert code == 2 and err.count("\n") == 1 and f"{out} is an output of export_hf.py" in err, err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_load_meta_rejects_corrupt_folders(shards, tmp_path):
    good = dataset.prepare_c4(tmp_path / "good", "bytes", [str(shards)])
    meta = json.loads((good / "meta.json").read_text())

    def broken(name, change):
        d = tmp_path / name
        d.mkdir()
        for p in good.iterdir():
            (d / p.name).write_bytes(p.read_bytes())
        change(d)
        with pytest.raises(ValueError) as e:
            dataset.load_meta(d)
        assert "\n" not in str(e.value)
        return str(e.value)

    assert "prepare_c4.py" in broken("no_meta", lambda d: (d / "meta.json").unlink())
    assert "not valid JSON" in broken("bad_json", lambda d: (d / "meta.json").write_text("{"))
    assert "unknown format" in broken("format", lambda d: (d / "meta.json").write_text(json.dumps({**meta, "format": 2})))
    assert "float32" in broken("dtype", lambda d: (d / "meta.json").write_text(json.dumps({**meta, "dtype": "float32"})))
    assert "missing or empty" in broken("no_val", lambda d: (d / "val.bin").unlink())
    assert "missing or empty" in broken("empty", lambda d: (d / "train.bin").write_bytes(b""))
    assert "truncated" in broken("short", lambda d: (d / "train.bin").write_bytes((d / "train.bin").read_bytes()[:-2]))
    assert "truncated" in broken("odd", lambda d: (d / "val.bin").write_bytes((d / "val.bin").read_bytes() + b"\0"))
    with pytest.raises(ValueError, match="not a prepared dataset"):
        dataset.load_meta(tmp_path / "nowhere")


def test_installed_docstrings_are_deterministic_on_one_installation(tmp_path, monkeypatch):
    monkeypatch.setattr(tokenizer_lib, "CHUNK_DOCS", 64)
    a, b = (dataset.load_meta(dataset.prepare_installed_docstrings(tmp_path / d, "bytes", max_docs=300)) for d in "ab")
    assert a["splits"] == b["splits"] and a["stand_in_for_c4"] is True and "NOT C4" in a["description"]
    assert a["splits"]["train"]["documents"] + a["splits"]["val"]["documents"] == 300
    for split in ("train", "val"):
        for doc in read_docs(tmp_path / "a", split, 256):
            text = bytes(doc).decode()
            assert len(text) >= sources.MIN_DOC_CHARS
            assert (int(hashlib.sha1(text.encode()).hexdigest(), 16) % 100 < 2) == (split == "val")
    docs = sources.docstring_documents(max_docs=120)
    assert docs == sources.docstring_documents(max_docs=120, num_proc=2) and len(set(docs)) == 120


def test_small_pieces(tmp_path):
    import tiktoken_ext.openai_public
    assert tokenizer_lib.GPT2_PAT == tiktoken_ext.openai_public.r50k_pat_str
    assert prepare_c4.count("1e5") == prepare_c4.count("100_000") == 100_000
    bad = tmp_path / "gap.tiktoken"
    bad.write_bytes(base64.b64encode(b"a") + b" 0\n" + base64.b64encode(b"b") + b" 2\n")
    with pytest.raises(fileio.PrepareError, match="ranks"):
        tokenizer_lib.load_tokenizer(str(bad))


@pytest.mark.parametrize("source", ["shards", "docstrings"])
def test_train_reads_what_prepare_writes(source, shards, vocab, tmp_path):
    """train.py trains from local C4 shards (test vocabulary) and from the installed docstrings (bytes)."""
    import math

    import train
    from configurator import load_config
    from conftest import ROOT
    out = tmp_path / "data"
    if source == "shards":
        dataset.prepare_c4(out_dir=out, tokenizer=str(vocab[0]), data_files=[str(shards)], val_docs=100)
    else:
        dataset.prepare_installed_docstrings(out_dir=out, tokenizer="bytes", max_docs=300)
    args = [os.path.join(ROOT, "config", "tiny_cpu.py"), f"--dataset={out}", f"--out_dir={tmp_path / 'run'}",
            "--max_iters=3", "--block_size=16", "--batch_size=2", "--eval_tokens=64"]
    cfg = load_config(train_config.DEFAULTS, args, train_config.CHOICES)
    result = train.train(cfg)
    assert cfg["vocab_size"] == dataset.load_meta(out)["vocab_size"]
    assert math.isfinite(result["val_loss"]) and result["iter"] == 3


def test_iter_documents_streams_documents_in_order(shards, tmp_path):
    out = tmp_path / "docs"
    dataset.prepare_c4(out_dir=out, tokenizer="bytes", data_files=[str(shards)], val_docs=100)
    docs = list(dataset.iter_documents(out, "val", chunk_tokens=7))   # chunks cut through documents
    assert [bytes(d.astype(np.uint8)).decode("utf-8") for d in docs] == VAL
    assert len(list(dataset.iter_documents(out, "val", max_docs=2))) == 2
    train_docs = list(dataset.iter_documents(out, "train"))
    assert bytes(train_docs[0].astype(np.uint8)).decode("utf-8") == TRAIN[0][0]


def test_bigram_backcopy_copies_after_triggers_and_follows_its_chain(tmp_path):
    vocab, triggers = 16, 4
    docs = np.stack(list(sources.bigram_backcopy_documents(400, 64, vocab, triggers, 0.3, seed=5)))
    again = np.stack(list(sources.bigram_backcopy_documents(400, 64, vocab, triggers, 0.3, seed=5)))
    assert np.array_equal(docs, again) and docs.min() >= 0 and docs.max() < vocab
    # the trigger set, recovered from the data alone: tokens always followed by the token before them
    prev2, prev, nxt = docs[:, :-2].ravel(), docs[:, 1:-1].ravel(), docs[:, 2:].ravel()
    copies = {t for t in range(vocab) if (prev == t).any() and np.all(nxt[prev == t] == prev2[prev == t])}
    assert len(copies) == triggers
    assert not np.isin(docs[:, 0], list(copies)).any()
    # elsewhere the next token follows the Dirichlet rows drawn from the seed (the same draws, replayed)
    rng = np.random.default_rng(5)
    trans = rng.dirichlet(np.full(vocab, 0.3), size=vocab)
    free = ~np.isin(docs[:, :-1], list(copies))
    counts = np.zeros((vocab, vocab))
    np.add.at(counts, (docs[:, :-1][free], docs[:, 1:][free]), 1)
    seen = counts.sum(1) > 500
    empirical = counts[seen] / counts[seen].sum(1, keepdims=True)
    assert np.abs(empirical - trans[seen]).max() < 0.05


def test_bigram_backcopy_prepares_a_dataset_in_the_documented_format(tmp_path):
    out = dataset.prepare_bigram_backcopy(tmp_path / 'bb', vocab=32, triggers=3, doc_len=40, train_docs=30, val_docs=7)
    meta = dataset.load_meta(out)
    assert (meta['vocab_size'], meta['eot_token'], meta['tokenizer']) == (33, 32, 'bigram_backcopy')
    assert meta['splits']['val'] == {**meta['splits']['val'], 'documents': 7, 'tokens': 7 * 41}
    assert meta['splits']['train']['documents'] == 30 and meta['stand_in_for_c4'] is True
    val = list(dataset.iter_documents(out, 'val'))
    expected = list(sources.bigram_backcopy_documents(37, 40, 32, 3, 0.1, 0))
    assert all(np.array_equal(a, b) for a, b in zip(val, expected[:7]))     # val first, then train, one stream
    train = np.fromfile(out / 'train.bin', dtype=np.uint16)
    assert np.array_equal(train[:40], expected[7])


def test_meta_records_each_splits_largest_token_id(shards, vocab, tmp_path):
    out = dataset.prepare_c4(tmp_path / "out", str(vocab[0]), [str(shards)])
    meta = dataset.load_meta(out)
    for split in dataset.SPLITS:
        ids = np.fromfile(out / f"{split}.bin", dtype=meta["dtype"])
        assert meta["splits"][split]["max_token_id"] == int(ids.max())


@pytest.mark.parametrize("source", ["docstrings", "shards"])
def test_hint_after_a_corrupt_file_repeats_the_command_that_made_it(source, shards, tmp_path, capsys):
    """The hint is the exact command (source, tokenizer, sizes, out_dir), and following it literally repairs."""
    import shlex
    out = tmp_path / "data"
    given = (["--source", "installed_docstrings", "--tokenizer", "bytes", "--max_docs", "300"] if source == "docstrings" else
             ["--data_files", str(shards), "--tokenizer", "bytes", "--val_docs", "3"])
    prepare_c4.main(given + ["--num_proc", "1", "--out_dir", str(out)])
    good = (out / "train.bin").read_bytes()
    (out / "train.bin").write_bytes(good[:-2])
    with pytest.raises(ValueError) as e:
        dataset.load_meta(out)
    command = str(e.value).split("prepare it again: ")[1]
    expected = (f"python prepare_c4.py --source installed_docstrings --tokenizer bytes --max_docs 300 --out_dir {out}" if source == "docstrings"
                else f"python prepare_c4.py --data_files {shards} --tokenizer bytes --train_tokens 100000000 "
                     f"--val_docs 3 --out_dir {out}")
    assert command == expected
    argv = shlex.split(command)
    assert argv[:2] == ["python", "prepare_c4.py"]
    prepare_c4.main(argv[2:])
    assert dataset.load_meta(out) and (out / "train.bin").read_bytes() == good


@pytest.mark.parametrize("damage", ["truncated", "random bytes"])
def test_an_unreadable_shard_is_named(damage, shards, tmp_path, capsys):
    bad = shards / "c4-train.00001-of-00002.json.gz"
    data = bad.read_bytes()
    bad.write_bytes(data[:len(data) // 2] if damage == "truncated" else np.random.default_rng(0).bytes(len(data)))
    code, err = run_main(["--data_files", str(shards), "--tokenizer", "bytes", "--out_dir", str(tmp_path / "o"),
                          "--num_proc", "1"], capsys)
    last = err.strip().splitlines()[-1]
    assert code == 2 and last.startswith("error: ") and f"shard {bad} as C4 JSON lines" in last, err


def test_prepare_command_for_the_synthetic_task_only_when_the_command_line_can_make_it():
    args = {"source": "bigram_backcopy", "vocab": 64, "triggers": 12, "alpha": 0.1, "doc_len": 256,
            "train_docs": 40_000, "val_docs": 200, "seed": 0}
    assert dataset.prepare_command(args, "d") == "python prepare_c4.py --source bigram_backcopy --val_docs 200 --out_dir d"
    assert dataset.prepare_command(dict(args, triggers=3), "d") is None      # made from Python: no such flag
    assert dataset.prepare_command({}, "d") is None


def test_prepare_command_for_the_pinned_corpus():
    pinned = {"source": "pinned", "subset": "cpu", "manifest_sha256": "x", "tokenizer": "gpt2", "tokenizer_sha256": "y"}
    assert dataset.prepare_command(pinned, "d") == "python prepare_c4.py --source pinned --subset cpu --out_dir d"
    assert dataset.prepare_command(dict(pinned, subset="archive", tokenizer="hf:m.gguf"), "d") == (
        "python prepare_c4.py --source pinned --subset archive --tokenizer hf:m.gguf --out_dir d")


def test_out_dir_that_is_a_file_is_refused_in_one_line(tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me")
    for out in (notes, notes / "data"):
        code, err = run_main(["--source", "bigram_backcopy", "--out_dir", str(out)], capsys)
        assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and "--out_dir" in err, err
    assert notes.read_text() == "keep me"


def test_rerun_prepares_a_split_whose_content_changed_again(shards, tmp_path, capsys):
    """A same-size edit is not 'already prepared': the sha256 is checked and only the changed split is rewritten."""
    out = tmp_path / "out"
    args = ["--data_files", str(shards), "--tokenizer", "bytes", "--out_dir", str(out), "--num_proc", "1"]
    prepare_c4.main(args)
    good, train_mtime = (out / "val.bin").read_bytes(), (out / "train.bin").stat().st_mtime_ns
    ids = np.frombuffer(good, dtype=np.uint16).copy()
    ids[:20] = ids[20:40]                                    # same size, other content
    (out / "val.bin").write_bytes(ids.tobytes())
    capsys.readouterr()
    prepare_c4.main(args)
    err = capsys.readouterr().err
    assert "the sha256 of val.bin differs from meta.json's" in err and "already prepared" not in err, err
    assert (out / "val.bin").read_bytes() == good and (out / "train.bin").stat().st_mtime_ns == train_mtime
    assert dataset.load_meta(out)["splits"]["val"]["sha256"] == sha256(out / "val.bin")
    prepare_c4.main(args)
    assert "already prepared" in capsys.readouterr().err


def test_a_source_shorter_than_asked_for_is_said_once(shards, tmp_path, capsys):
    out = tmp_path / "out"
    prepare_c4.main(["--data_files", str(shards), "--tokenizer", "bytes", "--val_docs", "10", "--train_tokens", "1e9",
                     "--out_dir", str(out), "--num_proc", "1"])
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith(f"warning: val: the source has only {len(VAL)} documents, fewer than the 10 asked for")
    assert warnings[1].startswith("warning: train: the source has only ") and "1,000,000,000 asked for" in warnings[1]
    assert dataset.load_meta(out)["splits"]["val"]["documents"] == len(VAL)


# ----------------------------------------------------------------------------- WikiText-2
# the raw files' layout (wikitext-2-raw-v1.zip): a space before and after every line's text, blank lines " "
WIKI_RAW = {
    "wiki.train.raw": [" ", " = Valkyria Chronicles III = ", " ", " Senjō no Valkyria 3 is a tactical role @-@ playing "
                       "game . ", " ", " = = Gameplay = = ", " ", " = = = Sub = = = ", " The game 's battle system , "
                       "the BliTZ system , is carried over . ", " ", " = X = ", " ", " One line . ", " "],
    "wiki.valid.raw": [" ", " = Homarus gammarus = ", " ", " Homarus gammarus is a lobster . ", " "],
    "wiki.test.raw": [" ", " = Robert Boulter = ", " ", " Robert Boulter is an English film , television and theatre "
                      "actor . ", " ", " = = Career = = ", " ", " In 2000 Boulter had a guest @-@ starring role . ", " ",
                      " = Du Fu = ", " ", " Du Fu ( 712 – 770 ) was a Chinese poet . ", " "],
}
# the articles, written out by hand: val is the test split
WIKI_TRAIN = ["= Valkyria Chronicles III =\nSenjō no Valkyria 3 is a tactical role @-@ playing game .\n= = Gameplay = =\n"
              "= = = Sub = = =\nThe game 's battle system , the BliTZ system , is carried over .", "= X =\nOne line ."]
WIKI_VAL = ["= Robert Boulter =\nRobert Boulter is an English film , television and theatre actor .\n= = Career = =\n"
            "In 2000 Boulter had a guest @-@ starring role .", "= Du Fu =\nDu Fu ( 712 – 770 ) was a Chinese poet ."]


@pytest.fixture
def wikitext(tmp_path):
    d = tmp_path / "wikitext-2-raw"
    d.mkdir()
    for name, lines in WIKI_RAW.items():
        (d / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return d


def test_wikitext2_from_the_raw_files_one_document_per_article(wikitext, tmp_path, capsys):
    out = tmp_path / "wt2"
    prepare_c4.main(["--source", "wikitext2", "--wikitext_dir", str(wikitext), "--tokenizer", "bytes",
                     "--out_dir", str(out), "--num_proc", "1"])
    meta = dataset.load_meta(out)
    assert [bytes(x).decode() for x in read_docs(out, "train", 256)] == WIKI_TRAIN
    assert [bytes(x).decode() for x in read_docs(out, "val", 256)] == WIKI_VAL
    assert meta["args"] == {"source": "wikitext2", "wikitext_dir": str(wikitext), "tokenizer": "bytes",
                            "tokenizer_sha256": None, "train_tokens": None, "val_docs": None}
    assert meta["stand_in_for_c4"] is False and "wiki.test.raw, the TEST split" in meta["description"]
    assert meta["source"] == f"WikiText-2 raw files in {wikitext}"
    assert meta["splits"]["val"]["documents"] == 2 and meta["splits"]["train"]["documents"] == 2
    prepare_c4.main(["--source", "wikitext2", "--wikitext_dir", str(wikitext), "--tokenizer", "bytes",
                     "--out_dir", str(out)])
    assert "already prepared" in capsys.readouterr().err
    # the hint after damage is the command that made it, and running it repairs the folder
    good = (out / "train.bin").read_bytes()
    (out / "train.bin").write_bytes(good[:-1])
    with pytest.raises(ValueError) as e:
        dataset.load_meta(out)
    command = str(e.value).split("prepare it again: ")[1]
    assert command == f"python prepare_c4.py --source wikitext2 --wikitext_dir {wikitext} --tokenizer bytes --out_dir {out}"
    import shlex
    prepare_c4.main(shlex.split(command)[2:])
    assert (out / "train.bin").read_bytes() == good


def test_wikitext2_from_the_hub_gives_the_same_data(wikitext, tmp_path, monkeypatch):
    """The hub's wikitext-2-raw-v1 has one row per line of the raw file: the line with its newline, or '' for a
    blank one (its loading script's convention); the prepared splits equal those of the files."""
    import datasets
    calls = []

    def fake_load(path, name=None, split=None, **kw):
        calls.append((path, name, split))
        raw = {"train": "wiki.train.raw", "validation": "wiki.valid.raw", "test": "wiki.test.raw"}[split]
        lines = (wikitext / raw).read_text(encoding="utf-8").splitlines(keepends=True)
        return [{"text": line if line.strip() else ""} for line in lines]

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    hub = dataset.load_meta(dataset.prepare_wikitext2(tmp_path / "hub", "bytes"))
    assert sorted(calls) == [("Salesforce/wikitext", "wikitext-2-raw-v1", "test"),
                             ("Salesforce/wikitext", "wikitext-2-raw-v1", "train")]
    assert hub["args"]["wikitext_dir"] is None and "hub" in hub["source"]
    local = dataset.load_meta(dataset.prepare_wikitext2(tmp_path / "local", "bytes", str(wikitext)))
    assert hub["splits"] == local["splits"]


def test_wikitext2_errors_are_one_line(wikitext, tmp_path, monkeypatch, capsys):
    import datasets

    def offline(*a, **kw):
        raise ConnectionError("Couldn't reach 'Salesforce/wikitext' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    code, err = run_main(["--source", "wikitext2", "--tokenizer", "bytes", "--out_dir", str(tmp_path / "o")], capsys)
    assert code == 2 and err.count("\n") == 1 and "--wikitext_dir" in err and "cannot load wikitext-2-raw-v1" in err
    (wikitext / "wiki.test.raw").unlink()
    code, err = run_main(["--source", "wikitext2", "--wikitext_dir", str(wikitext), "--tokenizer", "bytes",
                          "--out_dir", str(tmp_path / "p")], capsys)
    assert code == 2 and err.count("\n") == 1 and "no wiki.test.raw in it" in err and not (tmp_path / "p").exists()
    code, err = run_main(["--wikitext_dir", str(wikitext), "--out_dir", str(tmp_path / "q")], capsys)
    assert code == 2 and "--wikitext_dir is for --source wikitext2" in err


def test_analyze_and_eval_quant_report_wikitext2_perplexity(wikitext, tmp_path, capsys):
    """--data on a WikiText-2 folder: both scripts' perplexity against a direct computation with the model's forward
    over every test article, truncated to the block size."""
    import torch
    import torch.nn.functional as F
    import analyze
    import eval_quant
    from model import GPT, GPTConfig
    data = dataset.prepare_wikitext2(tmp_path / "wt2", "bytes", str(wikitext))
    meta = dataset.load_meta(data)
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=48, vocab_size=meta["vocab_size"])
    model = GPT(cfg).eval()
    ckpt = tmp_path / "ckpt.pt"
    torch.save({"model": model.state_dict(), "model_args": cfg.__dict__.copy(), "iter_num": 0, "config": {},
                "tokenizer": meta["tokenizer_info"]}, ckpt)
    nll, count = 0.0, 0
    with torch.no_grad():
        for text in WIKI_VAL:
            ids = torch.tensor(list(text.encode("utf-8"))[:cfg.block_size])
            logits = model(ids[None])[0][0]
            nll += float(F.cross_entropy(logits[:-1], ids[1:], reduction="sum"))
            count += len(ids) - 1
    expected = np.exp(nll / count)
    analyze.main(["--ckpt", str(ckpt), "--data", str(data), "--max_docs", "0", "--json", str(tmp_path / "a.json")])
    got = json.loads((tmp_path / "a.json").read_text())
    assert got["data"]["predicted_tokens"] == count and got["ppl"] == pytest.approx(expected, rel=1e-5)
    eval_quant.main(["--ckpt", str(ckpt), "--data", str(data), "--max_docs", "0", "--schemes", "fine",
                     "--json", str(tmp_path / "q.json")])
    full = json.loads((tmp_path / "q.json").read_text())["models"][0]["ppl"]["full"]
    assert full == pytest.approx(expected, rel=1e-5)
    # data in another model's vocabulary: analyze.py's hint prepares WikiText-2 again, from the same files
    other = runs.LoadedModel("org/model", model, "hf", None, 16, 300, {})
    assert measure.prepare_command(other, meta, str(data)).startswith(
        f"python prepare_c4.py --source wikitext2 --wikitext_dir {wikitext} --tokenizer hf:org/model --out_dir {data}_")


@pytest.mark.parametrize('force', [False, True])
def test_a_folder_of_someone_elses_token_files_is_not_overwritten(tmp_path, force):
    """Issue 36's rule, for prepare_c4.py: train.bin / val.bin with no meta.json or .progress.json of a preparation
    are not ours, --force or not: one line, and the files stay."""
    out = tmp_path / 'mine'
    out.mkdir()
    (out / 'train.bin').write_bytes(b'my tokens')
    with pytest.raises(dataset.PrepareError, match=r"holds train\.bin but no meta\.json or \.progress\.json"):
        dataset.prepare_bigram_backcopy(out, vocab=32, triggers=3, doc_len=40, train_docs=30, val_docs=7, force=force)
    assert (out / 'train.bin').read_bytes() == b'my tokens' and sorted(p.name for p in out.iterdir()) == ['train.bin']


def test_a_temporary_name_that_is_a_link_is_not_written_through(shards, tmp_path):
    """Data lost, case 2: val.bin.tmp in a new --out_dir, a link to a user's file, got the tokens (and was renamed
    onto val.bin). Now the splits go to new names: the user's file and the link stay, val.bin is a file of its own."""
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "mine.txt").write_text("my notes")
    (out / "val.bin.tmp").symlink_to(tmp_path / "mine.txt")
    prepare_c4.main(["--data_files", str(shards), "--tokenizer", "bytes", "--out_dir", str(out), "--num_proc", "1"])
    assert (tmp_path / "mine.txt").read_text() == "my notes" and (out / "val.bin.tmp").is_symlink()
    assert not (out / "val.bin").is_symlink() and [bytes(d).decode() for d in read_docs(out, "val", 256)] == VAL
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "train.bin", "val.bin", "val.bin.tmp"]


@pytest.mark.parametrize("argv, said", [
    (["--source", "pinned", "--out_dir", ""], "argument --out_dir: an empty path is not allowed"),   # silent-wrong 5
    (["--source", "bigram_backcopy", "--out_dir", ""], "argument --out_dir: an empty path is not allowed"),
    (["--source", "wikitext2", "--wikitext_dir", ""], "argument --wikitext_dir: an empty path is not allowed"),
    (["--source", "bigram_backcopy", "--val_docs", "1e400"], "argument --val_docs: 1e400 is not allowed"),   # case 10
    (["--source", "bigram_backcopy", "--val_docs", "2.5"], "argument --val_docs: '2.5' is not an integer"),
    (["--source", "bigram_backcopy", "--out_dir", "x" * 300], "is 300 bytes, longer than this filesystem allows"),
])
def test_an_empty_path_a_name_too_long_and_an_infinite_count_are_one_line(tmp_path, monkeypatch, capsys, argv, said):
    """An unset shell variable (--out_dir "") quietly prepared the default folder; --val_docs 1e400 was an
    OverflowError, a 300-character --out_dir an OSError. Now each is one error line, exit 2, and nothing is made."""
    monkeypatch.chdir(tmp_path)
    code, err = run_main(argv, capsys)
    last = err.strip().splitlines()[-1]
    assert code == 2 and said in last and "Traceback" not in err, err
    assert [line for line in err.splitlines() if "error:" in line] == [last]
    assert os.listdir(tmp_path) == []
