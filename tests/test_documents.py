"""seqtool.documents: sentences, placeholders, spans placed by an alignment, and
plain text, HTML and Markdown documents that come back byte for byte around their translated text."""

import dataclasses
import re
import sys
from html.parser import HTMLParser

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from seqtool import documents
from seqtool.documents import markdown as markdown_reader, sentences
from seqtool.documents import (Aligned, join_aligned, looks_like_several_sentences, parse, parse_html, parse_markdown,
                               parse_text, place_spans, protect, render_unit, span_words, split_sentences)
from seqtool.errors import ConfigError
from seqtool.documents import Span, Unit, placeholders

pytestmark = pytest.mark.unit  # in-process, the documents package alone (its no-model-code promise: test_imports)

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def texts(pieces, max_size: int):
    """Strings made of these pieces (characters or longer)."""
    return st.lists(st.sampled_from(pieces), max_size=max_size).map("".join)


def one_line_paragraphs(doc) -> str:
    """The Markdown document with its soft line breaks as spaces: what a translation of it keeps (each
    paragraph one line), the identity otherwise."""
    return doc.render([(u.text, [dataclasses.replace(s, open="", replaces_space=False) if s.kind == "soft" else s for s in u.spans])
                       for u in doc.units])


def spaces_added(got: str, target: str) -> bool:
    """Whether got is target with spaces put in (placement keeps markup apart from words: nothing else changes)."""
    k = 0
    for char in got:
        if k < len(target) and char == target[k]:
            k += 1
        elif char != " ":
            return False
    return k == len(target)


def words(text: str) -> list[tuple[int, int]]:
    """Word and punctuation tokens' ranges (what a tokenizer's offsets give, at word level)."""
    return [m.span() for m in re.finditer(r"\w+|[^\w\s]", text)]


def identity_by_alignment(doc):
    """Each unit 'translated' into itself, its spans placed through place_spans with the identity alignment
    (tokens: words, cut where a span starts or ends, as subword pieces may be)."""
    out = []
    for unit in doc.units:
        cuts = sorted({0, len(unit.text)} | {p for s in unit.spans for p in (s.start, s.end)})
        tokens = [(max(a, c), min(b, d)) for a, b in words(unit.text) for c, d in zip(cuts, cuts[1:]) if max(a, c) < min(b, d)]
        out.append((unit.text, place_spans(unit, unit.text, [(i, i) for i in range(len(tokens))], tokens, tokens)))
    return out


def splits_a_word(doc) -> bool:
    """Whether a span of some unit starts or ends inside a word."""
    def inside(text, p):
        return 0 < p < len(text) and text[p - 1].isalnum() and text[p].isalnum()
    return any(s.start < s.end and (inside(u.text, s.start) or inside(u.text, s.end)) for u in doc.units for s in u.spans)


def reversed_words(doc):
    """Each unit 'translated' by writing its words in reverse order, the alignment saying so."""
    out = []
    for unit in doc.units:
        tokens = words(unit.text)
        pieces = [unit.text[a:b] for a, b in reversed(tokens)]
        target, ranges = "", []
        for piece in pieces:
            target += " " if target else ""
            ranges.append((len(target), len(target) + len(piece)))
            target += piece
        alignment = [(len(tokens) - 1 - j, j) for j in range(len(tokens))]
        out.append((target, place_spans(unit, target, alignment, tokens, ranges)))
    return out


# ---------------------------------------------------------------------------------------------
# sentences


@pytest.mark.parametrize("text, lang, expected", [
    ("Hola Sr. García. ¿Qué tal? ¡Bien!", "es", ["Hola Sr. García.", "¿Qué tal?", "¡Bien!"]),
    ("Das ist z. B. gut. Aber nicht immer.", "de", ["Das ist z. B. gut.", "Aber nicht immer."]),
    ("Mr. Smith went to Washington. He said “Yes.” Then left.", "en",
     ["Mr. Smith went to Washington.", "He said “Yes.”", "Then left."]),
    ("One sentence only", "en", ["One sentence only"]),
    ("Unknown language. Still split.", "xx", ["Unknown language.", "Still split."]),
    ("Regional code. Works too.", "pt-BR", ["Regional code.", "Works too."]),
])
def test_split_sentences_finds_the_sentences(text, lang, expected):
    assert [s for s, _ in split_sentences(text, lang)] == expected


