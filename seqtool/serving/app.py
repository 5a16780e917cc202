"""The FastAPI application: routes, error shapes and middleware around endpoints.Service.

Endpoints: POST /translate (LibreTranslate's request and answer shapes, JSON or a form), POST
/v1/translate (segments with per-request search options, scores, n-best, alignments), GET /health
(503 until the model is loaded), GET /v1/models, GET /languages, GET /metrics (Prometheus), GET / (a
page for people), /docs. Faults are answers, always `{"error": "one line"}`: 400 a request this
model cannot serve, 403 no valid key, 413 too large (checked before any work), 422 names the field
or the cap, 429 past --req-limit (Retry-After), 503 with Retry-After while loading or when the queue
is full, 504 after --request-timeout; anything else is a 500 with one line, never a traceback.
SIGTERM (uvicorn) stops accepting, answers what is in flight, then the runner stops.
"""

import threading
from pathlib import Path
from typing import Sequence, Union

from .. import log
from ..config import DecodeConfig, SearchOptions, ServeConfig
from ..errors import ConfigError
from .endpoints import Service
from .schemas import BadRequest, DetectRequest, LibreRequest, TranslateIn, openapi_body

PAGE = Path(__file__).with_name("page.html")


def require_fastapi() -> None:
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
        import python_multipart  # noqa: F401
    except ImportError as error:
        raise ConfigError(f"seqtool serve needs {error.name}: pip install 'seqtool[serve]'") from None


def create_app(checkpoints: Union[Path, Sequence[Path]], decode: DecodeConfig, options: SearchOptions, config: ServeConfig):
    """The application; its Service (app.state.service) loads the model in a thread at start-up
    (so /health answers 503 until it is ready) and stops the batcher at shutdown."""
    require_fastapi()
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, JSONResponse, Response
    from starlette.exceptions import HTTPException

    from .access import limit_body

    service = Service(checkpoints, decode, options, config)

    @asynccontextmanager
    async def lifespan(app):
        loader = threading.Thread(target=service.load, name="seqtool-load", daemon=True)
        loader.start()
        yield
        loader.join()
        service.close()

    app = FastAPI(title="seqtool", summary="Transformer translation: LibreTranslate-compatible /translate and /v1/translate",
                  lifespan=lifespan)
    app.state.service = service

    def error(status: int, message: str, headers=None) -> JSONResponse:
        return JSONResponse({"error": message}, status_code=status, headers=headers)

    @app.exception_handler(BadRequest)
    async def bad(request: Request, exc: BadRequest):
        return error(exc.status, exc.message, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body"
        return error(422, f"{where}: {first.get('msg', 'invalid request')}")

    @app.exception_handler(HTTPException)
    async def http(request: Request, exc: HTTPException):
        return error(exc.status_code, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):
        log.error(f"{request.url.path}: unexpected {type(exc).__name__}: {exc}")
        return error(500, f"internal error ({type(exc).__name__}); see the server's log")

    @app.post("/translate", summary="Translate (LibreTranslate's API; JSON or a form)", openapi_extra=openapi_body(LibreRequest, form=True))
    async def libre(request: Request):
        return await service.libre(request)

    @app.post("/v1/translate", summary="Translate segments with per-request search options", openapi_extra=openapi_body(TranslateIn))
    async def native(request: Request):
        return await service.native(request)

    @app.get("/health", summary="200 once the model is loaded, else 503")
    async def health():
        answer, status = service.health()
        return JSONResponse(answer, status_code=status)

    @app.get("/v1/models", summary="The model this server translates with")
    async def models():
        return service.models()

    @app.post("/detect", summary="LibreTranslate's language detection, among the model's source languages", openapi_extra=openapi_body(DetectRequest, form=True))
    async def detect(request: Request):
        return await service.detect(request)

    @app.get("/languages", summary="LibreTranslate's language list")
    async def languages():
        return service.languages()

    @app.get("/metrics", summary="Prometheus metrics")
    async def metrics():
        page, kind = service.metrics.page()
        return Response(page, media_type=kind)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page():
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))

    _document(app, LibreRequest, TranslateIn, DetectRequest)
    app.add_middleware(service.metrics.count)
    if config.cors:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=[o.strip() for o in config.cors.split(",") if o.strip()],
                           allow_methods=["GET", "POST"], allow_headers=["Content-Type", "Authorization"])
    app.add_middleware(limit_body, limit=service.body_limit)
    return app


def _document(app, *models) -> None:
    """The request models of endpoints that read their own bodies, in the OpenAPI components."""
    build = app.openapi

    def openapi():
        if app.openapi_schema:
            return app.openapi_schema
        schema = build()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in models:
            found = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(found.pop("$defs", {}))
            components[model.__name__] = found
        return schema
    app.openapi = openapi
