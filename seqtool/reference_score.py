"""Scoring given translations: the model's log-probability of each reference, teacher-forced.

Owns `seqtool translate --score-reference --target FILE` (fairseq-generate's --score-reference):
input line i (stdin or --input) is paired with line i of FILE, both are tokenized (cropped to
the model's positions, with a warning), and the model reads the source and the whole reference
at once, batched by length under --max-tokens / --batch-size like translation. The score of a
reference is sum_t log p(y_t | y_<t, x) over its tokens and the end-of-sentence token, the same
quantity beam search ranks by before length normalisation (no token is banned here: an empty
reference gets log p(EOS | BOS), which search never allows as a translation).

Output, one line per input line in input order: the first three fields are those of
--print-scores, then the sum and the per-token average:

    index<TAB>score<TAB>reference<TAB>sum<TAB>average

score = sum / length^lenpen (length counts the end-of-sentence token), average = sum / length,
and the reference is printed as the model read it (decoded from its tokens).

Unequal line counts are refused naming both files and their counts: before the model loads
when the input is a file, at the end of the shorter one when it is a pipe.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator, TextIO

import torch
from torch import Tensor

from . import log, pipeline
from .errors import InputError
from .model import padded
from .textio import open_binary, read_lines, strip_line_end

BLOCK_BYTES = 1 << 20


@dataclass
class ReferenceScore:
    index: int  # 0-based input line number
    tokens: list[int]  # the reference as scored (cropped), without BOS/EOS
    text: str  # decoded from `tokens`
    logprob: float  # sum of log p over the tokens and EOS

    @property
    def length(self) -> int:
        return len(self.tokens) + 1  # + EOS

    @property
    def average(self) -> float:
        return self.logprob / self.length

    def score(self, lenpen: float = 1.0) -> float:
        """As search ranks: log p / length^lenpen."""
        return self.logprob / self.length ** lenpen


@torch.no_grad()
def reference_logprobs(model, src: Tensor, references: list[list[int]]) -> list[float]:
    """Sum of log p(y_t | y_<t, x) over each reference's tokens and its EOS, one forward pass.

    model: anything with search.py's decoder interface (a Transformer or an ensemble). src (B, S):
    ids, EOS, right padding (as search takes them); references[b]: ids without BOS/EOS."""
    c = model.config
    tgt_in = padded([[c.bos_id, *ref] for ref in references], c.pad_id, src.device)  # (B, T) BOS y1 .. yn pad
    target = padded([[*ref, c.eos_id] for ref in references], c.pad_id, src.device)  # (B, T) y1 .. yn EOS pad
    memory, src_pad = model.encode(src)
    lprobs = model.decode(tgt_in, memory, src_pad).float().log_softmax(dim=-1)  # (B, T, V)
    picked = lprobs.gather(2, target[:, :, None]).squeeze(2)  # (B, T)
    picked = picked.masked_fill(target.eq(c.pad_id), 0.0)  # right padding adds nothing
    return picked.sum(dim=1).tolist()


def score_chunk(translator, start: int, sources: list[str], references: list[str]) -> list[ReferenceScore]:
    """Scores of the references of lines start, start+1, ...; in the same order."""
    model, tokenizer = translator.model, translator.tokenizer
    src_ids = translator.encode(start, sources)
    ref_ids = tokenizer.encode_batch(references, "target")
    max_ref = model.config.max_positions - 1  # the BOS takes one position
    for k, seq in enumerate(ref_ids):
        if len(seq) > max_ref:
            log.warn(f"reference line {start + k + 1}: {len(seq)} tokens, cropped to the model's {max_ref}")
            ref_ids[k] = seq[:max_ref]
    lengths = [max(len(s), len(r)) + 1 for s, r in zip(src_ids, ref_ids)]
    logprobs: list[float] = [0.0] * len(sources)
    for batch in pipeline.pack(translator.config, lengths):
        src = translator.source_tensor([src_ids[k] for k in batch])  # (b, S)
        with torch.inference_mode():
            for k, value in zip(batch, reference_logprobs(model, src, [ref_ids[k] for k in batch])):
                logprobs[k] = value
    return [ReferenceScore(start + k, ref_ids[k], tokenizer.decode(ref_ids[k]), logprobs[k]) for k in range(len(sources))]


def format_reference(r: ReferenceScore, lenpen: float) -> str:
    text = r.text.replace("\n", " ").replace("\t", " ")  # one line, five fields
    return f"{r.index}\t{r.score(lenpen):.4f}\t{text}\t{r.logprob:.4f}\t{r.average:.4f}\n"


def count_lines(path: Path) -> int:
    """Lines as every reader here counts them: \\n-terminated, plus a last line without one."""
    count, last = 0, b"\n"
    with open_binary(path) as handle:
        try:
            while block := handle.read(BLOCK_BYTES):
                count += block.count(b"\n")
                last = block[-1:]
        except (OSError, EOFError) as error:
            raise InputError(f"{path}: cannot read: {error}") from None
    return count + (last != b"\n")


def mismatch(source_name: str, sources: int, target_name: str, targets: int, option: str = "--score-reference") -> InputError:
    what = {"--target-prefix": "one prefix per input line (an empty line: none)",
            "--constraints": "one JSON list per input line (an empty line: none)"}.get(option, "one reference per input line")
    return InputError(f"{source_name} has {sources} lines but {target_name} has {targets}; {option} needs {what}")


def check_line_counts(source: Path, target: Path, option: str = "--score-reference") -> None:
    sources, targets = count_lines(source), count_lines(target)
    if sources != targets:
        raise mismatch(str(source), sources, str(target), targets, option)


def score_stream(translator, chunks: Iterable[list[str]], source_name: str, target: Path,
                 output: TextIO, errors: str = "replace") -> int:
    """Score the references in `target` for the source lines arriving in `chunks`; write, flush per
    chunk; return the number of lines. Unequal counts: InputError naming both files and counts."""
    references: Iterator[str] = read_lines(target, errors)
    count = 0
    chunk_iter = iter(chunks)
    for chunk in chunk_iter:
        refs = [ref for _, ref in zip(range(len(chunk)), references)]
        if len(refs) < len(chunk):  # the references ended first: count the rest of the input
            rest = sum(len(c) for c in chunk_iter)
            raise mismatch(source_name, count + len(chunk) + rest, str(target), count + len(refs))
        for r in score_chunk(translator, count, chunk, refs):
            output.write(format_reference(r, translator.options.lenpen))
        output.flush()
        count += len(chunk)
    extra = sum(1 for _ in references)
    if extra:
        raise mismatch(source_name, count, str(target), count + extra)
    return count


def score_lines(translator, sources: Iterable[str], references: Iterable[str]) -> Iterator[ReferenceScore]:
    """For the Python API: scores of paired lists or iterators of strings, lazily, a chunk at a time."""
    size = translator.config.chunk_lines
    src_iter, ref_iter = iter(sources), iter(references)
    start = 0
    while True:
        src_chunk = [strip_line_end(line) for line in islice(src_iter, size)]
        ref_chunk = [strip_line_end(line) for line in islice(ref_iter, len(src_chunk))]
        if len(ref_chunk) < len(src_chunk):
            rest = sum(1 for _ in src_iter)
            raise _unequal(start + len(src_chunk) + rest, start + len(ref_chunk))
        if not src_chunk:
            break
        yield from score_chunk(translator, start, src_chunk, ref_chunk)
        start += len(src_chunk)
    extra = sum(1 for _ in ref_iter)
    if extra:
        raise _unequal(start, start + extra)


def _unequal(sources: int, references: int) -> InputError:
    return InputError(f"{sources} sources but {references} references; give one reference per source")