def test_split_sentences_keeps_every_whitespace_character():
    text = "  \tFirst one.\n\n  Second one?  Third!\u2028 "
    pieces = split_sentences(text, "en")
    assert pieces == [("", "  \t"), ("First one.", "\n\n  "), ("Second one?", "  "), ("Third!", "\u2028 ")]
    assert split_sentences("", "en") == []
    assert split_sentences("   ", "en") == [("", "   ")]


@FAST
@given(text=texts((list("ab Cé.?!\n\t«»“”¿") + ["Mr.", "\u2028", "\xa0", "。"]), max_size=60),
       mode=st.sampled_from(["always", "auto", "never"]))
def test_split_sentences_pieces_join_to_the_text(text, mode):
    pieces = split_sentences(text, "en", mode)
    assert "".join(s + ws for s, ws in pieces) == text
    assert all(s == s.strip() and not ws.strip() for s, ws in pieces)
    assert all(s for s, _ in pieces[1:])  # only a first piece may be ("", leading whitespace)
    if mode == "never" or not looks_like_several_sentences(text, "en"):
        assert len([s for s, _ in pieces if s]) <= 1


def test_split_modes_and_their_errors(monkeypatch):
    assert split_sentences("A b. C d.", "en", "never") == [("A b. C d.", "")]
    assert split_sentences("A b. C d.", "en", "auto") == [("A b.", " "), ("C d.", "")]
    with pytest.raises(ConfigError, match="auto, always, never"):
        split_sentences("x", "en", "sometimes")
    monkeypatch.setitem(sys.modules, "sentence_splitter", None)  # as if it were not installed
    sentences._splitter.cache_clear()
    try:
        assert not documents.splitter_available()
        assert split_sentences("A b. C d.", "en", "auto") == [("A b. C d.", "")]  # auto never fails
        with pytest.raises(ConfigError, match=r"pip install 'seqtool\[documents\]'"):
            split_sentences("A b. C d.", "en", "always")
    finally:
        sentences._splitter.cache_clear()


def test_looks_like_several_sentences():
    assert looks_like_several_sentences("It rains. We stay.", "en")
    assert looks_like_several_sentences("¿Llueve? «Sí.» Nos quedamos.", "es")
    assert looks_like_several_sentences("雨です。 家にいます。", "ja")
    assert not looks_like_several_sentences("One sentence, no end", "en")
    assert not looks_like_several_sentences("Ends here.  ", "en")
    assert not looks_like_several_sentences("version 1.2.3 is out", "en")


def test_join_aligned_counts_offsets_and_indices_on():
    pieces = [("", "  "), ("Hola.", " "), ("Adiós.", "\n")]
    parts = [None, Aligned("Hi.", [(0, 0), (1, 1)], [(0, 4), (4, 5)], [(0, 2), (2, 3)]),
             Aligned("Bye.", [(0, 0), (1, 1)], [(0, 5), (5, 6)], [(0, 3), (3, 4)])]
    whole = join_aligned(pieces, parts)
    assert whole.target == "  Hi. Bye.\n"
    assert whole.source_tokens == [(2, 6), (6, 7), (8, 13), (13, 14)]
    assert whole.target_tokens == [(2, 4), (4, 5), (6, 9), (9, 10)]
    assert whole.alignment == [(0, 0), (1, 1), (2, 2), (3, 3)]
    with pytest.raises(ValueError, match="one part per piece"):
        join_aligned(pieces, parts[1:])


# ---------------------------------------------------------------------------------------------
# placeholders


