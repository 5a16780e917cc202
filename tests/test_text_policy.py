"""One text policy for every front-end (pipeline.TextPolicy): the CLI's best and n-best lines, the
Python API, LibreTranslate's /translate with and without alternatives, and /v1/translate with and
without n-best all give the same translation of the same line: URLs and e-mail addresses verbatim
and apart from the words around them, text with no letter as it was, long lines cut into sentences
and joined back."""

import subprocess
import sys

import httpx
import pytest

from servers import FP32, Server
from seqtool.documents import placeholders

pytestmark = pytest.mark.system

LONG = " ".join(["Ab c d e f."] * 8)  # past the tiny model's 31 positions: cut into sentences
LINES = ["a b https://example.com/x?q=1 c", "d e jose@localhost, f", "2024", "[22]", "3.14 %", "g h user@example.org.",
         LONG, "visit www.example.org/a_(b) now", "c a"]


def cli(checkpoint, *args) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "seqtool", "translate", "-c", str(checkpoint), *FP32, "--beam", "2", *args],
                         input="\n".join(LINES) + "\n", capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "cropped" not in out.stderr  # (the long line was cut into sentences, each within the model's positions)
    return out.stdout.splitlines()


def test_every_front_end_gives_the_same_translation_with_the_same_handling(tiny_checkpoint):
    from seqtool.translate import Translator

    got = {"cli": cli(tiny_checkpoint)}
    rows = [row.split("\t") for row in cli(tiny_checkpoint, "--nbest", "2")]
    got["cli --nbest 2"] = [rows[2 * k][2] for k in range(len(LINES))]
    assert all(rows[2 * k][0] == rows[2 * k + 1][0] == str(k) for k in range(len(LINES)))
    with Translator.load(tiny_checkpoint, device="cpu", precision="fp32", threads=2, beam=2, max_len_b=8) as t:
        got["python"] = t.translate(LINES)
    s = Server(tiny_checkpoint, "--beam", "2")
    try:
        def post(path, body):
            r = httpx.post(f"{s.url}{path}", json=body, timeout=120)
            assert r.status_code == 200, r.text
            return r.json()

        got["/translate"] = post("/translate", {"q": LINES, "source": "auto", "target": "tgt"})["translatedText"]
        libre = post("/translate", {"q": LINES, "alternatives": 1})
        got["/translate alternatives"] = libre["translatedText"]
        got["/v1/translate"] = [x["text"] for x in post("/v1/translate", {"segments": LINES})["translations"]]
        native = post("/v1/translate", {"segments": LINES, "nbest": 2})["translations"]
        got["/v1/translate nbest"] = [x["text"] for x in native]
    finally:
        s.stop()
    for name, outputs in got.items():
        assert outputs == got["cli"], f"{name} differs from the CLI"
    for line, out in zip(LINES, got["cli"]):
        for a, b in placeholders(line):  # verbatim, and read back as itself (nothing glued to it)
            assert line[a:b] in [out[x:y] for x, y in placeholders(out)], (line, out)
        if not any(c.isalpha() for c in line):
            assert out == line
    alternatives = [alts for alts in libre["alternatives"]]
    assert len(alternatives) == len(LINES) and all(len(a) <= 1 for a in alternatives)
    for line, alts, first in zip(LINES, alternatives, native):
        for alt in alts + [x["text"] for x in first.get("alternatives", [])]:
            for a, b in placeholders(line):  # alternatives under the same policy
                assert line[a:b] in [alt[x:y] for x, y in placeholders(alt)], (line, alt)
