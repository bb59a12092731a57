"""The dashboard: the page at /ui, its files, its login, and the reads the other routes lack.

The page itself reads /v1/status, /v1/backends, /v1/rollouts:running and /v1/rollouts/{id};
the routes here add what those do not give: finished jobs as a filterable list without their
trajectories, counts over every result in the database (by state, by error, recent
throughput, mean reward and pass rate), the series its plots draw (raas.api.series: counted in
memory, filled at the start from the store), and a trajectory's tokens decoded with the
server's tokenizer.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError

from raas.api.auth import logged_in, session_cookie
from raas.api.errors import responses
from raas.api.routes.rollouts import Cursor, FinishedFilter, no_job
from raas.api.series import read_series
from raas.api.state import ServiceState, service
from raas.api.tenants import Caller, caller
from raas.api.ui import ASSETS, HEADERS, asset, login_page, page
from raas.llm.chat import token_texts
from raas.wire import (
    DashboardSeries,
    DashboardStats,
    Distributions,
    JobSummaryPage,
    TokenView,
    Trajectory,
)

router = APIRouter(tags=["dashboard"])
Service = Annotated[ServiceState, Depends(service)]
Who = Annotated[Caller, Depends(caller)]
HTML = {"text/html": {"schema": {"type": "string"}}}
LOGIN_MAX_BYTES = 4096
VALIDATION_ERROR = "#/components/schemas/HTTPValidationError"  # FastAPI's 422 body
LOGIN_BODY = {
    "required": True,
    "content": {
        "application/x-www-form-urlencoded": {
            "schema": {
                "type": "object",
                "properties": {"key": {"type": "string", "description": "The API key."}},
                "required": ["key"],
            }
        }
    },
}


@router.get(
    "/ui",
    response_class=Response,
    responses={
        200: {"content": HTML, "description": "The dashboard (one page; `#/jobs/ID` shows a job)."},
        303: {
            "description": "`?key=` held the API key: the session cookie is set, and the page"
            " is loaded again without the key in its address."
        },
        401: {"content": HTML, "description": "No key, or a wrong one: a form that asks for it."},
    },
)
async def dashboard(
    key: Annotated[
        str | None,
        Query(description="The API key, once: it is exchanged for an HttpOnly session cookie."),
    ] = None,
) -> Response:
    """The dashboard page. With an API key, open it as ``/ui?key=KEY`` or sign in on the form;
    the session cookie that either sets opens the GET routes the page reads."""
    return page()


@router.post(
    "/ui/login",
    response_class=Response,
    status_code=status.HTTP_303_SEE_OTHER,
    responses={
        303: {"description": "The key is right: the session cookie is set; on to /ui."},
        401: {"content": HTML, "description": "The key is wrong: the form again."},
        422: {
            "content": {"application/json": {"schema": {"$ref": VALIDATION_ERROR}}},
            "description": "The form has no `key`.",
        },
    },
    openapi_extra={"requestBody": LOGIN_BODY},
)
async def login(request: Request, svc: Service) -> Response:
    """The dashboard's sign-in form (``key``, form-encoded): sets the session cookie."""
    expected = svc.settings.auth.api_key
    root = request.scope.get("root_path", "")
    body = b""
    async for chunk in request.stream():  # anyone may post here: little is read
        body += chunk
        if len(body) > LOGIN_MAX_BYTES:
            raise HTTPException(
                status.HTTP_413_CONTENT_TOO_LARGE,
                detail=f"a sign-in form is at most {LOGIN_MAX_BYTES} bytes",
            )
    keys = parse_qs(body.decode("latin-1"), keep_blank_values=True).get("key")
    if not keys:  # a form without its one field is a bad request, with a key or without
        missing = {"type": "missing", "loc": ("body", "key"), "msg": "Field required"}
        raise RequestValidationError([missing])
    if not expected:  # nothing to sign in to
        return _to_page(root)
    # As auth._query_key: the key's UTF-8 bytes.
    cookie = session_cookie(keys[0].encode(), expected.encode(), svc.tenants())
    if cookie is None:
        return login_page(wrong=True)
    return logged_in(cookie, request.scope, root)


def _to_page(root: str) -> Response:
    return Response(status_code=303, headers={"Location": root + "/ui"})


@router.get(
    "/ui/assets/{name}",
    response_class=Response,
    responses={
        200: {"content": {"text/javascript": {}, "text/css": {}}, "description": "The file."},
        **responses(404),
    },
)
async def ui_asset(name: str) -> Response:
    """The page's script and style sheet."""
    media = ASSETS.get(name)
    if media is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no dashboard file {name!r}")
    return Response(asset(name), media_type=media, headers=HEADERS)


@router.get("/v1/dashboard/stats", response_model=DashboardStats)
async def dashboard_stats(svc: Service, who: Who) -> DashboardStats:
    """Every finished job in the database (before restarts too; a tenant's own): by state, by
    error type, and how many finished in the last minute and 10 minutes."""
    return await svc.pipeline.store.stats(tenant=who.tenant)


