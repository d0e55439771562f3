"""pinned_corpus/audit.py and pinned_corpus/clean.py's 13-grams on hand-made documents, each with the numbers worked out by hand."""
import numpy as np

from pinned_corpus import audit as corpus_audit, clean as corpus_clean

WORDS = [f"w{chr(97 + i // 26)}{chr(97 + i % 26)}" for i in range(26 * 26)]   # 676 distinct letter-only words


def text(first, n):
    return " ".join(WORDS[first:first + n])


def test_word_13grams_ignore_case_numbers_and_punctuation():
    plain = "One two three four five six seven eight nine ten eleven twelve thirteen fourteen."
    numbered = "1 one, two three four five six seven eight nine TEN eleven\n12 twelve thirteen -- fourteen 14"
    assert len(corpus_clean.gram_hashes(plain)) == 2            # 14 words: two 13-grams
    assert np.array_equal(corpus_clean.gram_hashes(plain), corpus_clean.gram_hashes(numbered))
    assert len(corpus_clean.gram_hashes("only twelve words " * 4)) == 0
    assert corpus_clean.gram_hashes(text(0, 20))[0] != corpus_clean.gram_hashes(text(1, 20))[0]


def test_shares_count_tokens_with_separators_and_the_first_eval_tokens_of_val():
    docs = [("a:1", "train", ""), ("b:1", "train", ""), ("b:2", "val", ""), ("a:2", "val", ""), ("b:3", "val", "")]
    tokens = [99, 299, 59, 39, 9]          # + 1 eot each: train a 100, b 300; val b 60, a 40, b 10
    assert corpus_audit.shares(docs, tokens, eval_tokens=80) == {
        "a": {"train": 100, "val": 40, "eval": 20}, "b": {"train": 300, "val": 70, "eval": 60}}


def test_leakage_and_repetition_of_13grams():
    train = text(0, 30)                       # 18 13-grams
    val = text(10, 20) + " " + text(100, 20)  # 40 words, 28 13-grams: words 10..29 hold 8 of train's
    stats = corpus_audit.ngram_stats([("a:1", "train", train), ("a:2", "val", val), ("b:1", "val", text(10, 14))])
    assert stats["val_positions"] == 28 + 2 and stats["val_in_train"] == 8 + 2
    assert stats["val_covered"] == ["b:1"]     # 2 of 2 in train: over 80%
    assert stats["positions"] == 18 + 28 + 2 and stats["repeated"] == 10


def test_near_duplicate_pairs_are_counted_across_sources_only():
    poem = text(0, 400)
    numbered = "\n".join(f"{k + 1:4d}  {' '.join(WORDS[k * 10:k * 10 + 10])}" for k in range(40))  # the same, line-numbered
    docs = [("milton:allegro.txt", "train", poem), ("other:comus.txt", "val", numbered + " " + text(400, 200)),
            ("milton:copy.txt", "train", poem), ("third:x", "train", text(600, 76))]
    pairs = corpus_audit.near_pairs(docs, [corpus_clean.gram_hashes(t) for _, _, t in docs])
    # the numbered copy holds all of poem's 13-grams (it is the smaller doc of each pair); the two milton documents
    # are one source, so that pair is not counted; third:x shares nothing
    assert [(a, b) for a, b, _ in pairs] == [("milton:allegro.txt", "other:comus.txt"), ("other:comus.txt", "milton:copy.txt")]
    assert all(c == 1.0 for *_, c in pairs)


def test_markup_counts_and_bare_identifiers():
    doc = ("See :ref:`the docs` and ``code`` here \\ and \\alpha.\n\n### START: ED4A800_0.tif.txt ###\np.772:0\n\n"
           "~mickle~ (A.S. _micel_) great.\n\nPutObjectRequest\n\nbucket_name\n\nExamples\n\nnumpy.linalg.norm")
    a = corpus_audit.audit([("s:1", "train", doc), ("t:1", "val", "plain words " * 10)], [40, 60], 10, 150, [0, 0])
    assert a["markup"] == {"backticks": {"s": 6}, ":role:": {"s": 1}, "backslashes": {"s": 2},
                           "LaTeX commands": {"s": 1}, "OCR markers": {"s": 3}, "~word~ / _word_": {"s": 2}}
    assert a["bare_identifiers"] == {"s": 3}   # PutObjectRequest, bucket_name, numpy.linalg.norm; not "Examples"
    assert a["bare_identifier_chars"] == {"s": len("PutObjectRequest") + len("bucket_name") + len("numpy.linalg.norm")}
    assert a["longest"] == ("s:1", len(doc)) and a["over_cap"] == 1
    report = corpus_audit.report(a)
    assert "largest gap to the train share: s -100.0%" in report    # s has all of train, none of the slice
    assert "OCR markers: 3 (s 3)" in report and "bare-identifier paragraphs: 3," in report


def test_whitespace_runs_and_indented_lines_per_split():
    blank = np.array([False, True, True, False])   # ids 1 and 2 are whitespace only
    #      run of 3 (not counted)   run of 5           run of 4 at the end
    ids = [0, 1, 2, 1, 0,           2, 2, 1, 1, 2, 3,  1, 1, 2, 1]
    assert corpus_audit.whitespace_run_tokens(ids, blank) == 5 + 4
    assert corpus_audit.whitespace_run_tokens([1, 1, 1, 1], blank) == 4
    assert corpus_audit.whitespace_run_tokens([], blank) == 0
    pieces = {0: "a", 1: " ", 2: "\n\t ", 3: " b", 4: "<|endoftext|>"}
    assert corpus_audit.whitespace_ids(lambda ids: pieces[ids[0]], 5).tolist() == [False, True, True, False, False]
    docs = [("s:1", "train", "a\n" + " " * 20 + "b\n" + " " * 19 + "c"), ("s:2", "val", (" " * 24 + "x\n") * 2 + "y")]
    a = corpus_audit.audit(docs, [9, 4], 10, 1000, [0, 3])
    assert a["whitespace"] == {"train": {"run_tokens": 0, "indented_lines": 1},
                               "val": {"run_tokens": 3, "indented_lines": 2}}
    # shares of the split files' tokens, separators included: train 9 + 1, val 4 + 1
    assert corpus_audit.report(a).endswith("tokens in runs of >= 4 whitespace-only tokens: train 0 of 10 (0.00%), "
                                           "val 3 of 5 (60.00%); lines indented >= 20 spaces: train 1, val 2")
