"""Documents nobody here wrote (tests/data/documents: Rust by Example's Spanish pages, installed
packages' READMEs, npm's documentation), and generated ones, through the documents path: read,
translated by a stand-in model that drops, adds, reverses and reorders words (document_checks.scrambled)
and written back. What must hold: nothing crashes; the identity comes back byte for byte; HTML's tag
and attribute stream, verbatim elements, Markdown's structure, URLs and e-mail addresses and number-only
text are kept; every input costs time linear in its size."""

import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import document_checks as checks
from seqtool.documents import choose_format, parse, read_document

DATA = Path(__file__).parent / "data" / "documents"
REAL = sorted(p for p in DATA.rglob("*") if p.suffix in (".html", ".md") and p.name != "README.md")
PROPERTIES = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def read(path: Path) -> tuple[str, str]:
    format = choose_format("auto", path.name)
    return read_document(path.read_bytes(), format, str(path))[0], format


@pytest.mark.unit
def test_the_sample_is_there_with_its_licences():
    assert len([p for p in REAL if p.suffix == ".html"]) >= 10 and len([p for p in REAL if p.suffix == ".md"]) >= 10
    notes = (DATA / "README.md").read_text(encoding="utf-8")
    for licence in ("MIT", "Apache-2.0", "BSD", "Artistic-2.0", "MPL-2.0"):
        assert licence in notes


@pytest.mark.unit
@pytest.mark.parametrize("path", REAL, ids=[p.name for p in REAL])
def test_a_real_document_comes_back_whole_and_keeps_its_structure_when_translated(path):
    text, format = read(path)
    doc = parse(text, format)
    assert doc.units and doc.render(doc.identity()) == text
    out = doc.render(checks.scrambled(doc), "en")
    assert checks.problems(text, out, format) == []
    assert not doc.notes


# ---------------------------------------------------------------------------------------------
# generated documents

WORDS = ["hola", "mundo", "Canción", "año", "2024", "[22]", "3.14", "v1.2.3", "—", "¿qué?", "&amp;", "&nbsp;", "&lt;x&gt;",
         "https://example.com/a?b=1&amp;c=2", "www.ejemplo.es/x_(y)", "ana@example.org", "jose@localhost", "東京", " ", "  ", "\n"]
INLINE = ["b", "i", "em", "strong", "span", "a", "code", "kbd", "sup"]


@st.composite
def html_inline(draw, depth=0):
    parts = []
    for _ in range(draw(st.integers(0, 5))):
        kind = draw(st.sampled_from(["word", "word", "word", "element", "void"] if depth < 3 else ["word", "void"]))
        if kind == "word":
            parts.append(draw(st.sampled_from(WORDS)))
        elif kind == "void":
            parts.append(draw(st.sampled_from(['<br>', '<img src="x.png" alt="un perro">', "<wbr>", "<!-- c -->"])))
        else:
            tag = draw(st.sampled_from(INLINE))
            attrs = ' href="x.html" title="Ir a x"' if tag == "a" else ' class="notranslate"' if draw(st.integers(0, 9)) == 0 else ""
            lead = draw(st.sampled_from(["", " ", "\n  "]))
            parts.append(f"<{tag}{attrs}>{lead}{draw(html_inline(depth + 1))}</{tag}>")
    return "".join(parts)


@st.composite
def html_documents(draw):
    blocks = []
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["p", "h2", "li", "td", "pre"]))
        body = draw(html_inline())
        if kind == "li":
            blocks.append(f"<ul><li>{body}</li><li>{draw(html_inline())}</li></ul>")
        elif kind == "td":
            blocks.append(f"<table><tr><td>{body}</td><td>{draw(st.sampled_from(WORDS))}</td></tr></table>")
        elif kind == "pre":
            blocks.append(f"<pre><code>{body}</code></pre>")
        else:
            blocks.append(f"<{kind}>{body}</{kind}>")
    return '<!DOCTYPE html>\n<html lang="es"><head><title>Título</title></head><body>\n' + "\n".join(blocks) + "\n</body></html>\n"


@pytest.mark.unit
@PROPERTIES
@given(html_documents())
def test_generated_html_keeps_its_tags_verbatim_parts_urls_and_numbers(doc_text):
    doc = parse(doc_text, "html")
    assert doc.render(doc.identity()) == doc_text
    out = doc.render(checks.scrambled(doc), "en")
    assert checks.html_problems(doc_text, out) == []
    assert out.startswith('<!DOCTYPE html>\n<html lang="en">')


MD_WORDS = ["hola", "mundo", "año", "2024", "[22]", "3.14", "¿qué?", "https://example.com/a-(b)", "ana@example.org", "\\*",
            "&amp;", "東京", "-", "1.", "#", "a_b"]


@st.composite
def markdown_inline(draw, depth=0, link=False):
    parts = []
    kinds = ["word", "word", "word", "code", "link", "ref", "auto", "emphasis", "html", "break"] if depth < 2 else ["word", "code"]
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from([k for k in kinds if not (link and k in ("link", "ref", "auto"))]))  # (no link in a link)
        if kind == "word":
            parts.append(draw(st.sampled_from(MD_WORDS)))
        elif kind == "code":
            parts.append(draw(st.sampled_from(["`x`", "`a b`", "``c`d``"])))
        elif kind == "link":
            parts.append(f"[{draw(markdown_inline(depth + 1, link=True))}](https://example.org/p \"título\")")
        elif kind == "ref":
            parts.append(draw(st.sampled_from(["[label]", "[label][]", "[otro texto][label]"])))
        elif kind == "auto":
            parts.append("<https://auto.example/x>")
        elif kind == "html":
            parts.append(f"<b>{draw(st.sampled_from(MD_WORDS))}</b>")
        elif kind == "break":  # (between words: no paragraph of a real document starts with a hard break)
            parts.append(draw(st.sampled_from(MD_WORDS)) + draw(st.sampled_from(["\n", "  \n", "\\\n"])) +
                         draw(st.sampled_from(["hola", "mundo", "año"])))  # (a line starting "- " would be a list)
        else:
            mark = draw(st.sampled_from(["*", "_", "**", "__", "~~"] if depth == 0 else ["*", "_", "**", "__"]))
            parts.append(f"{mark}{draw(markdown_inline(depth + 1, link)).strip()}{mark}")
    return " ".join(parts)