@router.get("/v1/dashboard/distributions", response_model=Distributions)
async def dashboard_distributions(
    svc: Service,
    who: Who,
    last: Annotated[int, Query(ge=1, le=100_000, description="How many finished jobs.")] = 1000,
) -> Distributions:
    """How the last finished jobs (before restarts too; a tenant's own) ended, how many turns
    they took and how long their responses were."""
    return await svc.pipeline.store.distributions(last, tenant=who.tenant)


@router.get("/v1/dashboard/series", response_model=DashboardSeries)
async def dashboard_series(svc: Service, who: Who) -> DashboardSeries:
    """What finished in each 10 s of the last two hours (a tenant's own jobs), results from
    before a restart included (read from the store at the start): rollouts a minute,
    generated tokens a second, mean reward and pass rate, mean seconds of each stage, errors
    by kind, the mean and largest policy version span."""
    return read_series(svc.pipeline.ledger.recent, who.tenant)


@router.get("/v1/dashboard/jobs", response_model=JobSummaryPage)
async def dashboard_jobs(
    svc: Service,
    who: Who,
    where: FinishedFilter,
    before: Annotated[
        Cursor | None, Query(ge=1, description="Cursor: next_before of the previous page.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> JobSummaryPage:
    """Finished jobs newest first, without their trajectories (GET /v1/rollouts/{id} has one);
    /v1/rollouts:running lists the jobs in flight; GET /v1/rollouts:export takes the same
    filters."""
    jobs, next_before = await svc.pipeline.store.summaries(where, before, limit)
    jobs = [j.model_copy(update={"job_id": who.show(j.job_id)}) for j in jobs]
    return JobSummaryPage(jobs=jobs, next_before=next_before)


@router.get(
    "/v1/dashboard/jobs/{job_id}/tokens", response_model=TokenView, responses=responses(404)
)
async def dashboard_tokens(
    job_id: str,
    svc: Service,
    who: Who,
    segment: Annotated[
        int,
        Query(
            ge=0,
            le=1_000_000,
            description="A gateway job's segment (0, the first, is the result's trajectory;"
            " `segments` says how many there are).",
        ),
    ] = 0,
) -> TokenView:
    """A job's trajectory token by token, with each token's text (a running job's so far)."""
    view = await svc.pipeline.lookup(who.key(job_id))
    if view is None:
        raise no_job(job_id)
    versions: list[int | None] | None
    if view.result is not None:
        traj, count = _segment(view.result.trajectory, view.result.metrics, segment)
        # Every call's turn record is on the first segment's trajectory, naming its segment.
        records = Trajectory(turns=view.result.trajectory.turns, loss_mask=traj.loss_mask)
        versions = records.token_policy_versions(segment)
    else:
        job = svc.pipeline.active(view.job_id)
        traj, count = (job.partial_trajectory() if job is not None else Trajectory()), 1
        versions = traj.token_policy_versions()
    if segment >= count:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            f"job {job_id} has {count} segment{'s' if count > 1 else ''} (0 to {count - 1})",
        )
    # Copies: a running job's lists grow while the texts are decoded off the event loop.
    prompt, response = list(traj.prompt_ids), list(traj.response_ids)
    texts, name, note = await _decode(svc, prompt, response)
    return TokenView(
        job_id=job_id,
        state=view.state.value,
        segment=segment,
        segments=count,
        tokenizer=name,
        note=note,
        prompt_ids=prompt,
        prompt_text=texts[0] if texts else None,
        response_ids=response,
        response_text=texts[1] if texts else None,
        loss_mask=list(traj.loss_mask),
        logprobs=list(traj.logprobs),
        policy_versions=versions,
    )


def _segment(first: Trajectory, metrics: dict[str, Any], k: int) -> tuple[Trajectory, int]:
    """A result's segment ``k`` (the trajectory itself for 0; a gateway job's others are in its
    metrics) and how many it has; the first where ``k`` is past them (the caller says so)."""
    segments = metrics.get("segments")
    if not isinstance(segments, list) or len(segments) < 2:
        return first, 1
    if 0 < k < len(segments):
        try:
            return Trajectory.model_validate(segments[k]), len(segments)
        except ValueError:  # a stored result raas did not write as it writes them
            pass
    return first, len(segments)


Texts = tuple[list[str | None], list[str | None]]


async def _decode(
    svc: ServiceState, prompt: list[int], response: list[int]
) -> tuple[Texts | None, str | None, str | None]:
    """The texts of both token lists, the tokenizer's name; or why there are none."""
    name = svc.settings.inference.tokenizer
    if svc.tokenizer is None:
        return None, None, "the server has no tokenizer"
    if not prompt and not response:
        return ([], []), name, None
    try:
        tokenizer: Any = await svc.tokenizer()
        texts = await asyncio.to_thread(
            lambda: (token_texts(tokenizer, prompt), token_texts(tokenizer, response))
        )
    except Exception as e:  # a tokenizer that cannot load or decode: show the ids
        return None, None, f"tokenizer {name} could not decode: {e}"
    return texts, name, None
