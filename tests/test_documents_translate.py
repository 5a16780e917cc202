"""Documents through `seqtool translate` and `seqtool serve`: sentences cut and joined, HTML and Markdown
kept around the translated text, URLs and e-mails never given to the model (issue 28)."""

import re
import subprocess
import sys
from html.parser import HTMLParser

import httpx
import pytest

from servers import Server

pytestmark = pytest.mark.system

FP32 = ["--device", "cpu", "--precision", "fp32", "--threads", "2", "--max-len-a", "0", "--max-len-b", "8"]


def translate(checkpoint, *args, stdin: str):
    out = subprocess.run([sys.executable, "-m", "seqtool", "translate", "-c", str(checkpoint), *FP32, *map(str, args)],
                         input=stdin.encode("utf-8", "surrogateescape"), capture_output=True, timeout=300)
    return out.returncode, out.stdout.decode("utf-8"), out.stderr.decode("utf-8")


INLINE = {"b", "i", "a", "br", "em", "strong", "span", "code"}


def same_tags(got: str, want: str) -> bool:
    """Every tag and attribute kept (inline ones may move with the words they wrap), blocks in order,
    and the inline tags still balanced (each start has its end, properly nested)."""
    g, w = Tags(got).seen, Tags(want).seen
    stack = []
    for kind, tag, _ in g:
        if tag in INLINE and tag != "br":
            if kind == "start":
                stack.append(tag)
            elif kind == "end" and (not stack or stack.pop() != tag):
                return False
    return sorted(g) == sorted(w) and [t for t in g if t[1] not in INLINE] == [t for t in w if t[1] not in INLINE] and not stack


class Tags(HTMLParser):
    """The tag sequence of a document: (kind, tag, attributes) in order."""

    def __init__(self, doc):
        super().__init__(convert_charrefs=True)
        self.seen = []
        self.feed(doc)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.seen.append(("start", tag, readable_aside(attrs)))

    def handle_endtag(self, tag):
        self.seen.append(("end", tag, ()))

    def handle_startendtag(self, tag, attrs):
        self.seen.append(("void", tag, readable_aside(attrs)))


def readable_aside(attrs) -> tuple:
    """A tag's attributes, the values of those translated (title, alt, ...) and lang aside."""
    return tuple((k, "*" if k in ("title", "alt", "placeholder", "aria-label", "lang") else v) for k, v in attrs)


HTML = """<!DOCTYPE html>
<html><head><title>a b c</title><style>p { color: red; }</style></head>
<body>
<h1 class="t">d e f</h1>
<p>a <b>b c</b> d <a href="https://example.org/x?y=1&amp;z=2" title="t">e f</a> g.<br>h a.</p>
<pre>keep   this &lt;as&gt; is</pre>
<p translate="no">c d e</p>
<script>var x = "<p>a</p>";</script>
<ul><li>b <i>c</i></li><li>d &amp; e</li></ul>
</body></html>
"""


def test_html_keeps_every_tag_attribute_and_untranslated_part(tiny_checkpoint):
    code, out, err = translate(tiny_checkpoint, "--format", "html", stdin=HTML)
    assert code == 0 and "Traceback" not in err, err
    assert same_tags(out, HTML)
    for kept in ('<pre>keep   this &lt;as&gt; is</pre>', '<p translate="no">c d e</p>', '<script>var x = "<p>a</p>";</script>',
                 '<style>p { color: red; }</style>', '<!DOCTYPE html>', 'href="https://example.org/x?y=1&amp;z=2"'):
        assert kept in out


MARKDOWN = """# a b c

d e **f g** h [a b](https://example.org/a_(b)) c `d  e` f.

```python
x = "a b c"  # not text
```

- g h
- a *b*

| a | b |
|---|---|
| c | d |

> e f g
"""


def test_markdown_keeps_everything_that_is_not_text_byte_for_byte(tiny_checkpoint):
    code, out, err = translate(tiny_checkpoint, "--format", "markdown", stdin=MARKDOWN)
    assert code == 0 and "Traceback" not in err, err
    for kept in ('```python\nx = "a b c"  # not text\n```', "`d  e`", "](https://example.org/a_(b))", "|---|---|"):
        assert kept in out
    assert out.startswith("# ") and "\n- " in out and "\n> " in out and out.count("**") == 2


def test_sentences_of_a_long_line_are_translated_as_they_are_alone_and_joined_with_its_whitespace(tiny_checkpoint):
    """--split-sentences always: a line of three sentences gives, on one line, each sentence's own
    translation with the line's whitespace between them; never: the line whole, as before."""
    sentences = ["A b c d.", "E f g h!", "A c e g?"]
    line = f"{sentences[0]}  {sentences[1]} {sentences[2]}"
    code, out, _ = translate(tiny_checkpoint, "--split-sentences", "always", stdin=f"{line}\nb c\n")
    assert code == 0 and len(out.splitlines()) == 2
    code, alone, _ = translate(tiny_checkpoint, "--split-sentences", "never", stdin="\n".join(sentences) + "\nb c\n")
    first, second, third, short = alone.splitlines()
    assert out.splitlines() == [f"{first}  {second} {third}", short]
    code, whole, _ = translate(tiny_checkpoint, "--split-sentences", "never", stdin=f"{line}\n")
    code, auto, _ = translate(tiny_checkpoint, stdin=f"{line}\n")  # shorter than the model's limit: whole
    assert auto == whole


