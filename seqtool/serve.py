"""`seqtool serve`: translation over HTTP, many small requests decoded in shared batches.

Owns the HTTP side (FastAPI on uvicorn, the optional extra ``seqtool[serve]``). Requests never
call the model: their segments go to the batcher (batcher.py), whose one runner thread decodes
the pending segments of every request together, so the event loop never waits on the model and
one client sending one sentence at a time shares batches with every other client.

A segment's translation does not depend on what shares its batch: Translator decodes each
sentence on its own rows (beam search keeps sentences apart; CPU encoding takes attention paths
that give the same rows whatever the padding, model.attention_path), and sampling draws from a
hash of the seed and the segment's own place in its request (search.py), not from a stream.
int8 layers scale activations per row (kernels.Int8Linear), so int8 holds the same promise. Tested
against `translate` in fp32 and int8; bench/serve.py counts the lines that still differ.

Endpoints: POST /translate (LibreTranslate's request and answer shapes), POST /v1/translate
(segments with per-request search options, scores, n-best, alignments), GET /health (503 until the
model is loaded), GET /v1/models, GET /metrics (Prometheus), GET / (a page for people), /docs.
Faults are answers: 422 names the field, 413 too much text, 503 with Retry-After when the queue is
full, 504 after --request-timeout; SeqtoolErrors map to statuses through HTTP_STATUS (errors.py's
table extended); anything else is a 500 with one line, never a traceback. SIGTERM (uvicorn) stops
accepting, answers what is in flight, then the runner stops.
"""

import asyncio
import hashlib
import importlib.util
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from . import log
from .batcher import Batcher
from .config import DecodeConfig, Sampling, SearchOptions, ServeConfig
from .errors import ConfigError, InputError, ResourceError, SeqtoolError

HTTP_STATUS: dict[type, int] = {InputError: 400, ConfigError: 422, ResourceError: 503, SeqtoolError: 400}
RETRY_AFTER_SECONDS = 1
PAGE = Path(__file__).with_name("serve_page.html")
BATCH_SECONDS_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.125, 0.15, 0.175, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5,
                         0.6, 0.8, 1, 1.5, 2, 3, 5, 10, 30)  # /metrics' batch times: fine enough for a median (bench/serve.py)


def http_status(error: SeqtoolError) -> int:
    for kind in sorted(HTTP_STATUS, key=lambda k: -len(k.__mro__)):  # most specific first
        if isinstance(error, kind):
            return HTTP_STATUS[kind]
    return 400


def require_fastapi() -> None:
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as error:
        raise ConfigError(f"seqtool serve needs {error.name}: pip install 'seqtool[serve]'") from None


