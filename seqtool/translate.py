"""Text in, translations out, in input order: the Translator, seqtool's Python API.

`Translator` loads a checkpoint (or an ensemble) once and is the Python API for programs that embed
seqtool (`from seqtool import Translator`); files.py's translate_file, the `seqtool translate`
command, and the server use it. All are front-ends of the one decode pipeline (pipeline.py): text
becomes Segments (encoded, long ones cut into pieces), the pipeline batches, searches and detokenizes them. A
bounded chunk of lines is read at a time (when input pauses, what has arrived is translated
within ~50 ms rather than waiting for a full chunk), in a thread (linereader.py), and each chunk's
translations are written and flushed in input order. With --workers N the batches of a chunk are
searched by N processes (workers.py) and everything else stays here.
"""

from __future__ import annotations

import functools
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Union

import torch

from . import allocator, ensemble, log, pipeline, precision, textpolicy
from .alignment import pairs, resolve_layer
from .errors import ConfigError, InputError
from .fields import split
from .config import DecodeConfig, Sampling, SearchOptions
from .languages import Languages
from .model import padded
from .constraints import WordPieces
from .pipeline import Origin, Translation
from .search import search
from .steps import Hypothesis
from .textio import strip_line_end
from .tokenizer import Tokenizer
from .device import announce, auto_precision, pick_device, resolve_precision, sdpa_without_cudnn

__all__ = ["Translator", "Translation", "settings"]


def settings(config: Optional[DecodeConfig] = None, options: Optional[SearchOptions] = None,
             recorded: Optional[dict[str, Any]] = None, **changes: Any) -> tuple[DecodeConfig, SearchOptions]:
    """A process's DecodeConfig and its default SearchOptions from keyword settings, each sent to the
    config that has the field: `beam=5, device="cpu", sampling=True, topk=10`. sampling: True (with
    topk/topp/temperature/seed), False or a Sampling; print_alignment is alignments. recorded: the
    checkpoint's decoding defaults (checkpoint.recorded_decoding), under the changes: a setting that
    is not given takes the checkpoint's value, except those that clash with a given setting (the
    student's beam 1 with nbest 4, its int8 with precision bf16): they are left out, with a note."""
    if recorded:
        import itertools

        wanted = [k for k in recorded if k not in changes]
        for n in range(len(wanted), 0, -1):  # as many of the checkpoint's defaults as go with what is given
            for kept in itertools.combinations(wanted, n):
                try:
                    resolved = settings(config, options, **{**{k: recorded[k] for k in kept}, **changes})
                except ConfigError:
                    continue
                if n < len(wanted):
                    log.info(f"the checkpoint's decoding defaults {', '.join(f'{k} {recorded[k]}' for k in wanted if k not in kept)} "
                             "do not go with the settings given; left out")
                return resolved
    config, options = config or DecodeConfig(), options or SearchOptions()
    if "print_alignment" in changes:
        changes["alignments"] = changes.pop("print_alignment")
    drawn = {f.name: changes.pop(f.name) for f in fields(Sampling) if f.name in changes}
    sampling = changes.pop("sampling", options.sampling is not None)
    if sampling is True:
        sampling = Sampling(**drawn) if options.sampling is None else options.sampling.replace(**drawn)
    elif sampling is False or sampling is None:
        if drawn:
            raise ConfigError(f"{', '.join('--' + k for k in drawn)} shape --sampling; add --sampling")
        sampling = None
    decode, search, unknown = split(changes, DecodeConfig, SearchOptions)
    if unknown:
        known = sorted(f.name for cls in (DecodeConfig, SearchOptions) for f in fields(cls))
        raise ConfigError(f"unknown setting(s) {', '.join(sorted(unknown))}; known: {', '.join(known)}")
    config = DecodeConfig.from_dict({**config.to_dict(), **decode})
    options = options.replace(sampling=sampling, **search)
    return config, options


def recorded_defaults(checkpoints: Union[Path, Sequence[Path]]) -> dict[str, Any]:
    """The decoding defaults the (first) checkpoint records: what `settings(recorded=...)` takes."""
    first = checkpoints if isinstance(checkpoints, (str, Path)) else checkpoints[0]
    from .checkpoint import recorded_decoding

    return recorded_decoding(Path(first))


