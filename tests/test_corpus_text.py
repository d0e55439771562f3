"""The pinned corpus's markup readers (pinned_corpus/text.py), each on a hand-written input against the text expected from it."""
import gzip
import json

import pytest

from pinned_corpus import text as corpus_text


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
    assert corpus_text.normalise(corpus_text.plain_to_text(text)) == "Sing, O goddess.\nThe wrath."


def test_plain_text_lines_are_flush_left_with_their_line_breaks_kept():
    # a verse line shared by two speakers is indented to where the first half ended (The Winter's Tale, Gutenberg)
    play = ("LEONTES.\n                You have mistook, my lady,\nPolixenes for Leontes: O thou thing,\n\n"
            "HERMIONE.\n \t                         No, by my life,\n      \nPrivy to none of this.\n"
            "\u00a0\u3000Kept: a no-break and an ideographic space are neither a space nor a tab\n")
    flush = ("LEONTES.\nYou have mistook, my lady,\nPolixenes for Leontes: O thou thing,\n\n"
             "HERMIONE.\nNo, by my life,\n\nPrivy to none of this.\n"
             "\u00a0\u3000Kept: a no-break and an ideographic space are neither a space nor a tab\n")
    assert corpus_text.plain_to_text(play) == flush
    assert corpus_text.member_documents("wt.txt", play.encode(), "text") == [("wt.txt", flush)]


@pytest.mark.parametrize('fmt', ['text', 'json_chapter'])
@pytest.mark.parametrize('raw, lines', [
    ('a\r      b\r   c', 'a\nb\nc'),                      # old Mac line ends: each line's indentation is one
    ('a\r\n   b\r\n\tc', 'a\nb\nc'),                    # Windows'
    ('a\n\x0c    b\n\x0b  c', 'a\nb\nc'),                # a page break (form feed, vertical tab) before a line
    ('a\n  \x0c  b', 'a\nb'),
])
def test_line_ends_and_page_breaks_do_not_keep_an_indentation(fmt, raw, lines):
    """flush_left ran before \\r became a line break (normalise does that, after the readers) and kept the spaces
    after a form feed or vertical tab (normalise deletes those characters and left the spaces): such plain text kept
    its indentation. The lines by hand: every one flush left."""
    data = raw if fmt == 'text' else json.dumps({'title': 'T', 'text': raw})
    [(_, text)] = corpus_text.member_documents('x.txt', data.encode(), fmt)
    assert corpus_text.normalise(text) == (lines if fmt == 'text' else 'T\n\n' + lines)


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
    song = json.dumps({"title": "Midnight.", "text": "They sing.\n     Farewell and adieu,\n\t  ye ladies!"}).encode()
    assert corpus_text.member_documents("c40.json", song, "json_chapter") == [
        ("c40.json", "Midnight.\n\nThey sing.\nFarewell and adieu,\nye ladies!")]


def test_api_descriptions_keep_their_documentation_strings_under_their_names():
    service = {"version": "2.0", "metadata": {"endpointPrefix": "s3"},
               "documentation": "<p>Stores <code>objects</code> in buckets.</p>",
               "operations": {"PutObject": {"http": {"method": "PUT"}, "documentation":
                                            "<p>Adds an object to a bucket.</p><ul><li><p>Never partial.</p></li></ul>"}},
               "shapes": {"Key": {"type": "string", "enum": ["a"], "documentation": "<p>The name of the object.</p>"}}}
    assert corpus_text.member_documents("s3/service-2.json", json.dumps(service).encode(), "json_docs") == [
        ("s3/service-2.json", "Stores objects in buckets.\n\nPutObject: Adds an object to a bucket.\n\n"
                              "Never partial.\n\nKey: The name of the object.")]
    discovery = {"description": "Manages sites.", "resources": {"sites": {"methods": {"get": {
        "description": "Gets a site, e.g. `sites/x`, with its `FieldMask`.", "parameters": {
            "name": {"type": "string", "description": "Required. The site's **name**."}}}}}}}
    assert corpus_text.json_docs(json.dumps(discovery)) == ("Manages sites.\n\nget: Gets a site, e.g. sites/x, with its "
                                                            "FieldMask.\n\nname: Required. The site's name.")


def test_jsii_assembly_gives_readmes_and_api_summaries_without_examples():
    readme = ("# Buckets\n\nA [bucket](https://x/y) holds **objects**\nof any size.\n\n```ts\nnew Bucket(this, 'B');\n```\n\n"
              "Use `grantRead` to share it, or ``grant(`read`)``.")
    assembly = {"readme": {"markdown": readme},
                "types": {"lib.Bucket": {"name": "Bucket", "docs": {"summary": "An S3 bucket.", "example": "new Bucket()",
                                                                   "remarks": "Buckets are\n`regional`."},
                                         "properties": [{"name": "bucketName", "docs": {"default": "- generated",
                                                                                        "summary": "The bucket's name."}}]}}}
    assert corpus_text.member_documents(".jsii", json.dumps(assembly).encode(), "jsii") == [
        (".jsii", "Buckets\n\nA bucket holds objects of any size.\n\nUse grantRead to share it, or grant(`read`).\n\n"
                  "Bucket: An S3 bucket.\n\nBuckets are regional.\n\nbucketName: The bucket's name.")]


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