@pytest.mark.parametrize("text, found", [
    ("see https://example.com/a?b=1&c=2.", ["https://example.com/a?b=1&c=2"]),
    ("(http://x.org/wiki/Foo_(bar)), then", ["http://x.org/wiki/Foo_(bar)"]),
    ("«www.ejemplo.es», dijo", ["www.ejemplo.es"]),
    ("write to ana.b+tag@mail.example.co.uk!", ["ana.b+tag@mail.example.co.uk"]),
    ("mailto:x@y.com and ftp://files.example.net/a.tar.gz;", ["mailto:x@y.com", "ftp://files.example.net/a.tar.gz"]),
    ("https://example.com/path/…", ["https://example.com/path/"]),
    ("no: e.g. v1.2.3, a@b, @handle, http:// nothing, Mr.Smith", []),
    ("jose@localhost, usuario@dominio. \"john doe\"@example.com", ["jose@localhost", "usuario@dominio", '"john doe"@example.com']),
])
def test_placeholders(text, found):
    assert [text[a:b] for a, b in placeholders(text)] == found


def test_protect_cuts_placeholders_out_and_render_puts_them_back():
    unit = protect("Mail me at me@x.com or visit http://x.com/a.")
    assert unit.text == "Mail me at  or visit ."
    assert [(s.start, s.open) for s in unit.spans] == [(11, "me@x.com"), (21, "http://x.com/a")]
    assert all(s.void for s in unit.spans)
    assert render_unit(unit.text, unit.spans) == "Mail me at me@x.com or visit http://x.com/a."


@FAST
@given(texts((list("ab.:/@ ()w") + ["http://", "www.", ".com", "@x.org", "\n"]), max_size=50))
def test_protect_round_trip(text):
    unit = protect(text)
    assert render_unit(unit.text, unit.spans) == text
    assert all(span.void and placeholders(span.open) == [(0, len(span.open))] for span in unit.spans)  # each cut is one


# ---------------------------------------------------------------------------------------------
# spans placed on a translation


def test_place_spans_follows_the_alignment():
    unit = Unit("the red car", [Span(4, 7, "<b>", "</b>")])
    target = "el coche rojo"
    spans = place_spans(unit, target, [(0, 0), (1, 2), (2, 1)], words(unit.text), words(target))
    assert render_unit(target, spans) == "el coche <b>rojo</b>"
    assert span_words(unit, unit.spans[0]) == "red"


def test_place_spans_never_splits_a_word():
    unit = Unit("an unbelievable story", [Span(3, 15, "<i>", "</i>")])
    target = "una historia increíble"
    tgt = [(0, 3), (3, 12), (12, 16), (16, 19), (19, 22)]  # subword pieces: ' increíble' is three
    spans = place_spans(unit, target, [(1, 3)], words(unit.text), tgt)
    assert render_unit(target, spans) == "una historia <i>increíble</i>"
    cjk = Unit("a big house", [Span(2, 5, "<b>", "</b>")])
    target = "一座大房子"  # no spaces: every character is a word
    spans = place_spans(cjk, target, [(1, 2)], words(cjk.text), [(k, k + 1) for k in range(5)])
    assert render_unit(target, spans) == "一座<b>大</b>房子"


def test_place_spans_without_alignment_uses_neighbours_then_the_ends():
    unit = Unit("go to town now", [Span(6, 10, "<b>", "</b>"), Span(0, 0, "<br>"), Span(14, 14, "<img>")])
    target = "ve a la ciudad ya"
    # 'town' unaligned: it wraps what its neighbour 'to' became
    spans = place_spans(unit, target, [(1, 1), (3, 4)], words(unit.text), words(target))
    assert render_unit(target, spans) == "<br>ve <b>a</b> la ciudad ya<img>"
    spans = place_spans(unit, target, [], words(unit.text), words(target))  # nothing aligned: a span with words gets one
    assert render_unit(target, spans) == "<br>ve a la ciudad <b>ya</b><img>"


