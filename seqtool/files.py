"""`seqtool translate`: stdin or a file to stdout or a file, as lines or as one document.

The command's front end over the Python API (translate.Translator): the settings given on the
command line over the checkpoint's recorded defaults, the inputs checked before the model loads
(the files read line for line with the input, the glossary), the output format (n-best,
scores, alignments), a document read whole and written back in its own encoding.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional, Sequence, TextIO, Union

from . import log, textpolicy
from .alignment import format_alignment
from .config import DecodeConfig, SearchOptions, TranslateConfig
from .fields import split
from .linereader import LineReader
from .pipeline import Translation
from .textio import LockstepLines, open_binary, open_stdin
from .translate import Translator, recorded_defaults, settings


def format_translation(t: Translation, io: TranslateConfig, nbest: int) -> str:
    """Plain: the best hypothesis. With --nbest N > 1, --print-scores or --print-alignment: N
    tab-separated lines, `index score hypothesis [alignment]`.

    A hypothesis never spans lines: a \n decoded from a byte piece becomes a space."""
    texts = [text.replace("\n", " ") for text in t.texts]
    if nbest == 1 and not io.print_scores and not io.print_alignment:
        return (texts[0] if texts else "") + "\n"
    rows = [f"{t.index}\t{h.score:.4f}\t{text}" for h, text in zip(t.hypotheses, texts)]
    if io.print_alignment:
        rows = [f"{row}\t{format_alignment(a)}" for row, a in zip(rows, t.alignments or [])]
    if not rows:  # an empty line: one empty hypothesis, still N lines as promised
        rows = [f"{t.index}\t0.0000\t" + ("\t" if io.print_alignment else "")] * nbest
    rows += [rows[-1]] * (nbest - len(rows))
    return "\n".join(rows) + "\n"


def translate_command(checkpoints: list[Path], input: Optional[Path], output: Optional[Path], given: dict[str, Any]) -> None:
    """`seqtool translate`: the settings given (options.py: field name -> value) over the checkpoint's
    recorded decoding defaults (a student's beam 1), stdin or `input` to stdout or `output` (written
    atomically, never over one of the files it reads)."""
    mine, rest = split(given, TranslateConfig)
    io = TranslateConfig(**mine)
    config, options = settings(recorded=recorded_defaults(checkpoints), **rest)
    ensemble_or_one = checkpoints[0] if len(checkpoints) == 1 else checkpoints  # one stays a plain Path
    if output is None:
        translate_file(ensemble_or_one, config, options, io, input)
        return
    from .textio import atomic_text_output, check_output_file

    check_output_file(output, [("--input", input)] + [(f"--{k.replace('_', '-')}", Path(getattr(io, k)) if getattr(io, k) else None)
                                                      for k in ("target", "target_prefix", "constraints", "glossary")]
                      + [("--checkpoint", c) for c in checkpoints])
    with atomic_text_output(output) as handle:
        translate_file(ensemble_or_one, config, options, io, input, handle)


def translate_file(checkpoint_path: Union[Path, Sequence[Path]], config: DecodeConfig, options: SearchOptions,
                   io: TranslateConfig, input_path: Optional[Path] = None, output: Optional[TextIO] = None) -> int:
    """The `seqtool translate` command: stdin (or --input) to stdout (or an open output); returns lines.

    checkpoint_path: one checkpoint, or several for an ensemble. config: how the process decodes;
    options: the search; io: the files read with the input and the output's format (auto: chosen
    from --input's name). With io.score_reference, the lines of io.target are scored instead
    (reference_score.py). A document (html, markdown) is read whole, as bytes, and written back in
    its own encoding, BOM and line ends."""
    from .documents.formats import choose_format

    io = io.replace(format=choose_format(io.format, str(input_path) if input_path is not None else None))
    io.check(options)
    # the inputs first: a missing file or a closed stdin is reported before the model loads
    if input_path is not None:
        stream, name = open_binary(input_path), str(input_path)
    else:
        stream, name = open_stdin(unbuffered=io.format == "text"), "<stdin>"  # (lines: read by LineReader's thread)
    paired = [(Path(f), o) for f, o in ((io.target, "--score-reference"), (io.target_prefix, "--target-prefix"),
                                        (io.constraints, "--constraints")) if f]
    for second, option in paired:  # files read line for line with the input
        from .reference_score import check_line_counts

        open_binary(second).close()
        if input_path is not None:
            check_line_counts(input_path, second, option)
    glossary = None
    if io.glossary:
        from .terms import Glossary

        glossary = Glossary.read(Path(io.glossary), io.glossary_ignore_case)
    if output is None:
        sys.stdout.reconfigure(encoding="utf-8", newline="\n")  # type: ignore[attr-defined]
    config = config.replace(alignments=config.alignments or io.print_alignment)
    with Translator.load(checkpoint_path, config, options, src_lang=io.src_lang, tgt_lang=io.tgt_lang,
                         need_target=True) as translator:  # (stops --workers processes at the end)
        output = output or sys.stdout
        if io.format != "text":  # one document in, one out
            return _translate_document(translator, stream, name, io, options, glossary, output)
        reader = LineReader(stream, name, errors=io.errors)
        if io.score_reference:
            from .reference_score import score_stream

            return score_stream(translator, reader.chunks(config.chunk_lines), name, Path(io.target), output, io.errors)
        count = 0
        policy = textpolicy.TextPolicy.choose(io.split_sentences, alignments=io.print_alignment,
                                            whole=bool(io.target_prefix or io.constraints or io.glossary))
        prefixes = LockstepLines(Path(io.target_prefix), name, "--target-prefix", "one line per input line (an empty line: no prefix)", io.errors) if io.target_prefix else None
        wanted = LockstepLines(Path(io.constraints), name, "--constraints", "one JSON list per input line (an empty line: none)", io.errors) if io.constraints else None
        for chunk in reader.chunks(config.chunk_lines):
            if count == 0 and input_path is None:
                _say_if_html(chunk)
            constraints = None
            if wanted or glossary:
                from .terms import parse_constraints_line

                given = wanted.take(count, len(chunk)) if wanted else [""] * len(chunk)
                constraints = [parse_constraints_line(c, f"{io.constraints}:{count + k + 1}") + (glossary.match(line) if glossary else [])
                               for k, (c, line) in enumerate(zip(given, chunk))]
            for t in translator.translate_lines(count, chunk, options, policy, prefixes.take(count, len(chunk)) if prefixes else None,
                                                constraints):
                output.write(format_translation(t, io, options.nbest))
            output.flush()
            count += len(chunk)
        for lockstep in (prefixes, wanted):
            if lockstep:
                lockstep.finish(count)
        return count


def _say_if_html(chunk: list[str]) -> None:
    from .documents.formats import looks_like_html

    if looks_like_html("\n".join(chunk)):
        log.warn("<stdin> looks like HTML and is read as lines of text; --format html translates it as a document")


def _translate_document(translator: Translator, stream, name: str, io: TranslateConfig, options: SearchOptions,
                        glossary, output: TextIO) -> int:
    """One document from stream to output, in its own encoding; returns its lines."""
    from .documents.formats import read_document

    data = stream.read()
    if name != "<stdin>":
        stream.close()
    doc, encoding = read_document(data, io.format, name, io.errors)
    out = translator.translate_document(doc, io.format, options, io.split_sentences, glossary,
                                        attributes=not io.keep_attributes, name=name)
    output.flush()
    target = getattr(output, "buffer", None)
    if target is not None:
        target.write(encoding.encode(out))
        target.flush()
    else:  # a text stream with no bytes underneath (a test's StringIO)
        output.write(out)
        output.flush()
    return doc.count("\n") + (1 if doc and not doc.endswith("\n") else 0)