# ---- the application -----------------------------------------------------------------------------
def create_app(checkpoints: Union[Path, Sequence[Path]], decode: DecodeConfig, config: ServeConfig):
    """The FastAPI application: it loads the model in a thread at start-up (so /health answers 503
    until it is ready) and stops the batcher at shutdown."""
    require_fastapi()
    from contextlib import asynccontextmanager

    import prometheus_client as prom
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, JSONResponse, Response
    from pydantic import BaseModel, Field

    from .translate import Translator

    registry = prom.CollectorRegistry()
    requests_total = prom.Counter("seqtool_requests", "HTTP requests answered", ["endpoint", "status"], registry=registry)
    latency = prom.Histogram("seqtool_request_seconds", "Time to answer a translation request", ["endpoint"], registry=registry,
                             buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
    batch_sizes = prom.Histogram("seqtool_batch_segments", "Segments decoded per batch", registry=registry,
                                 buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))
    target_tokens = prom.Counter("seqtool_target_tokens", "Target tokens decoded (best hypotheses, with EOS)", registry=registry)
    decode_seconds = prom.Counter("seqtool_decode_seconds", "Seconds the runner spent decoding", registry=registry)
    batch_seconds = prom.Histogram("seqtool_batch_seconds", "Seconds to decode one batch", registry=registry,
                                   buckets=BATCH_SECONDS_BUCKETS)
    queue_depth = prom.Gauge("seqtool_queue_segments", "Segments waiting to be decoded", registry=registry)
    state: dict[str, Any] = {"batcher": None, "translator": None, "error": None}

    def on_batch(segments: int, tokens: int, seconds: float) -> None:
        batch_sizes.observe(segments)
        target_tokens.inc(tokens)
        decode_seconds.inc(seconds)
        batch_seconds.observe(seconds)

    def load() -> None:
        try:
            translator = Translator.load(checkpoints, decode.replace(print_alignment=config.alignments))
            state["translator"], state["batcher"] = translator, Batcher(translator, config, on_batch)
            log.info(f"ready: serving on http://{config.host}:{config.port}")
        except SeqtoolError as error:
            state["error"] = str(error)
            log.error(f"the model could not be loaded: {error}")

    @asynccontextmanager
    async def lifespan(app):
        loader = threading.Thread(target=load, name="seqtool-load", daemon=True)
        loader.start()
        yield
        loader.join()
        if state["batcher"] is not None:
            state["batcher"].stop()  # in-flight requests were answered (uvicorn drains them first)
        if state["translator"] is not None:
            state["translator"].close()

    app = FastAPI(title="seqtool", summary="Transformer translation: LibreTranslate-compatible /translate and /v1/translate",
                  lifespan=lifespan)
    queue_depth.set_function(lambda: state["batcher"].depth if state["batcher"] else 0)

    def error(status: int, message: str, headers: Optional[dict] = None) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":
            return error(422, f"body: not valid JSON ({first.get('ctx', {}).get('error', 'JSON decode error')})")
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body"
        return error(422, f"{where}: {first.get('msg', 'invalid request')}")

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):
        log.error(f"{request.url.path}: unexpected {type(exc).__name__}: {exc}")
        return error(500, f"internal error ({type(exc).__name__}); see the server's log")

    def count(inner):
        """Requests by status and their latency, as plain ASGI: Starlette's BaseHTTPMiddleware would
        hide a client's disconnect from the endpoint (request.is_disconnected)."""
        async def counted(scope, receive, send):
            path = scope.get("path", "")
            if scope["type"] != "http" or path not in ("/translate", "/v1/translate"):
                return await inner(scope, receive, send)
            t0, status = time.monotonic(), [500]

            async def send_status(message):
                if message["type"] == "http.response.start":
                    status[0] = message["status"]
                await send(message)
            try:
                await inner(scope, receive, send_status)
            finally:
                requests_total.labels(path, str(status[0])).inc()
                latency.labels(path).observe(time.monotonic() - t0)
        return counted

    app.add_middleware(count)

    async def translate(request: Request, texts: list[str], options: SearchOptions, prefixes: Optional[list[str]] = None,
                        constraints: Optional[list[list]] = None) -> list:
        """Queue, wait (for the runner, the timeout or the client going away), answer: results per segment."""
        if state["batcher"] is None:
            raise _Answer(503, state["error"] or "the model is loading; retry in a moment", {"Retry-After": str(RETRY_AFTER_SECONDS)})
        if len(texts) > config.max_lines:
            raise _Answer(413, f"{len(texts)} segments in one request; this server takes at most {config.max_lines} (--max-lines)")
        chars = sum(len(t) for t in texts) + sum(len(p) for p in prefixes or [])
        if chars > config.max_chars:
            raise _Answer(413, f"{chars} characters in one request; this server takes at most {config.max_chars} (--max-chars)")
        texts = [t.replace("\r", " ").replace("\n", " ") for t in texts]  # a segment is one line
        batcher: Batcher = state["batcher"]
        try:
            job = batcher.submit(texts, options, asyncio.get_running_loop(),
                                 [p.replace("\r", " ").replace("\n", " ") for p in prefixes] if prefixes else None, constraints)
        except ResourceError as e:
            raise _Answer(503, str(e), {"Retry-After": str(RETRY_AFTER_SECONDS)}) from None
        deadline = time.monotonic() + config.request_timeout
        while True:
            try:
                return await asyncio.wait_for(asyncio.shield(job.done), timeout=min(0.25, max(deadline - time.monotonic(), 0)))
            except asyncio.TimeoutError:
                if time.monotonic() >= deadline:
                    batcher.cancel(job)
                    raise _Answer(504, f"not translated within {config.request_timeout:g} s (--request-timeout); "
                                       "the server is overloaded or the request too large") from None
                if await request.is_disconnected():
                    batcher.cancel(job)  # nobody is waiting for it
                    raise _Answer(499, "client closed the request") from None
            except SeqtoolError as e:
                raise _Answer(http_status(e), str(e)) from None

    @app.exception_handler(_Answer)
    async def answer(request: Request, exc: _Answer):
        return error(exc.status, exc.message, exc.headers)

    # -- LibreTranslate -------------------------------------------------------------------------
    class LibreRequest(BaseModel):
        q: Union[str, list[str]]
        source: str = "auto"
        target: Optional[str] = None
        format: str = "text"
        alternatives: int = Field(0, ge=0, le=16)
        api_key: Optional[str] = None

    @app.post("/translate", summary="Translate (LibreTranslate's API)")
    async def libre(body: LibreRequest, request: Request):
        t = state["translator"]
        if body.format not in ("text",):
            raise _Answer(400, f"format {body.format!r}: this server translates plain text (format \"text\")")
        if t is not None:
            src, tgt = _languages(t)
            if body.source not in ("auto", src) or (body.target is not None and body.target != tgt):
                raise _Answer(400, f"this model translates {src} -> {tgt}; got source {body.source!r}, target {body.target!r}")
        texts = [body.q] if isinstance(body.q, str) else body.q
        base = t.options if t is not None else SearchOptions()
        options = base.replace(beam=max(base.beam, body.alternatives + 1), nbest=body.alternatives + 1)
        results = await translate(request, texts, options)
        best = [r[1][0] if r[1] else "" for r in results]
        out: dict[str, Any] = {"translatedText": best[0] if isinstance(body.q, str) else best}
        if body.alternatives:
            alts = [list(r[1][1:]) for r in results]
            out["alternatives"] = alts[0] if isinstance(body.q, str) else alts
        return out

    # -- native ---------------------------------------------------------------------------------
    class SamplingIn(BaseModel):
        topk: int = Field(0, ge=0)
        topp: float = Field(1.0, gt=0.0, le=1.0)
        temperature: float = Field(1.0, gt=0.0)
        seed: int = Field(1, ge=0, lt=2 ** 63)

    class TranslateIn(BaseModel):
        segments: list[str] = Field(..., description="Sentences to translate, one per item; the answer keeps their order")
        beam: Optional[int] = Field(None, ge=1, le=64)
        lenpen: Optional[float] = None
        nbest: int = Field(1, ge=1, le=64)
        max_len_a: Optional[float] = Field(None, ge=0)
        max_len_b: Optional[int] = Field(None, ge=1)
        sampling: Optional[SamplingIn] = None
        scores: bool = False
        alignment: bool = False
        target_prefix: Optional[list[str]] = Field(None, description="One per segment (\"\" for none): its translation starts with it")
        constraints: Optional[list[list[Union[str, list[str]]]]] = Field(
            None, description="One list per segment of phrases its translation must contain (a list inside: one of these forms)")
        glossary: Optional[dict[str, Union[str, list[str]]]] = Field(
            None, description="Source term -> target term (or forms): a term found in a segment (whole words) constrains its translation")

    @app.post("/v1/translate", summary="Translate segments with per-request search options")
    async def native(body: TranslateIn, request: Request):
        t = state["translator"]
        base = t.options if t is not None else SearchOptions()
        if body.alignment and not config.alignments:
            raise _Answer(400, "alignment: this server was started without --alignments")
        asked = {k: v for k, v in (("lenpen", body.lenpen), ("max_len_a", body.max_len_a), ("max_len_b", body.max_len_b))
                 if v is not None}  # the rest as the server's defaults
        try:
            options = base.replace(beam=body.beam or max(base.beam, body.nbest), nbest=body.nbest, **asked,
                                   sampling=Sampling(**body.sampling.model_dump()) if body.sampling is not None else None)
        except ConfigError as e:  # the message names options (--nbest); here they are fields (nbest)
            raise _Answer(422, re.sub(r"--([a-z-]+)", lambda m: m.group(1).replace("-", "_"), str(e))) from None
        if body.target_prefix is not None and len(body.target_prefix) != len(body.segments):
            raise _Answer(422, f"target_prefix: {len(body.target_prefix)} prefixes for {len(body.segments)} segments; give one per segment")
        if body.constraints is not None and len(body.constraints) != len(body.segments):
            raise _Answer(422, f"constraints: {len(body.constraints)} lists for {len(body.segments)} segments; give one per segment")
        constraints = None
        if body.constraints is not None or body.glossary:
            from .terms import Glossary, parse_items

            glossary = Glossary([(k, [v] if isinstance(v, str) else v) for k, v in (body.glossary or {}).items()])
            try:
                constraints = [parse_items((list(body.constraints[k]) if body.constraints else []) + glossary.match(text),
                                           f"constraints of segment {k + 1}") for k, text in enumerate(body.segments)]
            except InputError as e:
                raise _Answer(422, str(e)) from None
        results = await translate(request, body.segments, options, body.target_prefix, constraints)
        from .alignment import format_alignment

        translations = []
        for hyps, texts, aligned in results:
            items = []
            for k, (h, text) in enumerate(zip(hyps, texts)):
                item: dict[str, Any] = {"text": text}
                if body.scores:
                    item["score"] = h.score
                if body.alignment:
                    item["alignment"] = format_alignment(aligned[k]) if aligned else ""
                items.append(item)
            first = items[0] if items else {"text": "", **({"score": 0.0} if body.scores else {})}
            translations.append({**first, **({"alternatives": items[1:]} if body.nbest > 1 else {})})
        return {"translations": translations}

    # -- the rest -------------------------------------------------------------------------------
    @app.get("/health", summary="200 once the model is loaded, else 503")
    async def health():
        if state["batcher"] is None:
            status = "failed" if state["error"] else "loading"
            return JSONResponse({"status": status, **({"error": state["error"]} if state["error"] else {})}, status_code=503)
        return {"status": "ok", "queue": state["batcher"].depth, "pid": os.getpid()}

    @app.get("/v1/models", summary="The model this server translates with")
    async def models():
        t = state["translator"]
        if t is None:
            raise _Answer(503, "the model is loading", {"Retry-After": str(RETRY_AFTER_SECONDS)})
        return {"models": [_describe(t, checkpoints)]}

    @app.get("/languages", summary="LibreTranslate's language list")
    async def languages():
        t = state["translator"]
        if t is None:
            raise _Answer(503, "the model is loading", {"Retry-After": str(RETRY_AFTER_SECONDS)})
        src, tgt = _languages(t)
        return [{"code": src, "name": src, "targets": [tgt]}, {"code": tgt, "name": tgt, "targets": []}]

    @app.get("/metrics", summary="Prometheus metrics")
    async def metrics():
        return Response(prom.generate_latest(registry), media_type=prom.CONTENT_TYPE_LATEST)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page():
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))

    return app