def test_void_spans_go_beside_the_translation_of_the_word_they_touch():
    unit = Unit("Hello world. Bye", [Span(5, 5, "<br>", "", -1, True), Span(13, 13, "<img>")])
    target = "Hola mundo. Adiós"
    spans = place_spans(unit, target, [(0, 0), (1, 1), (2, 2), (3, 3)], words(unit.text), words(target))
    # <br> touched 'Hello' (its stand-in space is written as the <br>); <img> touched 'Bye'
    assert render_unit(target, spans) == "Hola<br>mundo. <img>Adiós"


def test_place_spans_repairs_nesting():
    # <b>a <i>b</i></b> c: the alignment sends 'b' far outside its parent's words
    unit = Unit("a b c", [Span(0, 3, "<b>", "</b>"), Span(2, 3, "<i>", "</i>", 0)])
    target = "x y z"
    spans = place_spans(unit, target, [(0, 0), (1, 2), (2, 1)], words(unit.text), words(target))
    html = render_unit(target, spans)
    assert html.count("<b>") == 1 and well_formed(html)
    siblings = Unit("a b", [Span(0, 1, "<b>", "</b>"), Span(2, 3, "<i>", "</i>")])
    spans = place_spans(siblings, "x", [(0, 0), (1, 0)], words("a b"), words("x"))  # both on one word
    assert render_unit("x", spans) == "<b>x</b><i></i>"


def test_place_spans_cannot_fail_and_render_refuses_bad_spans():
    unit = Unit("a b", [Span(0, 1, "<b>", "</b>")])
    for alignment, src_tokens in (([(0, 5), (-1, 0), (7, 7)], words("a b")), ([], [(0, 9), (-3, 1)])):
        assert render_unit("x", place_spans(unit, "x", alignment, src_tokens, words("x"))) == "<b>x</b>"
    with pytest.raises(ValueError, match="overlap"):
        render_unit("abc", [Span(0, 2, "<b>", "</b>"), Span(1, 3, "<i>", "</i>")])
    with pytest.raises(ValueError, match="not inside its parent"):
        render_unit("abc", [Span(0, 1, "<b>", "</b>"), Span(1, 3, "<i>", "</i>", 0)])
    with pytest.raises(ValueError, match="void"):
        render_unit("abc", [Span(0, 1, "<br>")])


@st.composite
def units_and_translations(draw):
    """A unit with nested spans and voids, a target of other words, and any alignment between them."""
    n = draw(st.integers(1, 8))
    text = " ".join(f"w{k}" for k in range(n))
    src = words(text)
    spans: list[Span] = []

    def add(low, high, parent, depth):
        k = low
        while k < high:
            if draw(st.booleans()) and depth < 3:
                end = draw(st.integers(k, high))
                spans.append(Span(src[k][0], src[end - 1][1] if end > k else src[k][0], "<b>", "</b>", parent))
                add(k, end, len(spans) - 1, depth + 1)
                k = max(end, k + 1)
            else:
                if draw(st.booleans()):
                    spans.append(Span(src[k][0], src[k][0], "<br>", "", parent))
                k += 1

    add(0, n, -1, 0)
    m = draw(st.integers(0, 8))
    target = " ".join(f"t{k}" for k in range(m))
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, max(m - 1, 0))), max_size=12)) if m else []
    return Unit(text, spans), target, pairs


@FAST
@given(units_and_translations())
def test_placed_spans_are_always_valid_and_nested(case):
    unit, target, pairs = case
    spans = place_spans(unit, target, pairs, words(unit.text), words(target))
    assert [(s.open, s.close, s.parent) for s in spans] == [(s.open, s.close, s.parent) for s in unit.spans]
    html = render_unit(target, spans)  # raises on any invalid span
    assert spaces_added(re.sub(r"</?b>|<br>", "", html), target)
    assert well_formed(html)
    kids = [[k for k, s in enumerate(unit.spans) if s.parent == p] for p in range(-1, len(unit.spans))]
    for group in kids:  # siblings keep their order of the source (the tag stream is the source's)
        source_order = sorted(group, key=lambda k: (unit.spans[k].start, k))
        assert [spans[k].start for k in source_order] == sorted(spans[k].start for k in group)
    for span in spans:  # never inside a word
        assert span.start in (0, len(target)) or not (target[span.start - 1].isalnum() and target[span.start].isalnum())