def test_urls_and_e_mails_come_out_verbatim(tiny_checkpoint):
    things = ["https://example.org/a/b?c=1&d=2", "juan.perez@example.com", "www.example.net/x", "mailto:a@b.org"]
    lines = [f"a b {t} c d." for t in things] + [f"{things[0]} e f", f"g {things[1]}"]
    code, out, err = translate(tiny_checkpoint, stdin="\n".join(lines) + "\n")
    assert code == 0 and len(out.splitlines()) == len(lines), err
    for line, got in zip(lines, out.splitlines()):
        for t in things:
            if t in line:
                assert re.search(rf"(^|\s){re.escape(t)}($|\s)", got), (line, got)


@pytest.mark.parametrize("doc", ["<p>a <b>b c</p> d <i>e", "a < b and c <3 d", "<p>a\x00b \x07 c</p>", "<<<>>></p></p>",
                                 "<p>" * 2000 + "a b"])
def test_broken_html_is_translated_without_a_traceback(tiny_checkpoint, doc):
    code, out, err = translate(tiny_checkpoint, "--format", "html", stdin=doc)
    assert code == 0 and "Traceback" not in err and out, err


def test_invalid_utf8_in_a_document_is_replaced_with_a_warning(tiny_checkpoint):
    code, out, err = translate(tiny_checkpoint, "--format", "markdown", stdin="# a b\n\nc \udcff d\n")
    assert code == 0 and "warning: <stdin>:3: invalid UTF-8" in err and out.startswith("# ")


@pytest.mark.parametrize("args, words", [
    (["--format", "html", "--nbest", "2", "--print-scores"], "print_scores"),
    (["--split-sentences", "sometimes"], "--split-sentences must be auto, always or never"),
    (["--format", "docx"], "--format must be auto, text, html or markdown"),
    (["--format", "HTML", "--nbest", "2", "--beam", "2"], "translates a document into one document; drop --nbest"),
])
def test_option_mistakes_are_one_line(tiny_checkpoint, args, words):
    code, out, err = translate(tiny_checkpoint, *args, stdin="a b\n")
    assert code == 1 and words.replace("print_scores", "--print-scores") in err and "Traceback" not in err, err


def test_the_server_translates_html_and_refuses_a_document_past_its_limits(tiny_checkpoint):
    s = Server(tiny_checkpoint, "--max-chars", "5000", "--queue-limit", "50")
    try:
        r = httpx.post(f"{s.url}/translate", json={"q": HTML, "source": "auto", "target": "tgt", "format": "html"}, timeout=60)
        assert r.status_code == 200, r.text
        assert same_tags(r.json()["translatedText"], HTML)
        r = httpx.post(f"{s.url}/v1/translate", json={"segments": [MARKDOWN, "a b"], "format": "markdown"}, timeout=60)
        assert r.status_code == 200 and "```python\nx = \"a b c\"  # not text\n```" in r.json()["translations"][0]["text"]
        r = httpx.post(f"{s.url}/translate", json={"q": "<p>a b</p>" * 600, "format": "html"}, timeout=60)
        assert r.status_code == 413 and "(--max-chars)" in r.json()["error"]
        r = httpx.post(f"{s.url}/translate", json={"q": "<p>a b</p>" * 60, "format": "html"}, timeout=60)
        assert r.status_code == 413 and "(--queue-limit)" in r.json()["error"]
        r = httpx.post(f"{s.url}/v1/translate", json={"segments": ["<b>a</b>"], "format": "html", "scores": True}, timeout=60)
        assert r.status_code == 422 and "scores belong to format text" in r.json()["error"]
    finally:
        err = s.stop()
    assert "Traceback" not in err


def run_files(checkpoint, *args):
    out = subprocess.run([sys.executable, "-m", "seqtool", "translate", "-c", str(checkpoint), *FP32, *map(str, args)],
                         capture_output=True, timeout=300, stdin=subprocess.DEVNULL)
    return out.returncode, out.stderr.decode("utf-8")


