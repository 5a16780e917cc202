"""What each endpoint does, as methods of one `Service` that holds the server's state (the model, its
batcher, the limits, keys and metrics); app.py only routes HTTP to them, so each can be tested apart.

Every translation request goes the same way: its body read within the size limit and parsed off the
event loop (schemas.parse), the key and the request rate admitted (access.py), its size checked
(413) and its options checked against the bounds and the caps (422), its text work done in a worker
thread (prepare.lines, prepare.documents), then queued (batcher.py) and awaited until its results, its timeout (504:
its segments are dropped, also from a running batch) or its client going away (499).

--request-timeout bounds the whole request from its arrival: the text work before and after the
model stops at it too (interrupts.check_deadline between texts, blocks and segments: 504), and a
request over HEAVY_CHARS does its text work on a pool of its own (HEAVY_WORKERS threads), so
large documents never keep a small request waiting for a thread.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import hashlib
import json
import os
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

from .. import log
from ..config import DecodeConfig, SearchOptions, ServeConfig
from ..errors import ConfigError, InputError, ResourceError, SeqtoolError
from ..interrupts import TimeUp, set_deadline, time_left
from . import prepare
from .access import Keys, RateLimit, bearer, body_limit, read_body, read_keys, too_large
from .batcher import Batcher, TooLarge
from .metrics import Metrics
from .schemas import BadRequest, DetectRequest, LibreRequest, TranslateIn, asked, multipart_fields, parse

HTTP_STATUS: dict[type, int] = {TooLarge: 413, InputError: 400, ConfigError: 422, ResourceError: 503, SeqtoolError: 400}
RETRY_AFTER_SECONDS = 1
INLINE_BYTES = 16384  # a body this small is parsed on the event loop (measured: ~3 us for a one-segment request)
HEAVY_CHARS = 20_000  # a request with more characters does its text work on the heavy pool
HEAVY_WORKERS = 1  # the heavy pool's threads: text work is Python, bound by the GIL, so a second thread adds no speed and
# doubles what a small request's thread waits for (measured: the first small request beside 4 heavy ones 1-2 s, not 3-5 s)


def http_status(error: SeqtoolError) -> int:
    for kind in sorted(HTTP_STATUS, key=lambda k: -len(k.__mro__)):  # most specific first
        if isinstance(error, kind):
            return HTTP_STATUS[kind]
    return 400


class Service:
    """The server's state and its endpoints. `load` runs in a thread at start-up; until it is done
    /health says 503 "loading"; if it fails, `failed` (the error) is set and `on_failure` is called
    (serve() then stops the server and exits 1 with the error's line)."""

    def __init__(self, checkpoints: Union[Path, Sequence[Path]], decode: DecodeConfig, options: SearchOptions, config: ServeConfig):
        self.checkpoints, self.decode, self.options, self.config = checkpoints, decode, options, config
        self.translator = None
        self.detector = None  # detect.Detector over a multilingual model's sources (source "auto", /detect)
        self.batcher: Optional[Batcher] = None
        self.failed: Optional[BaseException] = None
        self.on_failure: Callable[[], None] = lambda: None
        self.metrics = Metrics(lambda: self.batcher.depth if self.batcher else 0)
        self.keys = Keys(read_keys(Path(config.api_keys))) if config.api_keys else None
        self.rate = RateLimit(config.req_limit) if config.req_limit else None
        self.body_limit = body_limit(config.max_chars)
        self.heavy = ThreadPoolExecutor(HEAVY_WORKERS, thread_name_prefix="seqtool-heavy")

    # -- life ---------------------------------------------------------------------------------------
    def load(self) -> None:
        from ..translate import Translator

        try:
            translator = Translator.load(self.checkpoints, self.decode.replace(alignments=self.config.alignments), self.options)
            if translator.languages is not None and len(translator.languages.sources) > 1:
                from .detect import Detector

                self.detector = Detector(translator.languages.sources)
            self.translator, self.batcher = translator, Batcher(translator, self.config, self.metrics.on_batch)
            log.info(f"ready: serving on http://{self.config.host}:{self.config.port}")
        except BaseException as error:  # noqa: BLE001 - whatever it was, serve() reports it and exits
            self.failed = error
            self.on_failure()

    def close(self) -> None:
        self.heavy.shutdown(wait=False, cancel_futures=True)
        if self.batcher is not None:
            self.batcher.stop()  # in-flight requests were answered (uvicorn drains them first)
        if self.translator is not None:
            self.translator.close()

    def start(self) -> None:
        """A translation request begins: its --request-timeout runs from now, for all its work."""
        set_deadline(time.monotonic() + self.config.request_timeout)

    async def work(self, chars: int, fn: Callable, *args) -> Any:
        """fn(*args) in a worker thread (the heavy pool for a request of over HEAVY_CHARS characters),
        under the request's deadline: 504 once it has passed."""
        run = functools.partial(contextvars.copy_context().run, fn, *args)  # (the deadline goes with it)
        try:
            return await asyncio.get_running_loop().run_in_executor(self.heavy if chars > HEAVY_CHARS else None, run)
        except TimeUp:
            raise BadRequest(504, self.timed_out) from None

    @property
    def timed_out(self) -> str:
        return (f"not translated within {self.config.request_timeout:g} s (--request-timeout); "
                "the server is overloaded or the request too large")

    def ready(self):
        if self.translator is None:
            why = "the model could not be loaded" if self.failed else "the model is loading; retry in a moment"
            raise BadRequest(503, why, {"Retry-After": str(RETRY_AFTER_SECONDS)})
        return self.translator

    # -- a request's way in -------------------------------------------------------------------------
    async def body(self, request, model, name: str, form: bool = False):
        """The request model from the body: read within the size limit, parsed (in a worker thread
        when it is large)."""
        raw = await read_body(request, self.body_limit)
        if raw is None:
            raise BadRequest(413, too_large(self.body_limit))
        kind = request.headers.get("content-type", "application/json") if form else "application/json"
        if kind.lower().startswith("multipart/form-data"):
            return await asyncio.to_thread(parse, model, await multipart_fields(request.headers, raw), kind, name)
        if len(raw) <= INLINE_BYTES:  # microseconds: a thread hop would cost more than the parse
            return parse(model, raw, kind, name)
        return await asyncio.to_thread(parse, model, raw, kind, name)

    @staticmethod
    def name(request) -> str:
        """How the log names a request: an id of its own and the client's address."""
        return f"request {secrets.token_hex(3)} from {request.client.host if request.client else 'unknown'}"

    async def admitted(self, request, model, form: bool = False) -> tuple[Any, str]:
        """The request's body and name, once its key and rate are admitted: before the body is read
        when nothing admission needs is in it (no --api-keys, or the key in an Authorization
        header), so a refused client costs no body; else after."""
        name = self.name(request)
        early = self.keys is None or bearer(request.headers.get("authorization")) is not None
        if early:
            self.admit(request, None)
        body = await self.body(request, model, name, form)
        if not early:
            self.admit(request, body.api_key)
        return body, name

    def admit(self, request, api_key: Optional[str]) -> None:
        """403 without a valid key (with --api-keys), 429 past --req-limit."""
        key = bearer(request.headers.get("authorization")) or api_key
        if self.keys is not None and not self.keys.allows(key):
            raise BadRequest(403, "a valid API key is needed: give api_key in the body or an Authorization: Bearer header")
        if self.rate is not None:
            who = f"key {hashlib.sha256(key.encode()).hexdigest()[:12]}" if self.keys is not None and key else \
                (request.client.host if request.client else "unknown")
            wait = self.rate.admit(who)
            if wait is not None:
                raise BadRequest(429, f"more than {self.config.req_limit} requests in a minute (--req-limit); retry in {wait} s",
                                 {"Retry-After": str(wait)})

    async def translate(self, request, segments: list, count: int, options: SearchOptions, name: str,
                        slots: Optional[list[int]] = None) -> list:
        """Queue, wait (for the runner, the timeout or the client going away), answer: results per segment."""
        batcher = self.batcher
        try:
            job = batcher.submit(segments, count, options, asyncio.get_running_loop(), name, slots)
        except TooLarge as e:
            raise BadRequest(413, str(e)) from None
        except ResourceError as e:
            raise BadRequest(503, str(e), {"Retry-After": str(RETRY_AFTER_SECONDS)}) from None
        deadline = time.monotonic() + (time_left() or self.config.request_timeout)
        while True:
            try:
                return await asyncio.wait_for(asyncio.shield(job.done), timeout=min(0.25, max(deadline - time.monotonic(), 0)))
            except asyncio.TimeoutError:
                if time.monotonic() >= deadline:
                    batcher.cancel(job)
                    raise BadRequest(504, self.timed_out) from None
                if await request.is_disconnected():
                    batcher.cancel(job)  # nobody is waiting for it
                    raise BadRequest(499, "client closed the request") from None
            except SeqtoolError as e:
                raise BadRequest(http_status(e), str(e)) from None

    # -- the endpoints ------------------------------------------------------------------------------
    async def libre(self, request) -> dict:
        """POST /translate, LibreTranslate's shapes."""
        self.start()
        body, name = await self.admitted(request, LibreRequest, form=True)
        t = self.ready()
        if body.format not in ("text", "html"):
            raise BadRequest(400, f"format {body.format!r}: this server translates format \"text\" or \"html\"")
        texts = [body.q] if isinstance(body.q, str) else body.q
        prepare.check_size(self.config, texts)  # (every limit before any work: detection is work)
        tag = target_tag(t, body.source, body.target)
        detected = None
        if body.source == "auto" and self.detector is not None:  # LibreTranslate's detectedLanguage: the best guess
            detected = await self.work(sum(map(len, texts)), lambda: [self.detector.detect(prepare.readable(text, body.format))[0]
                                                                       for text in texts])
        options = prepare.options(t.options, self.config, {**asked(body), "nbest": body.alternatives + 1}, request="libre")
        alternatives, warnings = await self.documents(request, texts, body.format, options, name, tag=tag)  # lines, sentences, markup kept
        out: dict[str, Any] = {"translatedText": [a[0] for a in alternatives] if not isinstance(body.q, str) else alternatives[0][0]}
        if detected is not None:
            out["detectedLanguage"] = detected[0] if isinstance(body.q, str) else detected
        if body.alternatives:
            out["alternatives"] = alternatives[0][1:] if isinstance(body.q, str) else [a[1:] for a in alternatives]
        if warnings:  # a text cut to fit the model, an output at its length cap (LibreTranslate's clients ignore it)
            out["warnings"] = warnings
        return out

    async def documents(self, request, texts: list[str], format: str, options: SearchOptions, name: str,
                        split: str = "auto", tag: Optional[int] = None, glossary: Optional[dict] = None) -> tuple[list[list[str]], list[str]]:
        """Texts translated as documents (prepare.documents), their segments queued as one request:
        per text, its alternatives (best first; as many as options.nbest asks, where the text has any);
        and the response's warnings (prepare.warnings)."""
        t, chars = self.translator, sum(map(len, texts))
        docs = await self.work(chars, prepare.documents, t, name, texts, format, split, glossary)
        tagged(docs.segments, tag)
        queued = [k for k, s in enumerate(docs.segments) if s.ids]
        results = await self.translate(request, [docs.segments[k] for k in queued], len(docs.segments), options, name, queued)
        return await self.work(chars, prepare.rendered, t, docs, results), prepare.documents_warnings(t, docs, results)

    async def native(self, request) -> dict:
        """POST /v1/translate: segments with per-request search options, scores, n-best, alignments."""
        self.start()
        body, name = await self.admitted(request, TranslateIn)
        t = self.ready()
        tag = target_tag(t, body.source, body.target)
        prepare.check_size(self.config, body.segments, body.target_prefix, body.constraints, body.glossary)
        if body.alignment and not self.config.alignments:
            raise BadRequest(400, "alignment: this server was started without --alignments")
        for what, given in (("target_prefix", body.target_prefix), ("constraints", body.constraints)):
            if given is not None and len(given) != len(body.segments):
                raise BadRequest(422, f"{what}: {len(given)} {'prefixes' if what == 'target_prefix' else 'lists'} for "
                                      f"{len(body.segments)} segments; give one per segment")
        if body.format != "text":
            extras = [k for k in ("target_prefix", "constraints") if getattr(body, k)] + \
                [k for k in ("scores", "alignment") if getattr(body, k)] + (["nbest"] if (body.nbest or 1) > 1 else [])
            if extras:
                raise BadRequest(422, f"format {body.format}: a segment is a document; {', '.join(extras)} belong to format text")
        options = prepare.options(t.options, self.config, asked(body), body.sampling.model_dump() if body.sampling is not None else None,
                                  constrained=body.constraints is not None or bool(body.glossary))
        if body.format != "text":
            docs, warnings = await self.documents(request, body.segments, body.format, options, name, tag=tag, glossary=body.glossary)
            return {"translations": [{"text": alternatives[0]} for alternatives in docs], **({"warnings": warnings} if warnings else {})}
        chars = sum(map(len, body.segments))
        lines = await self.work(chars, prepare.lines, t, name, body.segments, body.target_prefix, body.constraints,
                                body.glossary, self.config.max_constraints, body.alignment)
        segments = tagged(lines.plan.segments, tag)
        queued = [k for k, s in enumerate(segments) if s.ids]
        results = await self.translate(request, [segments[k] for k in queued], len(segments), options, name, queued)
        answer = native_answer(await self.work(chars, prepare.lines_answer, t, lines, results), body, options.nbest)
        warnings = prepare.warnings(t, "segment", lines.plan.notes, prepare.translations(segments, results))
        return {**answer, **({"warnings": warnings} if warnings else {})}

    def health(self) -> tuple[dict, int]:
        if self.batcher is None:
            status = "failed" if self.failed else "loading"
            return {"status": status, **({"error": str(self.failed)} if self.failed else {})}, 503
        return {"status": "ok", "queue": self.batcher.depth, "pid": os.getpid()}, 200

    def models(self) -> dict:
        return {"models": [describe(self.ready())]}

    async def detect(self, request) -> list:
        """POST /detect, LibreTranslate's: the model's source languages for `q`, best first, with confidence."""
        body, _ = await self.admitted(request, DetectRequest, form=True)
        t = self.ready()
        if self.detector is None:
            src = t.languages.sources[0] if t.languages is not None else languages(t)[0]
            return [{"language": src, "confidence": 100.0}]
        return await asyncio.to_thread(self.detector.detect, body.q)

    def languages(self) -> list:
        """LibreTranslate's /languages: every language of the model, with what it translates into."""
        t = self.ready()
        if t.languages is None:
            src, tgt = languages(t)
            return [{"code": src, "name": src, "targets": [tgt]}, {"code": tgt, "name": tgt, "targets": []}]
        codes = sorted(set(t.languages.sources) | set(t.languages.targets))
        return [{"code": c, "name": c, "targets": list(t.languages.targets_of(c)) if c in t.languages.sources else []} for c in codes]


def target_tag(translator, source: Optional[str], target: Optional[str]) -> Optional[int]:
    """A request's `source` and `target` checked against the model: for a one-pair model, its pair
    (source "auto" or omitted fields pass); for a multilingual one, the tag of `target` (required
    when the model has several), a `source` it was trained on (any pair of those, zero-shot
    included). 400 naming the field otherwise. Source "auto" is any (the tag alone decides)."""
    langs = translator.languages
    if langs is None:
        src, tgt = languages(translator)
        if source not in (None, "auto", src) or (target is not None and target != tgt):
            raise BadRequest(400, f"this model translates {src} -> {tgt}; got source {source!r}, target {target!r}")
        return None
    if source not in (None, "auto") and source not in langs.sources:
        raise BadRequest(400, f"source {source!r}: this model translates from {', '.join(langs.sources)} (or \"auto\")")
    if target is None:
        if len(langs.targets) > 1:
            raise BadRequest(400, f"target: required; this model translates into {', '.join(langs.targets)}")
        target = langs.targets[0]
    if target not in langs.targets or target == source:
        raise BadRequest(400, f"target {target!r}: this model translates into {', '.join(langs.targets)}"
                              + (f" (and {source} into {', '.join(langs.targets_of(source))})" if source in langs.sources else ""))
    return langs.tag(target)


def tagged(segments: list, tag: Optional[int]) -> list:
    """The request's segments, each led by its target tag (a multilingual model)."""
    if tag is not None:
        for s in segments:
            s.tag = tag
    return segments


def native_answer(results: list, body: TranslateIn, nbest: int) -> dict:
    """/v1/translate's answer from one pipeline.Translation per segment."""
    from ..alignment import format_alignment

    translations = []
    for t in results:
        hyps, texts, aligned = t.hypotheses, t.texts, t.alignments
        items = []
        for k, (h, text) in enumerate(zip(hyps, texts)):
            item: dict[str, Any] = {"text": text}
            if body.scores:
                item["score"] = h.score
            if body.alignment:
                item["alignment"] = format_alignment(aligned[k]) if aligned else ""
            items.append(item)
        first = items[0] if items else {"text": "", **({"score": 0.0} if body.scores else {})}
        translations.append({**first, **({"alternatives": items[1:]} if nbest > 1 else {})})
    return {"translations": translations}


def languages(translator) -> tuple[str, str]:
    train = translator.configs.get("train", {})
    return train.get("src_lang") or "src", train.get("tgt_lang") or "tgt"


def describe(translator) -> dict[str, Any]:
    """/v1/models' entry: what the model is, never where its files are."""
    configs = translator.configs
    mc = configs.get("model", {})
    src, tgt = languages(translator)
    digest = hashlib.sha256(json.dumps(configs, sort_keys=True).encode()).hexdigest()
    return {"id": f"{src}-{tgt}-{digest[:12]}", "source": src, "target": tgt, "arch": {k: mc.get(k) for k in
            ("d_model", "encoder_layers", "decoder_layers", "n_heads", "d_ff", "pre_norm")},
            "parameters": _parameters(translator), "precision": translator.config.precision,
            "quantize": translator.config.quantize, "vocabulary": translator.tokenizer.vocab_size,
            "config_sha256": digest}


def _parameters(translator) -> Optional[int]:
    """Parameters of the model (of every member of an ensemble); None where workers hold the models."""
    import torch

    model = translator.model
    return sum(p.numel() for p in model.parameters()) if isinstance(model, torch.nn.Module) else None