# ---------------------------------------------------------------------------------------------
# documents: plain text


def test_plain_text_units_are_lines_with_text():
    doc = parse_text("First line http://x.com\r\n\n   \nSecond\tline\nlast")
    assert [u.text for u in doc.units] == ["First line ", "Second\tline", "last"]
    assert doc.units[0].spans == [Span(11, 11, "http://x.com", kind="placeholder")]
    out = doc.render([("Primera línea ", [Span(14, 14, "http://x.com")]), ("Segunda\nlínea", []), ("última", [])])
    assert out == "Primera línea http://x.com\r\n\n   \nSegunda línea\núltima"


@FAST
@given(texts((list("ab \t\r\n.") + ["\x85", "\u2028", "http://a.b", "\x00"]), max_size=60))
def test_plain_text_identity(text):
    doc = parse_text(text)
    assert doc.render(doc.identity()) == text
    assert doc.render(identity_by_alignment(doc)) == text
    assert all(u.text.strip() and "\n" not in u.text for u in doc.units)


def test_document_render_checks_what_it_is_given():
    doc = parse_text("a http://x.com\nb")
    with pytest.raises(ValueError, match="one \\(text, spans\\) per unit"):
        doc.render([("a", [])])
    with pytest.raises(ValueError, match="not the unit's own"):
        doc.render([("a", []), ("b", [])])
    with pytest.raises(ConfigError, match="text, html, markdown"):
        parse("x", "docx")


# ---------------------------------------------------------------------------------------------
# documents: HTML

PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Tom &amp; Jerry</title>
<style>p > b { color: red }</style><script>if (a < b && c) { document.write("<p>x</p>") }</script></head>
<body>
<!-- a comment -->
<h1 id="top">Hello <em>there</em></h1>
<p class="intro" data-x='1 > 0'>Read <a href="https://example.com/?a=1&amp;b=2" title="A &quot;t&quot;">the <b>full</b> guide</a>,
now.<br>Contact: me@example.com &nbsp;&copy; 2024</p>
<ul><li>One</li><li>Two <img src="x.png" alt="an image"> three</li></ul>
<pre>  keep   <b>this</b>
  as is</pre>