class _Answer(Exception):
    """An HTTP answer other than 200, with a one-line message."""

    def __init__(self, status: int, message: str, headers: Optional[dict] = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


def _languages(translator) -> tuple[str, str]:
    train = translator.configs.get("train", {})
    return train.get("src_lang") or "src", train.get("tgt_lang") or "tgt"


def _describe(translator, checkpoints) -> dict[str, Any]:
    configs = translator.configs
    mc = configs.get("model", {})
    src, tgt = _languages(translator)
    paths = [str(checkpoints)] if isinstance(checkpoints, (str, Path)) else [str(p) for p in checkpoints]
    return {"checkpoints": paths, "source": src, "target": tgt, "arch": {k: mc.get(k) for k in
            ("d_model", "encoder_layers", "decoder_layers", "n_heads", "d_ff", "pre_norm")},
            "parameters": _parameters(translator), "precision": translator.config.precision,
            "quantize": translator.config.quantize, "vocabulary": translator.tokenizer.vocab_size,
            "config_sha256": hashlib.sha256(json.dumps(configs, sort_keys=True).encode()).hexdigest()}


def _parameters(translator) -> Optional[int]:
    """Parameters of the model (of every member of an ensemble); None where workers hold the models."""
    import torch

    model = translator.model
    return sum(p.numel() for p in model.parameters()) if isinstance(model, torch.nn.Module) else None


def serve(checkpoints: Union[Path, Sequence[Path]], decode: DecodeConfig, config: ServeConfig,
          sockets: Optional[list] = None) -> None:
    """The `seqtool serve` command: run the server until SIGTERM/Ctrl-C (then drain and stop). sockets:
    listening sockets to serve on instead of binding host:port (a worker of servepool.py)."""
    require_fastapi()
    import uvicorn

    app = create_app(checkpoints, decode, config)
    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level="warning",
                                           timeout_graceful_shutdown=int(config.request_timeout) + 5))
    missing = [name for name in ("httptools", "uvloop") if importlib.util.find_spec(name) is None]
    if missing:  # uvicorn falls back to its pure-Python parser / asyncio's loop
        log.info(f"{' and '.join(missing)} not installed: uvicorn runs its pure-Python fallbacks, which take more "
                 f"CPU time per request (pip install 'seqtool[serve]' installs them)")
    server.run(sockets=sockets)