def test_rst_references_escapes_and_roles_wrapped_across_lines():
    rst = """\
Bibliographic data, i.e. the `\\<docinfo>`_ element's content, inserts the fields before
\\<authors>, \\<status> and \\<date>. The ForeignKey\\ s and Field\\s stay, as ``C:\\path`` does.

See :ref:`the documentation on ModelAdmin methods
<model-admin-methods>` and :doc:`Supported
Databases </ref/databases>`; we support MariaDB_, MySQL_ and `Oracle`_, `default role` text,
an anonymous `link`__ and :math:`\\alpha \\leq 2`.
"""
    assert corpus_text.rst_to_text(rst) == (
        "Bibliographic data, i.e. the <docinfo> element's content, inserts the fields before <authors>, <status> and "
        "<date>. The ForeignKeys and Fields stay, as C:\\path does.\n\n"
        "See the documentation on ModelAdmin methods and Supported Databases; we support MariaDB, MySQL and Oracle, "
        "default role text, an anonymous link and α ≤ 2.")


def test_latex_formulas_become_plain_text_and_displayed_ones_go():
    assert corpus_text.latex_to_text(r"\frac{4\pi A}{p^2} \leq \mathbf{x}_i \,\text{for}\, \Sigma^{-1}") == \
        "(4π A)/(p^2) ≤ x_i for Σ^-1"
    assert corpus_text.latex_to_text(r"\log\left(\sum_{k} x_k\right)") == "log (∑_k x_k)"
    html = ('<p>We invert a <span class="math">\\(2 \\times 2\\)</span> matrix:</p>'
            '<div class="math">\\[A^{-1} = \\frac{1}{\\det A}\\]</div><p>for \\(\\det A \\neq 0\\) only.</p>')
    assert corpus_text.html_to_text(html) == "We invert a 2 × 2 matrix:\n\nfor det A ≠ 0 only."
    unrendered = "<p>Pass it to :pq:`PQexecParams()` as in :an:`1`, for ``meson`` builds.</p>"
    assert corpus_text.html_to_text(unrendered) == "Pass it to PQexecParams() as in 1, for meson builds."


def test_gutenberg_emphasis_marks_go():
    notes = "NOTES.\n\n31. ~mickle~ (A.S. _micel_) great. From this word comes _much_.\n  snake_case_name stays"
    assert corpus_text.plain_to_text(notes) == ("NOTES.\n\n31. mickle (A.S. micel) great. From this word comes much.\n"
                                                "snake_case_name stays")


def test_a_page_scan_transcription_loses_its_markers_urls_heads_and_noise():
    scan = ("## Shakespeare's Entry in the Encyclopaedia Britannica\n\n### START: ED4A800_0.tif.txt ###\n"
            "#### Source: http://upload.example.org/scans/EB1911_tiff/ED4A800.TIF \n\np.772:0\n\n"
            "Shakespeare, William (1564-1616), English poet, player\nand playwright, was baptized in 1564.\n"
            "SHAKE\nSPEARE 7 8 5\n[[ed: TODO italicising]]\n"
            "Dy xg i L}; ;XL18°7”fga7 Y. EfkP.ccvc.¢1,;\n¤ ‘-_, T T   T\n### END: ED4A800_0.tif.txt ###\n\n"
            "[Youth] His father, John, was a burgess\nof Stratford.\n")
    assert corpus_text.normalise(corpus_text.plain_to_text(scan)) == (
        "Shakespeare's Entry in the Encyclopaedia Britannica\n\n"
        "Shakespeare, William (1564-1616), English poet, player and playwright, was baptized in 1564.\n\n"
        "[Youth] His father, John, was a burgess of Stratford.")
    verse = "FIRST GENTLEMAN.\nAy, my good lord.\n"   # capitals are a speaker there, not a running head
    assert corpus_text.plain_to_text(verse) == verse


def test_bare_names_are_joined_to_what_they_name():
    text = ("add_compile_definitions\n\nAdds preprocessor definitions.\n\nExamples\n\nSee below.\n\n"
            "https://example.com/a\n\nfirst.name\n\nsecond_name:\n\nThe second one.\n\ntrailing_name")
    assert corpus_text.attach_names(text) == ("add_compile_definitions: Adds preprocessor definitions.\n\nExamples\n\n"
                                              "See below.\n\nsecond_name: The second one.")