<p>Run <code>pip install x</code> or <span translate="no">BrandName</span> or <i class="notranslate">Other</i>.</p>
<div translate="no"><p>Not this</p></div>
<table><tr><th>Name</th><td>Value &lt;5&gt;</td></tr></table>
</body></html>"""


def test_html_units_spans_and_what_stays_verbatim():
    doc = parse_html(PAGE)
    texts = [u.text for u in doc.units]
    assert texts == ["Tom & Jerry", "Hello there", 'A "t"', "Read the full guide,\nnow. Contact:  \xa0© 2024", "One", "an image",
                     "Two  three", "Run  or  or .", "Name", "Value <5>"]  # (an attribute's value comes before its block)
    intro = doc.units[3]
    assert [(s.open, s.close) for s in intro.spans] == [
        ('<a href="https://example.com/?a=1&amp;b=2" title="A &quot;t&quot;">', "</a>"), ("<b>", "</b>"),
        ("<br>", ""), ("me@example.com", "")]
    assert [span_words(intro, s) for s in intro.spans[:2]] == ["the full guide", "full"]
    assert intro.spans[1].parent == 0 and intro.spans[2].replaces_space
    run = doc.units[7]
    assert [s.open for s in run.spans] == ["<code>pip install x</code>", '<span translate="no">BrandName</span>',
                                           '<i class="notranslate">Other</i>']
    assert not any("Not this" in t or "keep" in t or "color" in t or "document" in t for t in texts)


def test_html_identity_is_exact():
    doc = parse_html(PAGE)
    assert doc.render(doc.identity()) == PAGE  # a unit given back as it was is written as it was, references and all
    assert doc.render(identity_by_alignment(doc)) == PAGE
    assert doc.render(doc.identity(), lang="es").startswith('<!DOCTYPE html>\n<html lang="es">')


def test_html_translation_keeps_every_tag_and_attribute():
    doc = parse_html(PAGE)
    out = doc.render(reversed_words(doc))
    assert sorted(tags(out)) == sorted(tags(PAGE))
    assert well_formed(out)
    for verbatim in ('<script>if (a < b && c) { document.write("<p>x</p>") }</script>', "<pre>  keep   <b>this</b>\n  as is</pre>",
                     '<div translate="no"><p>Not this</p></div>', "https://example.com/?a=1&amp;b=2", "me@example.com"):
        assert verbatim in out


def test_html_escapes_the_translation():
    doc = parse_html("<p>a <b>b</b></p>")
    out = doc.render([("x < y & <script>", [Span(0, 1, "<b>", "</b>")])])
    assert out == "<p><b>x</b> &lt; y &amp; &lt;script&gt;</p>"


@pytest.mark.parametrize("bad", [
    "<p>unclosed <b>bold <i>both", "<p>a < b and c > d</p>", "<b><i>crossed</b></i> text", "</b>stray end</i> here",
    "<p>\x00\x01 control \x7f bytes \udcff</p>", "<script>never closed", "<p>text <!-- unclosed comment", "<<<>>>&&&;",
    "<p attr='unterminated>text</p>", "<a href=x>link<p>block inside</a>", "<!DOCTYPE><?pi?><![CDATA[x]]>text",
    "&#xZZ; &#99999999; &bogus; &amp", "<pre>unclosed pre <b>x", "<p>a<br>b<br/>c<wbr>d</p>",
    "<p>before <![if x]> after</p>\n<p>next <b>x</b></p>", "<!DOCTYPE[\" CDATA\"<p>x</p>",
])
def test_bad_html_never_raises_and_is_kept(bad):
    doc = parse_html(bad)
    out = doc.render(doc.identity())
    assert parse_html(out).units == doc.units  # rendering is a fixed point of reading
    assert doc.render(reversed_words(doc)) is not None
    assert tags(out) == tags(bad)


@st.composite
def html_fragments(draw, depth=0):
    """Well-formed HTML whose text uses only &amp; &lt; &gt; &nbsp; references (so the identity is exact)."""
    word = st.sampled_from(["hola", "mundo", "Grüße", "東京", "a.", "b?", "&amp;", "&lt;x&gt;", "&nbsp;", " ", "\n", "http://e.com/x"])
    parts = []
    for _ in range(draw(st.integers(0 if depth else 1, 4))):
        choice = draw(st.integers(0, 9 if depth < 3 else 3))
        if choice <= 3:
            parts.append(draw(word))
        elif choice == 4:
            parts.append(draw(st.sampled_from(["<br>", '<img src="a b.png" alt="x">', "<!-- c -->", "<wbr>"])))
        elif choice == 5:
            parts.append(draw(st.sampled_from(["<code>x &lt; y</code>", '<span translate="no">N</span>'])))
        else:
            tag = draw(st.sampled_from(["b", "i", 'a href="https://x.org/?q=1&amp;r=2"', 'span class="c"', "em"]))
            parts.append(f"<{tag}>{draw(html_fragments(depth + 1))}</{tag.split()[0]}>")
    return "".join(parts)


@st.composite
def html_documents(draw):
    blocks = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["p", "li", "h2", "td", "div", "pre", "script"]))
        inner = draw(html_fragments())
        if kind == "script":
            inner = "var a = 1 < 2;"
        blocks.append(f"<{kind}>{inner}</{kind}>" + draw(st.sampled_from(["", "\n", "\n  "])))
    return "".join(blocks)


@FAST
@given(html_documents())
def test_html_identity_and_translation_on_generated_documents(doc_text):
    doc = parse_html(doc_text)
    assert doc.render(doc.identity()) == doc_text
    if not splits_a_word(doc):  # place_spans widens such a span to the whole word
        assert doc.render(identity_by_alignment(doc)) == doc_text
    out = doc.render(reversed_words(doc))
    assert sorted(tags(out)) == sorted(tags(doc_text))
    assert well_formed(out)


@FAST
@given(texts((list("<>/&;#=\"' ab\n[]%") + ["<b>", "</b>", "<p>", "<br>", "<!--", "-->", "&amp;", "<script>", "</script>",
                                              "\x00", "<![", "<!", "DOCTYPE", "CDATA", "ENTITY", "<?"]), max_size=60))
def test_any_text_as_html_never_raises(text):
    doc = parse_html(text)
    out = doc.render(doc.identity())
    assert parse_html(out).render(parse_html(out).identity()) == out
    doc.render(reversed_words(doc))


# ---------------------------------------------------------------------------------------------
# documents: Markdown

MARKDOWN = """---
title: "Not *translated*"
---
# Getting *started* #

