"""Scoring translations with sacrebleu.

Owns reading hypotheses and references (same line-ending rules as everywhere), checking that
they align, and computing BLEU / chrF / TER with sacrebleu's signatures.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from .errors import InputError
from .textio import LineDecoder, open_stdin, read_lines


def _stdin_lines() -> list[str]:
    decode = LineDecoder("<stdin>", errors="replace")
    lines = [decode(raw, n) for n, raw in enumerate(open_stdin(), 1)]
    decode.finish()
    return lines

METRICS = ("bleu", "chrf", "ter")


@dataclass
class MetricScore:
    name: str
    score: float
    signature: str
    detail: str


def score_lines(hyps: Sequence[str], refs: Sequence[Sequence[str]], metrics: Sequence[str] = ("bleu", "chrf"),
                tokenize: Optional[str] = None, lowercase: bool = False) -> list[MetricScore]:
    from sacrebleu.metrics import BLEU, CHRF, TER

    out = []
    for name in metrics:
        if name == "bleu":
            kwargs = {"lowercase": lowercase}
            if tokenize:
                kwargs["tokenize"] = tokenize
            metric = BLEU(**kwargs)
        elif name == "chrf":
            metric = CHRF(lowercase=lowercase)
        elif name == "ter":
            metric = TER(case_sensitive=not lowercase)
        else:
            raise InputError(f"unknown metric {name!r}; choose from {', '.join(METRICS)}")
        result = metric.corpus_score(list(hyps), [list(r) for r in refs])
        out.append(MetricScore(name, float(result.score), str(metric.get_signature()), str(result)))
    return out


def score_files(hyp_path: Optional[Path], ref_paths: Sequence[Path], metrics: Sequence[str], tokenize: Optional[str],
                lowercase: bool = False) -> list[MetricScore]:
    """`seqtool score`: the hypotheses of hyp_path (None: stdin, invalid UTF-8 replaced with a
    warning) against one or more references, line by line."""
    if not ref_paths:
        raise InputError("give at least one --ref file")
    for name in metrics:
        if name not in METRICS:
            raise InputError(f"unknown metric {name!r}; choose from {', '.join(METRICS)}")
    if tokenize is not None:
        from sacrebleu.metrics import BLEU

        if tokenize not in BLEU.TOKENIZERS:
            raise InputError(f"unknown --tokenize {tokenize!r}; sacrebleu offers {', '.join(sorted(BLEU.TOKENIZERS))}")
    refs = [list(read_lines(p, errors="replace")) for p in ref_paths]
    hyps = list(read_lines(hyp_path, errors="replace")) if hyp_path is not None else _stdin_lines()
    hyp_name = str(hyp_path) if hyp_path is not None else "<stdin>"
    for path, ref in zip(ref_paths, refs):
        if len(ref) != len(hyps):
            raise InputError(f"{hyp_name} has {len(hyps)} lines but {path} has {len(ref)}; hypotheses and references must align line by line")
    return score_lines(hyps, refs, metrics, tokenize, lowercase)


def print_scores(results: Sequence[MetricScore], as_json: bool) -> None:
    """`seqtool score`'s stdout: one JSON object, or a table of metric, score and signature."""
    if as_json:
        import json

        print(json.dumps({r.name: {"score": round(r.score, 4), "signature": r.signature, "detail": r.detail} for r in results}))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(show_edge=False)
    for column in ("metric", "score", "signature"):
        table.add_column(column)
    for r in results:
        table.add_row(r.name.upper() if r.name != "chrf" else "chrF", f"{r.score:.2f}", r.signature)
    Console(soft_wrap=True).print(table)
