"""Request errors as HTTP answers. A job's own failure is never one of these: it is a result."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.dependencies.models import Dependant
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute, compile_path
from starlette.types import Scope

from raas.pipeline import Draining, InitQueueFull, JobIdConflict, QuotaExceeded, StoreUnavailable
from raas.tasks import InvalidInstance, UnknownTask


class ErrorBody(BaseModel):
    """Every error answer but a 422 (whose ``detail`` is a list of located errors)."""

    detail: str = Field(description="One line saying what is wrong.")


class ConflictBody(ErrorBody):
    job_id: str = Field(description="The job_id that is known with a different request.")


class TooManyBody(ErrorBody):
    quota: str | None = Field(
        default=None,
        description="The tenant's quota the submission would go over (max_jobs_in_flight,"
        " llm_tokens_per_s, llm_tokens_per_day); absent when the INIT queue is full.",
    )


_RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before trying again.",
        "schema": {"type": "integer"},
    }
}
ERROR_RESPONSES: dict[int, dict[str, Any]] = {
    401: {
        "model": ErrorBody,
        "description": "The server has an API key and the request did not send it"
        " (`Authorization: Bearer KEY`), or sent another.",
        "headers": {"WWW-Authenticate": {"schema": {"type": "string"}}},
    },
    403: {
        "model": ErrorBody,
        "description": "A server without an API key was named by a Host that is not its own"
        " (DNS rebinding), or a web page on another origin sent a request that changes"
        " something (see raas.api.browser_guard), or a tenant's key was sent to a route that"
        " changes the whole server (the backend pool, /start, /stop), which needs the admin's.",
    },
    404: {"model": ErrorBody, "description": "Nothing with this id."},
    409: {
        "model": ConflictBody,
        "description": "The job_id is known, with a different request.",
    },
    413: {"model": ErrorBody, "description": "The body is over the server's `max_body_mb`."},
    429: {
        "model": TooManyBody,
        "description": "The INIT queue is full, or the submission would take its tenant over a"
        " quota (named in `quota`): nothing was accepted; retry after Retry-After.",
        "headers": _RETRY_AFTER,
    },
    503: {
        "model": ErrorBody,
        "description": "The server is draining (after POST /stop; or shutting down, which"
        " POST /start does not undo) and accepts no new jobs, or cannot record them now (its"
        " disk is full): nothing was accepted; retry after Retry-After.",
        "headers": _RETRY_AFTER,
    },
    504: {
        "model": ErrorBody,
        "description": "A pause of the backend pool whose drain did not end in time: the pool"
        " stays paused until POST /v1/backends:resume.",
    },
}


def responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The error answers a route can give besides 422 (FastAPI lists that one itself), for
    ``responses=`` of a route or router, so the OpenAPI document lists them."""
    return {code: ERROR_RESPONSES[code] for code in codes}


@dataclass
class FieldError(Exception):
    """Bad input in one field, reported like FastAPI's own 422s: ``loc`` names the field."""

    loc: list[str | int]
    message: str
    kind: str
    ctx: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        super().__init__(self.message)


def field_error(exc: Exception, prefix: list[str | int]) -> FieldError:
    if isinstance(exc, UnknownTask):
        ctx = {"data_source": exc.data_source, "known": exc.known}
        return FieldError([*prefix, "instance", "data_source"], str(exc), "unknown_task", ctx)
    if isinstance(exc, InvalidInstance):
        return FieldError([*prefix, *exc.loc], exc.message, exc.kind)
    raise TypeError(exc)


def jsonable(value: Any) -> Any:
    """``value`` as something JSON can always hold, for echoing bad input back.

    A 422 repeats the offending ``input`` (and the ``ctx`` of the check that failed); when that
    is NaN or an infinity, a JSON encoder refuses it, the handler raises, and the client gets a
    500 and a reset connection instead of the 422. So non-finite floats become their JSON-ish
    names, bytes their text, and anything else (an exception in ``ctx``) its string.
    """
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if value is None or isinstance(value, str | int | float):
        return value
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return str(value)


def _detail(message: str, **extra: Any) -> dict[str, Any]:
    return {"detail": message, **extra}


class PathMethods:
    """The methods each path is served with. A route serves one method, so a path such as
    /v1/rollouts (GET and POST) has several routes, and Starlette's 405 names only one's."""

    def __init__(self) -> None:
        self._routes: list[tuple[re.Pattern[str], set[str]]] = []

    def add(self, routes: Iterable[BaseRoute]) -> None:
        for route in routes:
            path, methods = getattr(route, "path", None), getattr(route, "methods", None)
            if path and methods:
                self._routes.append((compile_path(path)[0], set(methods)))

    def allowed(self, scope: Scope) -> list[str]:
        path = app_path(scope)
        return sorted({m for regex, methods in self._routes if regex.match(path) for m in methods})


def app_path(scope: Scope) -> str:
    """The request's path inside the app (``root_path`` taken off)."""
    path: str = scope["path"]
    root = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