@st.composite
def markdown_documents(draw):
    blocks = []
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["p", "h", "list", "quote", "table", "fence"]))
        body = draw(markdown_inline()).replace("\n", " ") if kind in ("h", "table") else draw(markdown_inline())
        if kind == "h":
            blocks.append(f"## {body}")
        elif kind == "list":
            blocks.append(f"- {body}\n- {draw(markdown_inline())}\n  - {draw(markdown_inline())}".replace("\n\n", "\n"))
        elif kind == "quote":
            blocks.append("> " + body.replace("\n", "\n> "))
        elif kind == "table":
            blocks.append(f"| a | b |\n|---|---|\n| {body.replace('|', ' ')} | 2024 |")
        elif kind == "fence":
            blocks.append(f"```\n{body}\n```")
        else:
            blocks.append(body)
    return "\n\n".join(blocks) + "\n\n[label]: https://example.org/label\n"


@pytest.mark.unit
@PROPERTIES
@given(markdown_documents())
def test_generated_markdown_keeps_its_structure_urls_and_numbers(doc_text):
    doc = parse(doc_text, "markdown")
    assert doc.render(doc.identity()) == doc_text
    out = doc.render(checks.scrambled(doc), "en")
    assert checks.markdown_problems(doc_text, out) == []


# ---------------------------------------------------------------------------------------------
# linear time

SIZE = 100_000
PATHOLOGICAL = {
    "nested inline elements that start with whitespace": ("html", "<p>" + "<b> a" * (SIZE // 6) + "</b>" * (SIZE // 6) + "</p>"),
    "mismatched end tags": ("html", "<p>" + "<b>" * (SIZE // 8) + "x" + "</i>" * (SIZE // 8) + "</p>"),
    "4,000 URLs in one line": ("text", " ".join(f"ver https://example.com/{k}" for k in range(4000))),
    "a URL followed by 99,000 )": ("text", "see https://x.org/" + ")" * 99_000 + " now"),
    "a run of e-mail characters": ("text", "a " + "!#$%" * (SIZE // 4) + "@"),
    "nested emphasis": ("markdown", "*a " * (SIZE // 3)),
    "many links and code spans": ("markdown", " ".join(f"ver [x](https://e.com/{k}) `c` <https://a.b/{k}>" for k in range(SIZE // 45))),
    "elements nested around words": ("html", "<p>" + "<i>w " * (SIZE // 5) + "</i>" * (SIZE // 5) + "</p>"),
}


@pytest.mark.unit
@pytest.mark.parametrize("name", PATHOLOGICAL)
def test_pathological_input_of_100_kb_is_read_placed_and_written_in_linear_time(name):
    """Each of these took 8 to 215 s when something was quadratic; linear, each takes well under a
    second here. The bound is loose (a slow machine passes), a quadratic cost is not."""
    format, doc_text = PATHOLOGICAL[name]
    start = time.perf_counter()
    doc = parse(doc_text, format)
    out = doc.render(checks.scrambled(doc))
    assert time.perf_counter() - start < 10, f"{name}: {time.perf_counter() - start:.1f} s"
    assert out


# ---------------------------------------------------------------------------------------------
# what the audit found, each on its own

AUDIT = [
    ("html", '<p>Usa <a href="x.html"><code>String</code></a> y <code>enum</code> en la tierra.</p>'),  # crashed: a span of only code
    ("html", '<p>Visita <a href="/x"> https://example.com</a> hoy.</p>'),  # crashed: a URL after a space starting an element
    ("html", '<p>Escribe a <a href="mailto:a@b.org"> ana@example.org</a>, <b>jose@localhost</b>.</p>'),
    ("markdown", "Lee [`String`](https://doc.rust-lang.org/std/string/struct.String.html) y `&str` ahora.\n"),
    ("markdown", "Ver [http://127.0.0.1:8000/docs](http://127.0.0.1:8000/docs) o [la guía][guía] o [guía][] o [guía].\n\n"
                 "[guía]: https://example.org/g\n"),  # reference labels must still match their definition
    ("html", "<table><tr><td>2024</td><td>Año de la cosecha</td><td>[22]</td></tr></table><ol><li>1.2.3</li></ol>"),
    ("markdown", "| año | total |\n|---|---|\n| 2024 | 3.14 |\n\nNota al pie[^22] y `a` `b` juntos.\n"),
    ("markdown", "**Dijo a él, “Tú** eres _el hombre\nde la casa_ hoy.\n"),  # emphasis across a line break
    ("html", "<p>https://a.com https://b.com y https://x.org/a niños</p>"),  # URLs apart from each other and from words
]


@pytest.mark.unit
@pytest.mark.parametrize("format, doc_text", AUDIT)
def test_what_the_audit_found_holds(format, doc_text):
    doc = parse(doc_text, format)
    assert doc.render(doc.identity()) == doc_text
    out = doc.render(checks.scrambled(doc))
    assert checks.problems(doc_text, out, format) == []
    if "[guía]" in doc_text:
        assert out.count("[guía]") == doc_text.count("[guía]") and "[guía][]" in out
