"""What a request may say: the request models of /translate (LibreTranslate's) and /v1/translate
(native), built from the config dataclasses' fields, and a body read as JSON or as a form.

The search fields are those SearchOptions and Sampling offer in the scope "request" (config.setting),
with their help, bounds and defaults: declared once, so the OpenAPI page, pydantic's 422s and
`translate`'s options agree, and a new one reaches both APIs with no line here. A setting that the dataclasses refuse
(FieldError) is rendered with the request's field names by `field_name`.
"""

from __future__ import annotations

import json
from typing import Any, Optional, Union
from urllib.parse import parse_qs

from pydantic import BaseModel, Field, ValidationError, create_model

from .. import log
from ..config import Sampling, SearchOptions
from ..fields import field_info, scoped
from ..errors import FieldError


class BadRequest(Exception):
    """A request that cannot be read or that breaks a rule: its HTTP status and one line."""

    def __init__(self, status: int, message: str, headers: Optional[dict] = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


def _from(cls, name: str, optional: bool = True) -> tuple[Any, Any]:
    """A pydantic field for dataclass field `name` of cls: its type, help and bounds; optional: None
    (the server's default) unless given, else the dataclass's own default."""
    info = field_info(cls, name)
    kind = type(info["default"])
    bounds = {k: info[k] for k in ("ge", "gt", "le", "lt") if info[k] is not None}
    if kind is float:
        bounds["allow_inf_nan"] = False
    default = None if optional else info["default"]
    return (Optional[kind] if optional else kind), Field(default, description=info["help"], **bounds)


SEARCH_FIELDS = scoped(SearchOptions, "request")  # what a request may ask of search (config.setting's scope)
SamplingIn = create_model("SamplingIn", __doc__="Sample nbest translations instead of searching (beam unused).",
                          **{name: _from(Sampling, name, optional=False) for name in scoped(Sampling, "request")})
SearchFields = create_model("SearchFields", **{name: _from(SearchOptions, name) for name in SEARCH_FIELDS})
LibreSearchFields = create_model("LibreSearchFields", **{name: _from(SearchOptions, name) for name in SEARCH_FIELDS if name != "nbest"})


def asked(body: BaseModel) -> dict[str, Any]:
    """The search options a request asked for (the others: the server's)."""
    return {k: getattr(body, k) for k in SEARCH_FIELDS if getattr(body, k, None) is not None}


class TranslateIn(SearchFields):
    """POST /v1/translate: segments and, for this request only, search options (unset: the server's)."""
    segments: list[str] = Field(..., description="Sentences to translate, one per item; the answer keeps their order")
    source: Optional[str] = Field(None, description="The segments' language (a multilingual model: one of its sources; checked, never needed)")
    target: Optional[str] = Field(None, description="The language to translate into: required for a model with several targets (GET /languages)")
    sampling: Optional[SamplingIn] = None  # type: ignore[valid-type]
    scores: bool = False
    alignment: bool = False
    target_prefix: Optional[list[str]] = Field(None, description="One per segment (\"\" for none): its translation starts with it")
    constraints: Optional[list[list[Union[str, list[str]]]]] = Field(
        None, description="One list per segment of phrases its translation must contain (a list inside: one of these forms)")
    glossary: Optional[dict[str, Union[str, list[str]]]] = Field(
        None, description="Source term -> target term (or forms): a term found in a segment (whole words) constrains its translation")
    format: str = Field("text", pattern="^(text|html|markdown)$",
                        description="text: each segment one line; html or markdown: each segment a document, translated "
                                    "block by block and sentence by sentence, its markup kept")
    api_key: Optional[str] = Field(None, description="With --api-keys: the key (or send Authorization: Bearer KEY)")


class LibreRequest(LibreSearchFields):  # (alternatives is its nbest)
    """POST /translate, LibreTranslate's request (JSON, or a form as `curl -d q=...` sends), and
    /v1/translate's search options (beam, lenpen, ...) besides, which LibreTranslate's clients never send."""
    q: Union[str, list[str]]
    source: str = "auto"
    target: Optional[str] = None
    format: str = "text"
    alternatives: int = Field(0, ge=0, description="Alternative translations per text (the server's --max-nbest bounds it)")
    api_key: Optional[str] = None


class DetectRequest(BaseModel):
    """POST /detect, LibreTranslate's request."""
    q: str
    api_key: Optional[str] = None


def field_name(error: FieldError, request: str = "native") -> str:
    """A FieldError in the request's own words: SearchOptions' fields are the native request's (and
    `nbest` LibreTranslate's `alternatives`), Sampling's are under `sampling.`."""
    def name(field: str) -> str:
        if request == "libre" and field in ("nbest", "beam"):
            return "alternatives"
        return f"sampling.{field}" if field in {"topk", "topp", "temperature", "seed"} else field
    return error.render(name)


async def multipart_fields(headers, body: bytes) -> dict[str, Any]:
    """A multipart/form-data body's text fields (a repeated field is a list); files are refused."""
    from starlette.datastructures import UploadFile
    from starlette.formparsers import MultiPartException, MultiPartParser

    async def stream():
        yield body
        yield b""
    try:
        form = await MultiPartParser(headers, stream(), max_files=0, max_part_size=len(body) + 1).parse()
    except MultiPartException as error:
        raise BadRequest(422, f"body: not a valid form ({error.message})") from None
    fields: dict[str, Any] = {}
    for key, value in form.multi_items():
        if isinstance(value, UploadFile):
            raise BadRequest(422, f"{key}: a file; send the text as a form field")
        fields[key] = [*fields[key], value] if isinstance(fields.get(key), list) else [fields[key], value] if key in fields else value
    return fields


def _first_of_each(pairs: list[tuple[str, Any]], name: str) -> dict[str, Any]:
    """A JSON object whose keys repeat (a glossary giving a source term twice): the first of each is
    kept, with a warning naming the request, as a glossary file's duplicates are."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            log.warn(f"{name}: the key {key!r} is given twice in one JSON object; the first is kept")
            continue
        out[key] = value
    return out


def parse(model: type[BaseModel], body: Union[bytes, dict], content_type: str = "application/json",
          name: str = "a request") -> BaseModel:
    """The request model from a body: JSON, application/x-www-form-urlencoded (a repeated field is
    a list), or fields already read (multipart_fields). BadRequest (422) names the field at fault;
    name: the request's, for warnings. Runs off the event loop when the body is large: then it
    costs a worker thread, not every client's latency."""
    kind = content_type.split(";")[0].strip().lower()
    if isinstance(body, dict):
        data: Any = body
    elif kind == "application/x-www-form-urlencoded":
        try:
            form = parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False, max_num_fields=100_000)
        except (UnicodeDecodeError, ValueError) as error:
            raise BadRequest(422, f"body: not a valid form ({error})") from None
        data = {k: v[0] if len(v) == 1 else v for k, v in form.items()}
    else:
        try:
            data = json.loads(body, object_pairs_hook=lambda pairs: _first_of_each(pairs, name))
        except RecursionError:
            raise BadRequest(422, "body: not valid JSON (nested too deeply)") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise BadRequest(422, f"body: not valid JSON ({getattr(error, 'msg', error)})") from None
    try:
        return model.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "body"
        raise BadRequest(422, f"{where}: {first.get('msg', 'invalid request')}") from None
    except RecursionError:
        raise BadRequest(422, "body: nested too deeply") from None


def openapi_body(model: type[BaseModel], form: bool = False) -> dict:
    """The OpenAPI requestBody of an endpoint that reads its body itself (parse)."""
    schema = {"$ref": f"#/components/schemas/{model.__name__}"}
    content = {"application/json": {"schema": schema}}
    if form:
        content["application/x-www-form-urlencoded"] = content["multipart/form-data"] = {"schema": schema}
    return {"requestBody": {"required": True, "content": content}}