def test_format_auto_is_chosen_by_the_input_name_and_formats_ignore_case(tiny_checkpoint, tmp_path):
    (tmp_path / "page.HTML").write_text(HTML, encoding="utf-8")
    (tmp_path / "README.Md").write_text(MARKDOWN, encoding="utf-8")
    (tmp_path / "notes.txt").write_text("<p>a b</p>\nc d\n", encoding="utf-8")
    for name in ("page.HTML", "README.Md", "notes.txt"):
        code, err = run_files(tiny_checkpoint, "-i", tmp_path / name, "-o", tmp_path / f"out-{name}")
        assert code == 0, err
    assert same_tags((tmp_path / "out-page.HTML").read_text(encoding="utf-8"), HTML)
    assert '```python\nx = "a b c"  # not text\n```' in (tmp_path / "out-README.Md").read_text(encoding="utf-8")
    assert len((tmp_path / "out-notes.txt").read_text(encoding="utf-8").splitlines()) == 2  # text: a line per line
    code, out, err = translate(tiny_checkpoint, "--format", "HTML", stdin=HTML)
    assert code == 0 and same_tags(out, HTML), err


def test_html_on_stdin_read_as_text_gets_a_warning_naming_the_format(tiny_checkpoint):
    code, out, err = translate(tiny_checkpoint, stdin=HTML)
    assert code == 0 and "looks like HTML" in err and "--format html" in err
    assert len(out.splitlines()) == len(HTML.splitlines())
    code, out, err = translate(tiny_checkpoint, stdin="a b\nc d\n")
    assert code == 0 and "HTML" not in err


def test_a_document_keeps_its_encoding_line_ends_and_byte_order_mark(tiny_checkpoint, tmp_path):
    latin = '<html><head><meta charset="iso-8859-1"><title>a b</title></head><body><p>c d</p><pre>año ñ €</pre></body></html>\n'
    (tmp_path / "latin.html").write_bytes(latin.encode("cp1252"))
    code, err = run_files(tiny_checkpoint, "-i", tmp_path / "latin.html", "-o", tmp_path / "out.html")
    out = (tmp_path / "out.html").read_bytes()
    assert code == 0 and '<pre>año ñ €</pre>'.encode("cp1252") in out and b'charset="iso-8859-1"' in out, err
    crlf = "\ufeff# a b\r\n\r\nc d *e* f\r\n\r\n- g\r\n- h\r\n"
    (tmp_path / "bom.md").write_bytes(crlf.encode("utf-8"))
    code, err = run_files(tiny_checkpoint, "-i", tmp_path / "bom.md", "-o", tmp_path / "bom-out.md")
    out = (tmp_path / "bom-out.md").read_bytes()
    assert code == 0 and out.startswith(b"\xef\xbb\xbf# ") and out.count(b"\r\n") == crlf.count("\r\n") and b"\n" not in out.replace(b"\r\n", b""), err


def test_a_document_with_a_line_over_a_mebibyte_is_translated(tiny_checkpoint, tmp_path):
    image = "data:image/png;base64," + "QUJD" * 300_000  # an inline image: 1.2 MB on one line
    (tmp_path / "big.html").write_text(f'<p>a b <img src="{image}" alt="c d"> e f</p>\n', encoding="utf-8")
    code, err = run_files(tiny_checkpoint, "-i", tmp_path / "big.html", "-o", tmp_path / "out.html")
    assert code == 0 and image in (tmp_path / "out.html").read_text(encoding="utf-8"), err


def test_a_glossary_applies_to_every_sentence_of_a_document(tiny_checkpoint, tmp_path):
    (tmp_path / "terms.tsv").write_text("a b\thhh\n", encoding="utf-8")
    code, out, err = translate(tiny_checkpoint, "--format", "html", "--glossary", tmp_path / "terms.tsv",
                               stdin="<p>a b c</p><ul><li>d a b</li><li>e f</li></ul>")
    assert code == 0, err
    assert re.search(r"<p>[^<]*hhh[^<]*</p>", out) and re.search(r"<li>[^<]*hhh[^<]*</li><li>", out), out


def test_markdown_nested_past_the_parser_limit_warns(tiny_checkpoint):
    code, out, err = translate(tiny_checkpoint, "--format", "markdown", stdin="a b\n\n" + "> " * 30 + "c d\n")
    assert code == 0 and "nested deeper than 20 levels" in err and "> " * 30 + "c d" in out


def test_the_page_language_becomes_the_target_language(tiny_checkpoint, tmp_path):
    """<html lang> names the language the page is now in (the checkpoint's target); the attributes people
    read are translated, and kept with --keep-attributes."""
    from seqtool import checkpoint

    ckpt = checkpoint.load(tiny_checkpoint)
    ckpt["configs"]["train"] = {**ckpt["configs"]["train"], "src_lang": "es", "tgt_lang": "en"}
    path = tmp_path / "es-en.pt"
    checkpoint.save(ckpt, path)
    page = '<html lang="es"><body><p title="a b c">d e</p><img alt="f g" src="x.png"></body></html>'
    code, out, err = translate(path, "--format", "html", stdin=page)
    assert code == 0 and out.startswith('<html lang="en">') and 'title="a b c"' not in out and 'alt="f g"' not in out, err
    code, out, err = translate(path, "--format", "html", "--keep-attributes", stdin=page)
    assert code == 0 and out.startswith('<html lang="en">') and 'title="a b c"' in out and 'alt="f g"' in out, err
