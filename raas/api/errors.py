"""Request errors as HTTP answers. A job's own failure is never one of these: it is a result."""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from raas.pipeline import Draining, JobIdConflict, Overloaded
from raas.tasks import InvalidInstance, UnknownTask


class FieldError(Exception):
    """Bad input in one field, reported like FastAPI's own 422s: ``loc`` names the field."""

    def __init__(self, loc: list[str | int], message: str, kind: str) -> None:
        super().__init__(message)
        self.loc = loc
        self.message = message
        self.kind = kind


def field_error(exc: Exception, prefix: list[str | int]) -> FieldError:
    if isinstance(exc, UnknownTask):
        return FieldError([*prefix, "instance", "data_source"], str(exc), "unknown_task")
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


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own answer, made safe to encode whatever the body held (see jsonable).
        return JSONResponse({"detail": jsonable(exc.errors())}, status_code=422)

    @app.exception_handler(FieldError)
    async def _field(_: Request, exc: FieldError) -> JSONResponse:
        body = {"detail": [{"loc": ["body", *exc.loc], "msg": exc.message, "type": exc.kind}]}
        return JSONResponse(body, status_code=422)

    @app.exception_handler(Overloaded)
    async def _overloaded(_: Request, exc: Overloaded) -> JSONResponse:
        return JSONResponse(
            _detail(str(exc)),
            status_code=429,
            headers={"Retry-After": str(exc.retry_after_s)},
        )

    @app.exception_handler(Draining)
    async def _draining(_: Request, exc: Draining) -> JSONResponse:
        return JSONResponse(_detail(str(exc)), status_code=503, headers={"Retry-After": "5"})

    @app.exception_handler(JobIdConflict)
    async def _conflict(_: Request, exc: JobIdConflict) -> JSONResponse:
        return JSONResponse(_detail(str(exc), job_id=exc.job_id), status_code=409)