async def one_value_per_query_key(request: Request) -> None:
    """Refuse a query that names one of the route's query parameters twice (a dependency of
    raas's own routes; the gateway's serve SDKs that answer in their API's shape). No route
    takes a list in its query, and FastAPI reads the last value of a repeated key and drops the
    rest: ``?min_reward=[]&min_reward=0.5`` is a request whose meaning is not said, so it is a
    422 at the key, as an ill-typed value is. A key the route does not take is ignored, as
    FastAPI ignores it once. (async: FastAPI runs a plain def dependency in a thread.)"""
    route = request.scope.get("route")
    declared = _route_query_names(route) if isinstance(route, APIRoute) else frozenset()
    seen: set[str] = set()
    for key, _ in request.query_params.multi_items():
        if key in seen and key in declared:
            error = {
                "type": "repeated",
                "loc": ["query", key],
                "msg": f"query key {key!r} is given more than once; give it once",
            }
            raise RequestValidationError([error])
        seen.add(key)


def _route_query_names(route: APIRoute) -> frozenset[str]:
    """Kept on the route, made once with its app (APIRoute is not hashable: no cache dict)."""
    found: frozenset[str] | None = getattr(route, "_raas_query_names", None)
    if found is None:
        found = _query_names(route.dependant)
        route._raas_query_names = found  # type: ignore[attr-defined]
    return found


def _query_names(dependant: Dependant) -> frozenset[str]:
    """The query parameters a route's dependant takes, its dependencies' included."""
    names = {field.alias for field in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return frozenset(names)


def install_error_handlers(app: FastAPI, methods: PathMethods) -> None:
    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> Response:
        if exc.status_code == 405:
            # Starlette's Allow names the methods of one route; a path such as /v1/rollouts is
            # served by several.
            allowed = ", ".join(methods.allowed(request.scope))
            message = f"method {request.method} is not served here; this path serves {allowed}"
            return JSONResponse(_detail(message), status_code=405, headers={"Allow": allowed})
        cause = exc.__cause__
        if exc.status_code == 400 and isinstance(cause, ValueError | RecursionError):
            # FastAPI's answer to a body json cannot read for another reason than its syntax
            # (bytes that are not UTF-8, nesting past the recursion limit): a 422, as for a
            # syntax error.
            error = {"type": "json_invalid", "loc": ["body"], "msg": f"JSON decode error: {cause}"}
            return JSONResponse({"detail": [error]}, status_code=422)
        return await http_exception_handler(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        if (unsupported := _not_json(request, exc)) is not None:
            return unsupported
        # FastAPI's own answer, made safe to encode whatever the body held (see jsonable).
        return JSONResponse({"detail": jsonable(exc.errors())}, status_code=422)

    @app.exception_handler(FieldError)
    async def _field(_: Request, exc: FieldError) -> JSONResponse:
        if exc.kind == "not_found":  # the field names something this server does not hold
            where = ".".join(str(part) for part in exc.loc)
            return JSONResponse(_detail(f"{where}: {exc.message}"), status_code=404)
        error: dict[str, Any] = {"loc": ["body", *exc.loc], "msg": exc.message, "type": exc.kind}
        if exc.ctx is not None:
            error["ctx"] = jsonable(exc.ctx)
        body = {"detail": [error]}
        return JSONResponse(body, status_code=422)

    @app.exception_handler(InitQueueFull)
    async def _init_queue_full(_: Request, exc: InitQueueFull) -> JSONResponse:
        return JSONResponse(
            _detail(str(exc)),
            status_code=429,
            headers={"Retry-After": str(exc.retry_after_s)},
        )

    @app.exception_handler(QuotaExceeded)
    async def _over_quota(_: Request, exc: QuotaExceeded) -> JSONResponse:
        return JSONResponse(
            _detail(str(exc), quota=exc.quota),
            status_code=429,
            headers={"Retry-After": str(exc.retry_after_s)},
        )

    @app.exception_handler(Draining)
    async def _draining(_: Request, exc: Draining) -> JSONResponse:
        return JSONResponse(_detail(str(exc)), status_code=503, headers={"Retry-After": "5"})

    @app.exception_handler(StoreUnavailable)
    async def _unrecorded(_: Request, exc: StoreUnavailable) -> JSONResponse:
        return JSONResponse(
            _detail(str(exc)), status_code=503, headers={"Retry-After": str(exc.retry_after_s)}
        )

    @app.exception_handler(JobIdConflict)
    async def _conflict(_: Request, exc: JobIdConflict) -> JSONResponse:
        return JSONResponse(_detail(str(exc), job_id=exc.job_id), status_code=409)


def _not_json(request: Request, exc: RequestValidationError) -> JSONResponse | None:
    """A 415 that says how to send the body, when it was not sent as JSON: curl's ``-d`` alone
    sends a form, which FastAPI reads as a string and pydantic answers in its own words."""
    content_type = request.headers.get("content-type", "")
    errors = exc.errors()
    if "json" in content_type or not errors or list(errors[0].get("loc", ())) != ["body"]:
        return None
    return JSONResponse(_detail(not_json_message(content_type)), status_code=415)


def not_json_message(content_type: str) -> str:
    said = f"{content_type!r}" if content_type else "none"
    return (
        f"the body must be JSON sent with Content-Type: application/json (got {said};"
        " with curl: -H 'content-type: application/json')"
    )