class Translator:
    """Load a checkpoint (or an ensemble of several) once, translate many lines.

    >>> t = Translator.load("run/best.pt", beam=5)        # any DecodeConfig or SearchOptions field, e.g. quantize="int8"
    >>> t.translate(["Hola mundo."])                       # a list in, a list out

    `config` is how the process decodes (DecodeConfig); `options` the search a call gets unless it
    asks for another (SearchOptions). Like config.threads (torch.set_num_threads), loading for CPU
    changes the process: glibc keeps freed memory for reuse (allocator.keep_freed_memory).
    """

    def __init__(self, model, tokenizer: Tokenizer, config: DecodeConfig, device: torch.device, pool=None,
                 configs: Optional[dict] = None, options: Optional[SearchOptions] = None):
        self.model, self.tokenizer, self.config, self.device = model, tokenizer, config, device
        self.pool = pool  # workers.WorkerPool that decodes the batches when config.workers > 1
        self.configs: dict = configs or {}  # the (first) checkpoint's training configs: model, optim, train (its languages)
        self.max_src = model.config.max_positions - 1  # room for the EOS
        # attention weights come from one network: an ensemble's first member aligns
        self.aligner = model.models[0] if isinstance(model, ensemble.Ensemble) else model
        self.options = options or SearchOptions()  # what a call gets unless it asks otherwise
        if config.alignments:
            resolve_layer(config.alignment_layer, self.aligner.config.decoder_layers, "--alignment-layer")  # fail before reading input
        self._word_pieces: Optional[WordPieces] = None
        self.languages = Languages.from_dict(self.configs.get("languages"))  # None: a one-pair model
        self.src_lang = ""  # as said by choose_languages
        self.tag: Optional[int] = None  # the target-language tag every segment gets unless it has its own

    @property
    def source_lang(self) -> str:
        """The source language: the one said (choose_languages), else the one the model was trained on
        ("" when neither says)."""
        return self.src_lang or (self.configs.get("train") or {}).get("src_lang") or ""

    def choose_languages(self, src_lang: str = "", tgt_lang: str = "") -> None:
        """--src-lang/--tgt-lang: for a multilingual model, the target's tag (a model with one target
        needs none said; one with several translates nothing until a target is chosen, here or per
        segment: pipeline.run's error lists them) and a warning for a pair it never trained on; for
        a one-pair model, a check that they are its languages."""
        train = self.configs.get("train") or {}
        if self.languages is None:
            for option, asked, held in (("--src-lang", src_lang, train.get("src_lang")), ("--tgt-lang", tgt_lang, train.get("tgt_lang"))):
                if asked and held and asked != held:
                    raise ConfigError(f"{option} {asked}: this model translates {train.get('src_lang')} -> {train.get('tgt_lang')}")
            self.src_lang = src_lang
            return
        targets = self.languages.targets
        if not tgt_lang:
            if len(targets) > 1:  # chosen per request (the server), or missing (pipeline.run says so)
                if src_lang:
                    self.languages.check_source(src_lang)
                self.src_lang = src_lang
                return
            tgt_lang = targets[0]
        tag = self.languages.tag(tgt_lang)
        if src_lang:
            self.languages.check_source(src_lang)
            if src_lang == tgt_lang:
                raise ConfigError(f"--src-lang and --tgt-lang are both {src_lang}")
            if self.languages.zero_shot(src_lang, tgt_lang):
                log.warn(f"{src_lang} -> {tgt_lang} was not trained (zero-shot: the model learnt {', '.join(f'{s}-{t}' for s, t in self.languages.pairs)}); "
                         "expect lower quality")
        self.src_lang, self.tag = src_lang, tag

    def piece(self, i: int) -> str:
        """The piece of id i, a target-language tag as >>lang<<."""
        name = self.languages.tag_name(i) if self.languages is not None else None
        return f">>{name}<<" if name is not None else self.tokenizer.id_to_piece(i)

    @property
    def word_pieces(self) -> WordPieces:
        """Which pieces continue a word and which open one (for constraints as whole words); built once."""
        if self._word_pieces is None:
            n = self.model.config.vocab_size
            pieces = [self.tokenizer.id_to_piece(i) if i < self.tokenizer.vocab_size else "" for i in range(n)]
            self._word_pieces = WordPieces.of(pieces, self.device)
        return self._word_pieces

    @classmethod
    def load(cls, path: Union[str, Path, Sequence[Union[str, Path]]], config: Optional[DecodeConfig] = None,
             options: Optional[SearchOptions] = None, src_lang: str = "", tgt_lang: str = "", need_target: bool = False,
             **changes) -> "Translator":
        """path: a checkpoint, or a list of checkpoints to translate with as an ensemble. changes:
        DecodeConfig and SearchOptions fields over `config` and `options` (settings() says how);
        without `config` and `options`, over the decoding defaults the checkpoint records (a
        distilled student's greedy search), which `config` and `options` replace when given.
        src_lang, tgt_lang: as choose_languages (a multilingual model with several targets needs tgt_lang
        before it translates; need_target: at once, as the CLI does, so that the error is the only line)."""
        recorded = recorded_defaults(path) if config is None and options is None else None
        config, options = settings(config, options, recorded, **changes)
        if config.threads:
            torch.set_num_threads(config.threads)
        device = pick_device(config.device)
        chose = ""
        if config.precision == "auto":  # resolved once here: workers and ensembles get the choice
            chosen, why = ("fp32", "int8 computes in int8 and float32") if config.quantize != "none" else \
                auto_precision(device, "translate")
            config, chose = config.replace(precision=chosen), announce(chosen, why)
        else:
            resolve_precision(config.precision, device, "translate")  # refuses or warns where it cannot run well
        precision.check(device, config.precision, config.quantize)
        if device.type == "cuda":
            sdpa_without_cudnn()  # no execution plan built per step (device.py)
        if device.type == "cpu":
            allocator.keep_freed_memory()  # no page faults for every step's buffers (allocator.py)
        paths = [Path(path)] if isinstance(path, (str, Path)) else [Path(p) for p in path]
        use_workers = config.workers > 1
        if use_workers and device.type != "cpu":
            raise ConfigError(f"--workers runs CPU decoding processes; on {device.type} use one (drop --workers)")
        if use_workers:  # the workers hold the models: N workers, N models
            model, tokenizer_bytes, configs = ensemble.load_header(paths)
        else:
            model, tokenizer_bytes, configs = ensemble.load(paths, device, config.precision, config.quantize)
        tokenizer = Tokenizer(tokenizer_bytes, f"{paths[0]} (tokenizer)")
        pool = None
        if use_workers:
            from .workers import WorkerPool

            each = max(1, (config.threads or torch.get_num_threads()) // config.workers)
            # each worker loads its own Translator of one process and `each` threads (load sets them)
            load = functools.partial(cls.load, paths if len(paths) > 1 else paths[0],
                                     config.replace(workers=1, threads=each), options)
            pool = WorkerPool(load, config.workers)
        translator = cls(model, tokenizer, config, device, pool, configs, options)
        try:
            translator.choose_languages(src_lang, tgt_lang)
            if need_target:
                pipeline.check_target(translator)
        except BaseException:
            translator.close()
            raise
        if chose:
            log.info(chose)  # once all is loaded and checked: an error stays the only line
        return translator

    def close(self) -> None:
        """Stop the worker processes (with workers > 1); the Translator is not used after this."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def __enter__(self) -> "Translator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def encode(self, start: int, lines: list[str], what: str = "input line") -> list[list[int]]:
        """Token ids of each line as the model reads them (a multilingual model's target tag first),
        cropped to the model's positions with a warning naming `what` and the line number."""
        lead = [] if self.tag is None else [self.tag]
        return [(lead + s.ids)[: self.max_src] for s in pipeline.encode(self, lines, pipeline.lines(start, lines, what))]

    def source_tensor(self, rows: list[list[int]]) -> torch.Tensor:
        """(B, S) ids + EOS, right-padded, on the device: what search and scoring take."""
        c = self.model.config
        return padded([[*r, c.eos_id] for r in rows], c.pad_id, self.device)  # (B, S)

    def translate_chunk(self, start: int, lines: list[str], options: Optional[SearchOptions] = None,
                        prefixes: Optional[list[str]] = None, constraints: Optional[list[list]] = None) -> list[Translation]:
        """Translate lines numbered start, start+1, ...; results in the same order. options: this
        call's search (default: the Translator's). prefixes: each line's target prefix ("" none):
        its translation starts with it. constraints: each line's phrases (terms.py items: a phrase
        or a list of alternative phrases) that its translation must contain."""
        segments = pipeline.encode(self, lines, pipeline.lines(start, lines, "input line"), prefixes, constraints)
        return pipeline.run(self, segments, options or self.options)

    def translate_lines(self, start: int, lines: list[str], options: Optional[SearchOptions] = None,
                        policy: Optional[textpolicy.TextPolicy] = None, prefixes: Optional[list[str]] = None,
                        constraints: Optional[list[list]] = None, glossary=None) -> list[Translation]:
        """Lines numbered start, start+1, ... translated under the one text policy (textpolicy.TextPolicy:
        placeholders, letterless pass-through, sentences; default: the policy for these options and
        inputs), one Translation per line with every alternative asked for. prefixes: each line's
        target prefix ("" none); constraints: each line's phrases (terms.py items); glossary
        (terms.Glossary): each line's terms become constraints."""
        options = options or self.options
        if policy is None:
            policy = textpolicy.TextPolicy.choose(alignments=self.config.alignments,
                                                whole=prefixes is not None or constraints is not None or glossary is not None)
        origins = pipeline.lines(start, lines, "input line")
        plan = textpolicy.unit_segments(self, textpolicy.units_of(lines, policy), origins, policy, self.source_lang, prefixes,
                                      constraints, glossary)
        textpolicy.tell(plan.notes)
        translations = pipeline.run(self, plan.segments, options)
        return textpolicy.lines_translated(self, lines, plan, translations, origins)

    def translate_document(self, doc: str, format: str = "html", options: Optional[SearchOptions] = None,
                           split: str = "auto", glossary=None, attributes: bool = True, name: str = "") -> str:
        """A whole document (format "text", "html" or "markdown": documents.parse) translated: its text
        units (paragraphs, headings, list items, cells, readable attribute values, ...) cut into
        sentences by `split`, all searched together under the one text policy, their inline markup and
        placeholders put back on the translated words by the model's alignments, `<html lang>` set to
        the target language; every other byte of the document kept. glossary (terms.Glossary): each
        sentence's terms become its constraints. attributes: translate title, alt, ... (html)."""
        from .documents.formats import parse

        options = options or self.options
        if options.nbest > 1:
            raise ConfigError(f"a {format} document is translated into one document; drop nbest ({options.nbest})")
        document = parse(doc, format, attributes)
        for note in document.notes:
            log.warn(f"{name or format + ' document'}: {note}")
        origins = [Origin(0, k, 0, f"{name or format} block {k + 1}") for k in range(len(document.units))]
        policy = textpolicy.TextPolicy(split)
        plan = textpolicy.unit_segments(self, document.units, origins, policy, self.source_lang, glossary=glossary, blocks=True)
        textpolicy.tell(plan.notes)
        translations = pipeline.run(self, plan.segments, options)
        return document.render(textpolicy.assemble(self, plan, translations), self.target_lang or None)

    @property
    def target_lang(self) -> str:
        """The language translated into: the one chosen (a multilingual model), else the model's ("" when unknown)."""
        if self.tag is not None and self.languages is not None:
            return self.languages.tag_name(self.tag) or ""
        return (self.configs.get("train") or {}).get("tgt_lang") or ""

    def constraint_ids(self, items: list) -> list[list[list[int]]]:
        """A line's constraint items as groups of alternative token sequences. Each phrase gives the
        pieces the tokenizer writes for it as a word of its own (at a sentence's start or after a
        space: the same with sentencepiece's dummy prefix) and, where they differ, for it attached to
        what precedes it (after a quote or bracket: "(heavens" splits as ( he av ens), so the phrase
        is found however it is split in context."""
        phrases = [form for item in items for form in ([item] if isinstance(item, str) else item)]
        if not phrases:
            return []
        alone = self.tokenizer.encode_batch(phrases, "target")
        lead = self.tokenizer.encode_batch([ATTACH], "target")[0]
        attached = [ids[len(lead):] if ids[: len(lead)] == lead else [] for ids in self.tokenizer.encode_batch([ATTACH + p for p in phrases], "target")]
        forms = iter(zip(alone, attached))
        groups = []
        for item in items:
            alternatives: list[list[int]] = []
            for _ in [item] if isinstance(item, str) else item:
                for ids in next(forms):
                    if ids and ids not in alternatives:
                        alternatives.append(ids)
            groups.append(alternatives)
        return groups


    def search_batch(self, rows: list[list[int]], keys: list[int], options: Optional[SearchOptions] = None,
                     prefixes: Optional[list[list[int]]] = None, constraints: Optional[list] = None, align: bool = False,
                     wanted: Optional[Callable[[], Optional[torch.Tensor]]] = None) -> tuple[list[list[Hypothesis]], Optional[list]]:
        """One batch: token ids (without EOS) of each sentence and its key (input line number) ->
        hypotheses per sentence, and with print_alignment (or `align`: markup to place) every
        hypothesis's alignment, from the search's own attention (search.py). prefixes: each sentence's
        target prefix ids (empty: none); sentences with prefixes of one length are searched together,
        the prefix decoded in one pass. constraints: each sentence's groups of alternative token
        sequences (constraint_ids). wanted: which sentences are still wanted (search.py). Worker
        processes run this."""
        c, options = self.config, options or self.options
        src = self.source_tensor(rows)  # (b, S)
        by_length: dict[int, list[int]] = {}
        for i in range(len(rows)):
            by_length.setdefault(len(prefixes[i]) if prefixes else 0, []).append(i)
        hyps: list = [None] * len(rows)
        layer = resolve_layer(c.alignment_layer, self.aligner.config.decoder_layers, "--alignment-layer") if c.alignments or align else None
        with torch.inference_mode():  # the model is already in its decoding precision (precision.py)
            for n, group in by_length.items():
                part = src if len(group) == len(rows) else self.source_tensor([rows[i] for i in group])
                prefix = torch.tensor([prefixes[i] for i in group], device=self.device) if n else None
                found = search(self.model, part, options, keys=torch.tensor([keys[i] for i in group]) if options.sampling else None,
                               prefix=prefix, constraints=[constraints[i] for i in group] if constraints else None,
                               pieces=self.word_pieces if constraints else None,
                               wanted=_subset(wanted, group) if wanted is not None and len(group) < len(rows) else wanted,
                               align_layer=layer)
                for i, h in zip(group, found):
                    hyps[i] = h
        aligned = [[pairs(h.alignment) for h in sent] for sent in hyps] if layer is not None else None
        return hyps, aligned

    def translate(self, lines: Union[str, Iterable[str]], options: Optional[SearchOptions] = None,
                  target_prefix: Union[None, str, Iterable[str]] = None, constraints: Optional[Iterable] = None):
        """For programs that embed seqtool: one string -> its translation; a list or tuple -> a list;
        any other iterable (a file, a generator) -> a lazy iterator that reads `chunk_lines` lines
        ahead. With nbest > 1 each translation is a list of nbest strings, best first. options:
        this call's search (default: the config's). target_prefix: what the translation starts
        with (a string for one line, else one per line, "" for none). constraints: what it must
        contain: for one line a list of phrases (a list inside: one of these forms), else one
        such list per line (terms.py)."""
        options = options or self.options
        if isinstance(lines, str):
            prefixes = None if target_prefix is None else [target_prefix]
            found = self.translate_stream([lines], options, prefixes, None if constraints is None else [constraints])
            return self._texts(next(iter(found)), options.nbest)
        results = (self._texts(t, options.nbest) for t in self.translate_stream(lines, options, target_prefix, constraints))
        return list(results) if isinstance(lines, (list, tuple)) else results

    @staticmethod
    def _texts(t: Translation, nbest: int):
        if nbest == 1:
            return t.texts[0] if t.texts else ""
        return list(t.texts) or [""] * nbest

    def score(self, sources: Iterable[str], references: Iterable[str]):
        """The model's log-probability of each reference given its source (as --score-reference):
        ReferenceScore objects (.logprob, .average, .score(lenpen), .text), lazily a chunk at a time."""
        from .reference_score import score_lines

        return score_lines(self, sources, references)

    def translate_stream(self, lines: Iterable[str], options: Optional[SearchOptions] = None,
                         prefixes: Optional[Iterable[str]] = None, constraints: Optional[Iterable] = None) -> Iterator[Translation]:
        """Translations of `lines`, a chunk at a time; prefixes: one target prefix per line;
        constraints: one list of constraint items per line (terms.py)."""
        if isinstance(prefixes, str):
            raise ConfigError("target_prefix: one string per line for several lines (a list), not one string")
        from .terms import parse_items

        given = {"target_prefix": None if prefixes is None else iter(prefixes),
                 "constraints": None if constraints is None else iter(constraints)}

        def take(what: str, start: int, n: int) -> Optional[list]:
            source = given[what]
            if source is None:
                return None
            got = [item for _, item in zip(range(n), source)]
            if len(got) < n:
                raise InputError(f"{what}: {start + len(got)} items for more lines; give one per line")
            if what == "target_prefix":
                return [strip_line_end(p) for p in got]
            return [parse_items(list(c), f"constraints of line {start + k + 1}") for k, c in enumerate(got)]

        def run(start: int, chunk: list[str]) -> list[Translation]:
            return self.translate_lines(start, chunk, options, None, take("target_prefix", start, len(chunk)),
                                        take("constraints", start, len(chunk)))

        chunk: list[str] = []
        start = 0
        for line in lines:
            chunk.append(strip_line_end(line))
            if len(chunk) >= self.config.chunk_lines:
                yield from run(start, chunk)
                start += len(chunk)
                chunk = []
        if chunk:
            yield from run(start, chunk)
            start += len(chunk)
        for what, source in given.items():
            if source is not None and next(source, None) is not None:
                raise InputError(f"{what}: more items than the {start} lines; give one per line")


def _subset(wanted: Callable[[], Optional[torch.Tensor]], group: list[int]) -> Callable[[], Optional[torch.Tensor]]:
    def part() -> Optional[torch.Tensor]:
        w = wanted()
        return None if w is None else w[group]
    return part


ATTACH = "("  # what a phrase is written after to see its pieces when attached to a preceding character
