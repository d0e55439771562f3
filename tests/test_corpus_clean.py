"""The pinned corpus's cleaning and split (pinned_corpus/clean.py) on hand-made documents: duplicates and near duplicates,
page furniture, the length cut, the split by unit and the order of val, each against results worked out by hand."""
import hashlib

import numpy as np
import pytest

from pinned_corpus import clean as corpus_clean

WORDS = [f"w{chr(97 + i // 26)}{chr(97 + i % 26)}" for i in range(26 * 26)]   # 676 distinct letter-only words


def text(first, n):
    return " ".join(WORDS[first:first + n])


def test_deduplicate_drops_copies_and_repeated_long_paragraphs():
    long_a, long_b, long_c = ("Alpha " * 20).strip(), ("Beta " * 20).strip(), ("Gamma " * 40).strip()
    short = "Examples"
    docs = [("s:1", f"{long_a}\n\n{short}\n\n{long_b}"),
            ("s:2", f"{long_a}\n\n{short}\n\n{long_b}"),          # exact copy: dropped
            ("s:3", f"{long_a}\n\n{long_b}\n\nshort new"),       # mostly copied: dropped
            ("s:4", f"{long_c}\n\n{short}\n\n{long_a}"),          # long_a repeated: that paragraph goes
            ("s:5", "tiny")]                                      # under MIN_CHARS
    assert list(corpus_clean.deduplicate(iter(docs))) == [docs[0], ("s:4", f"{long_c}\n\n{short}")]


@pytest.mark.parametrize("n_files", [10, 11])
def test_paragraphs_on_most_pages_of_a_source_are_boilerplate(n_files):
    texts = [(f"p{i}", f"Navigation\n\nPage {i} says {i * 'x'}.\n\nNext") for i in range(n_files)]
    texts[0] = ("p0", "Only this.")
    cleaned = corpus_clean.drop_boilerplate(texts)
    if n_files - 1 < corpus_clean.BOILER_MIN:   # "Navigation" in 9 files: kept
        assert cleaned == texts
    else:   # in 10 of 11 files: dropped
        assert cleaned == [("p0", "Only this.")] + [(f"p{i}", f"Page {i} says {i * 'x'}.") for i in range(1, n_files)]


def test_long_texts_are_cut_between_paragraphs_then_lines_sentences_and_words():
    # a paragraph longer than the limit with no line, sentence or space to cut at is cut anywhere; its tail goes on
    assert corpus_clean.pieces("aaaa\n\nbbbb\n\ncccccccccccccc\n\nd", 10) == ["aaaa\n\nbbbb", "cccccccccc", "cccc\n\nd"]
    # no blank line: an address of one-line paragraphs is cut at its lines, a long line at sentences, then words
    speech = "First line here.\nSecond line is this.\nA third."
    assert corpus_clean.pieces(speech, 25) == ["First line here.", "Second line is this.", "A third."]
    assert corpus_clean.pieces("One two. Three four five. Six.", 16) == ["One two.", "Three four five.", "Six."]
    assert corpus_clean.pieces("alpha beta gamma delta", 11) == ["alpha beta", "gamma delta"]
    long_text = "\n".join("Sentence number %d is here." % i for i in range(5000))
    assert max(len(p) for p in corpus_clean.pieces(long_text)) <= corpus_clean.MAX_CHARS
    assert "\n".join(corpus_clean.pieces(long_text)) == long_text   # cut at line breaks only: nothing lost


def test_near_duplicates_survive_line_numbers():
    poem = "\n".join(" ".join(WORDS[k * 8:k * 8 + 8]) for k in range(40))             # 320 words, 40 lines
    numbered = "\n".join(f"{' '.join(WORDS[k * 8:k * 8 + 8])}   {k + 1}" for k in range(40))
    notes = text(400, 100)
    docs = [poem, numbered + "\n\n" + notes, text(320, 200), poem[:200]]
    grams = [corpus_clean.gram_hashes(t) for t in docs]
    # 2nd: 308 of its 408 13-grams are the poem's (75%), dropped; 3rd shares none; 4th (33 words) is all seen
    assert corpus_clean.near_duplicates(grams) == {1, 3}


def test_a_unit_is_a_file_unless_the_format_is_a_collection():
    assert corpus_clean.unit_of("milton:comus.txt#part3", "text") == "milton:comus.txt"
    assert corpus_clean.unit_of("kjv:kjv.jsonl#Ruth 1", "kjv_jsonl") == "kjv:kjv.jsonl#Ruth 1"
    assert corpus_clean.unit_of("gcide:gcide.dict.dz#part41", "dictd") == "gcide:gcide.dict.dz#part41"


def test_shared_shares_count_13grams_held_by_another_unit():
    grams = [corpus_clean.gram_hashes(t) for t in (text(0, 30), text(10, 30), text(0, 20), text(100, 20))]
    # units: docs 0 and 2 are one unit (their shared 13-grams do not count), 1 another, 3 a third
    share = corpus_clean.shared_shares(grams, np.array([0, 1, 0, 2]))
    # unit 0: 18 + 8 positions, of which words 10..29 (8 in doc 0) and 10..19 (none of doc 2's 8 reach 10..22) ...
    g0 = set(grams[0].tolist()) | set(grams[2].tolist())
    g1 = set(grams[1].tolist())
    expected0 = (sum(h in g1 for h in grams[0].tolist()) + sum(h in g1 for h in grams[2].tolist())) / 26
    assert share.tolist() == [expected0, sum(h in g0 for h in grams[1].tolist()) / 18, 0.0]
    assert share[0] == 8 / 26 and share[1] == 8 / 18


def test_val_takes_whole_eligible_units_near_its_share_of_each_source(monkeypatch):
    monkeypatch.setattr(corpus_clean, "VAL_SHARE", 0.25)
    units = [("a", f"a:{i}", 100) for i in range(8)] + [("b", "b:big", 300), ("b", "b:x", 50), ("b", "b:y", 50)]
    order = sorted(range(8), key=lambda i: hashlib.sha256(f"a:{i}".encode()).digest())
    eligible = {u for _, u, _ in units} - {f"a:{order[0]}"}
    val = corpus_clean.choose_val(units, eligible)
    # a: target 200 characters: the first two eligible units by hash; b: target 100: b:big (300) would pass it
    assert val == {f"a:{order[1]}", f"a:{order[2]}", "b:x", "b:y"}


def test_val_order_keeps_every_prefix_in_proportion():
    val = [("a", f"a{i}") for i in range(90)] + [("b", f"b{i}") for i in range(10)]
    sizes = [10] * 90 + [36] * 10
    order = corpus_clean.val_order(val, sizes, {"a": 3.0, "b": 1.0})   # train shares 3 : 1
    a_order = sorted(range(90), key=lambda i: hashlib.sha256(f"a{i}".encode()).digest())
    assert [i for i in order if i < 90] == a_order           # documents of one size: sha256 order
    # the largest gap after each step, over the total so far: an a (10 tokens) leaves 2.5/10, 5/20, 7.5/30, 10/40,
    # 12.5/50 = 0.25; the b (36) instead leaves 27/36, 24.5/46, 22/56, 19.5/66, 17/76 = 0.22: b comes fifth
    assert [val[i][0] for i in order[:5]] == ["a", "a", "a", "a", "b"]
    have = {"a": 0, "b": 0}
    for i in order:
        have[val[i][0]] += sizes[i]
        total = have["a"] + have["b"]
        if have["b"] < 360 and total >= 40:   # while b lasts: never a whole document of b off
            assert abs(have["a"] - 0.75 * total) <= 36