Install with `pip install x` and read the [full guide](https://example.com/guide "The guide").
This line continues the paragraph, see <https://auto.link> and ![a logo](logo.png).  
A hard break came before this, and <b>inline html</b> after \\*escaped\\* &amp; entity.

> Quoted **strong** text
> on two lines.

1. First item
2. Second item with [a reference][ref]
   continued here

| Column | Other \\| pipe |
|--------|---------------|
| `code` | Cell text |

```python
print("code block, *not* translated")
```

    indented code block

<div class="html-block">
Raw HTML block.
</div>

Setext heading
==============

[ref]: https://example.com/ref
"""


def test_markdown_units_and_spans():
    doc = parse_markdown(MARKDOWN)
    texts = [u.text for u in doc.units]
    assert texts[0] == "Getting started"
    assert texts[1].startswith("Install with  and read the full guide.")
    assert "Quoted strong text on two lines." in texts
    assert "Other | pipe" in texts and "Setext heading" in texts and "Cell text" in texts  # (as read: escapes decoded)
    assert not any("print" in t or "indented" in t or "title" in t for t in texts)
    assert "Raw HTML block." in [t.strip() for t in texts]  # an HTML block is read as HTML
    guide = doc.units[1]
    opens = [(s.open, s.close) for s in guide.spans]
    assert ("`pip install x`", "") in opens and ("[", '](https://example.com/guide "The guide")') in opens
    assert ("<https://auto.link>", "") in opens and ("![a logo](logo.png)", "") in opens
    assert ("<b>", "</b>") in opens
    assert ("  \n", "") in opens  # the hard break, a void standing on a space


def test_markdown_identity_is_byte_for_byte():
    doc = parse_markdown(MARKDOWN)
    assert doc.render(doc.identity()) == MARKDOWN
    assert doc.render(identity_by_alignment(doc)) == one_line_paragraphs(doc)
    crlf = MARKDOWN.replace("\n", "\r\n")
    doc = parse_markdown(crlf)
    assert doc.render(doc.identity()) == crlf and len(doc.units) == len(parse_markdown(MARKDOWN).units)


def test_markdown_translation_replaces_only_text():
    doc = parse_markdown(MARKDOWN)
    out = doc.render([(u.text.upper(), u.spans) for u in doc.units])  # same lengths: the spans stay
    for kept in ('title: "Not *translated*"', '```python\nprint("code block, *not* translated")\n```', "    indented code block",
                 '<div class="html-block">\nRAW HTML BLOCK.\n</div>', "[ref]: https://example.com/ref", "`pip install x`",
                 '](https://example.com/guide "The guide")', "  \nA HARD BREAK", "> ON TWO LINES."):
        assert kept in out
    assert "# GETTING *STARTED* #" in out and "| CELL TEXT |" in out
    reordered = doc.render(reversed_words(doc))
    assert parse_markdown(reordered).render(parse_markdown(reordered).identity()) == reordered


def test_markdown_target_cannot_break_its_block():
    doc = parse_markdown("| a | b |\n|---|---|\n| x | y |\n\npara\n")
    cells = {u.text: k for k, u in enumerate(doc.units)}
    translated = [(u.text, u.spans) for u in doc.units]
    translated[cells["x"]] = ("p | q\nr", [])
    translated[cells["para"]] = ("one\n# two", [])
    assert doc.render(translated) == "| a | b |\n|---|---|\n| p \\| q r | y |\n\none # two\n"


@st.composite
def markdown_documents(draw):
    inline = st.lists(st.sampled_from(["word", "otra", "*em*", "**strong**", "`code`", "[link](http://x.y/z)", "![img](i.png)",
                                       "<http://a.b>", "\\*", "&amp;", "<b>x</b>", "~~gone~~", "http://bare.url/x", "_u_"]),
                      min_size=1, max_size=6).map(" ".join)
    blocks, prose = [], 0
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.integers(0, 8))
        text = draw(inline)
        block = [f"# {text}", text, f"> {text}\n> {draw(inline)}", f"- {text}\n- {draw(inline)}\n  {draw(inline)}",
                 f"| {text} | b |\n|---|---|\n| {draw(inline)} | c |", f"```\n{text}\n```", f"para\n\n    {text}",
                 f"{text}  \n{draw(inline)}", f"1. {text}\n\n   > {draw(inline)}"][kind]
        blocks.append(block)
        prose += 0 if kind in (5, 6) else len(re.findall("word|otra", block))
    return "\n\n".join(blocks) + draw(st.sampled_from(["", "\n"])), prose


@FAST
@given(markdown_documents())
def test_markdown_identity_and_translation_on_generated_documents(case):
    text, prose = case
    doc = parse_markdown(text)
    assert doc.render(doc.identity()) == text
    assert doc.render(identity_by_alignment(doc)) == one_line_paragraphs(doc)
    assert sum(len(re.findall("word|otra", u.text)) for u in doc.units) == prose  # all prose is in units, no code is
    out = doc.render(reversed_words(doc))
    assert parse_markdown(out).render(parse_markdown(out).identity()) == out


@FAST
@given(texts((list("#>*_`[]()!<>|-+=~\\&; \n\tab1.") + ["\r", "---", "```", "http://x.y"]), max_size=80))
def test_any_text_as_markdown_comes_back_exactly(text):
    doc = parse_markdown(text)
    assert doc.render(doc.identity()) == text
    doc.render(reversed_words(doc))


# ---------------------------------------------------------------------------------------------
# the module's own promises


def test_markdown_needs_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "markdown_it", None)  # as if it were not installed
    markdown_reader._markdown_parser.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"pip install 'seqtool\[documents\]'"):
            parse_markdown("# x")
    finally:
        markdown_reader._markdown_parser.cache_clear()


# ---------------------------------------------------------------------------------------------
# helpers


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.seen = []

    def handle_starttag(self, tag, attrs):
        self.seen.append(self.get_starttag_text())

    def handle_startendtag(self, tag, attrs):
        self.seen.append(self.get_starttag_text())

    def handle_endtag(self, tag):
        self.seen.append(f"</{tag}>")


READABLE = re.compile(r"""(\s(?:title|alt|placeholder|aria-label|lang)\s*=\s*)("[^"]*"|'[^']*'|[^\s>]*)""", re.IGNORECASE)


def tags(text: str) -> list[str]:
    """Every start tag (as written, attributes and all, but the values of those translated: title, alt, ...,
    and lang) and end tag, in order."""
    parser = _Tags()
    parser.feed(text)
    parser.close()
    return [READABLE.sub(r"\1*", tag) for tag in parser.seen]


def well_formed(text: str) -> bool:
    """Every end tag closes the innermost open element (void elements need none)."""
    stack = []
    for tag in tags(text):
        name = re.match(r"</?([a-zA-Z0-9]+)", tag).group(1).lower()
        if tag.startswith("</"):
            if not stack or stack.pop() != name:
                return False
        elif name not in ("br", "img", "wbr", "meta", "hr", "input", "link") and not tag.endswith("/>"):
            stack.append(name)
    return not stack
