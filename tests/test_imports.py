"""The import contract: no import circle among seqtool's modules, and the translation path loads no
training module (so a server or a decoding worker never pays for, or depends on, training code)."""

import ast
import json
import pathlib
import re
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "seqtool"
# what the translation path must not load: the training/ subpackage (any module of it), and binarize (data.py,
# the shard format, is shared: its packer batches decoding too)
TRAINING = {"training", "binarize"}

ARCHITECTURE = PACKAGE.parent / "ARCHITECTURE.md"


def layers(text: str) -> list[set[str]]:
    """The layers, top to bottom, as ARCHITECTURE.md's table gives them: a row per layer, its modules in
    backquotes in the second column. The document is the contract, so it cannot drift from the code."""
    rows = [line.split("|") for line in text.splitlines() if line.startswith("| ") and line.count("|") >= 4]
    out = [set(re.findall(r"`([\w.]+)`", row[2])) for row in rows if re.fullmatch(r" \d+[a-z]? ", row[1])]
    assert out and all(out), "ARCHITECTURE.md: no layer table, or a row without modules"
    return out


LAYERS = layers(ARCHITECTURE.read_text(encoding="utf-8"))
SUBPACKAGES = {"serving", "training"}  # only cli imports them


def module_name(path: pathlib.Path) -> str:
    """'translate' for seqtool/translate.py, 'serving.app' for seqtool/serving/app.py."""
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts)


def imports_of(path: pathlib.Path) -> set[str]:
    """seqtool modules that `path` imports, lazily (inside functions) or not, as module_name gives them
    (a module of a subpackage, or the subpackage itself for `from . import x` of its __init__)."""
    here = module_name(path).split(".")[:-1]  # the importing module's package, below seqtool
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level >= 1:
            base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
            if node.module:
                out.add(".".join([*base, *node.module.split(".")][: len(base) + 2]))
                continue
            out |= {".".join([*base, a.name]) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("seqtool."):
            out.add(".".join(node.module.split(".")[1:3]))
        elif isinstance(node, ast.Import):
            out |= {".".join(a.name.split(".")[1:3]) for a in node.names if a.name.startswith("seqtool.")}
    return out


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py") if p.stem != "__init__"}
    edges = {}
    for name, path in modules.items():
        found = set()
        for target in imports_of(path):
            # `from .serving.server import x` names serving.server; `from .config import y` names config
            while target and target not in modules:
                target = target.rpartition(".")[0]
            found.add(target)
        edges[name] = found - {name, ""}
    return edges


def circles(g: dict[str, set[str]]) -> list[str]:
    found = []

    def visit(node, path):
        for nxt in sorted(g[node]):
            if nxt == path[0]:
                found.append(" -> ".join(path + [nxt]))
            elif nxt not in path:
                visit(nxt, path + [nxt])

    for start in sorted(g):
        visit(start, [start])
    return found


@pytest.mark.unit
def test_no_import_circle():
    found = circles(graph())
    assert not found, "import circles: " + "; ".join(found[:5])


@pytest.mark.system
def test_the_translation_path_loads_no_training_module():
    code = "import sys, json, seqtool.translate, seqtool.search, seqtool.ensemble; " \
           "print(json.dumps(sorted(m.partition('.')[2] for m in sys.modules if m.startswith('seqtool.'))))"
    loaded = set(json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout))
    assert "translate" in loaded
    training = sorted(m for m in loaded if m.split(".")[0] in TRAINING)  # 'training.update' counts as 'training'
    assert not training, f"the translation path imports training modules: {training}"


@pytest.mark.unit
def test_the_contract_catches_a_circle(tmp_path, monkeypatch):
    """The checker itself: a planted a -> b -> a is found."""
    (tmp_path / "a.py").write_text("from . import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from .a import x\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    assert graph() == {"a": {"b"}, "b": {"a"}}
    assert circles(graph()) == ["a -> b -> a", "b -> a -> b"]


@pytest.mark.unit
def test_only_the_cli_imports_the_subpackages():
    g = graph()
    outside = [f"{m} imports {n}" for m in sorted(g) for n in sorted(g[m])
               if n.split(".")[0] in SUBPACKAGES and m.split(".")[0] != n.split(".")[0] and m != "cli"]
    assert not outside, "only cli may import a subpackage: " + "; ".join(outside)


@pytest.mark.unit
def test_every_module_imports_only_the_layers_below_it():
    layer_of = {m: i for i, layer in enumerate(LAYERS) for m in layer}
    g = graph()
    unplaced = sorted(set(g) - set(layer_of))
    assert not unplaced, f"modules in no layer (add them to ARCHITECTURE.md's table): {unplaced}"
    stale = sorted(set(layer_of) - set(g))
    assert not stale, f"ARCHITECTURE.md's table names modules that do not exist: {stale}"
    upward = [f"{m} (layer {layer_of[m]}) imports {n} (layer {layer_of[n]})"
              for m in sorted(g) for n in sorted(g[m]) if layer_of[n] <= layer_of[m]]
    assert not upward, "imports against the layers: " + "; ".join(upward)


@pytest.mark.unit
def test_the_contract_resolves_subpackages(tmp_path, monkeypatch):
    """The checker itself on a subpackage: relative imports in and out of it resolve to module names,
    and a module other than cli importing it is caught."""
    (tmp_path / "serving").mkdir()
    (tmp_path / "serving" / "__init__.py").write_text("")
    (tmp_path / "serving" / "app.py").write_text("from .schemas import X\nfrom ..config import Y\n")
    (tmp_path / "serving" / "schemas.py").write_text("from .. import errors\n")
    (tmp_path / "config.py").write_text("")
    (tmp_path / "errors.py").write_text("")
    (tmp_path / "translate.py").write_text("def f():\n    from .serving.app import Z\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    g = graph()
    assert g["serving.app"] == {"serving.schemas", "config"} and g["serving.schemas"] == {"errors"}
    assert g["translate"] == {"serving.app"}
    with pytest.raises(AssertionError, match="only cli may import a subpackage: translate imports serving.app"):
        test_only_the_cli_imports_the_subpackages()


@pytest.mark.unit
def test_the_architecture_document_is_the_contract(monkeypatch):
    """A module left out of ARCHITECTURE.md's table, or a name there that is no module, fails the layer
    test: the document cannot drift from the code (a planted misspelling proves the check fires)."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    assert "`fields`" in text
    monkeypatch.setattr(sys.modules[__name__], "LAYERS", layers(text.replace("`fields`", "`feilds`")))
    with pytest.raises(AssertionError, match=r"in no layer .*'fields'"):
        test_every_module_imports_only_the_layers_below_it()
    monkeypatch.setattr(sys.modules[__name__], "LAYERS", layers(text.replace("`fields`", "`fields`, `vanished`")))
    with pytest.raises(AssertionError, match=r"do not exist: \['vanished'\]"):
        test_every_module_imports_only_the_layers_below_it()


@pytest.mark.system
def test_documents_loads_no_model_code():
    """seqtool.documents (parsing, sentences) loads neither torch nor the model or search code."""
    code = ("import sys, seqtool.documents as d; d.parse_markdown('# x'); d.split_sentences('A. B.', 'en'); "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('seqtool.search', 'seqtool.model'))))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"
