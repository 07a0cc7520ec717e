"""The labelling service: FastAPI, one SQLite file, the page and its JSON API.

Pages (static, no build step): ``GET /`` the labelling page, ``GET /admin`` the quality
page; their script and style under ``/static/``. API (``Authorization: Bearer <token>``
on every ``/api`` call; no cookies, so no request can ride on a browser's ambient
credentials and forms need no CSRF token):

* ``GET /api/me``: who the token belongs to;
* ``GET /api/next``: the operator's task (two segment views, left and right) or
  ``{"task": null}`` when nothing is waiting for them;
* ``POST /api/labels`` ``{"assignment_id", "choice": "a"|"b"|"equal"|"skip",
  "note"?, "time_taken_ms"}``: store a label (``a`` = the left side as shown); the
  answer carries the next task, so the page shows it at once. Rate-limited per operator
  (token bucket, 429 with ``Retry-After``);
* admin token only: ``GET /api/admin/stats`` (queue, strata, per-operator quality,
  Krippendorff's alpha, Cohen's kappa), ``GET /api/admin/votes`` (majority answers),
  ``POST /api/admin/gold`` ``{"pair_id", "answer"}``.

Errors are 4xx with one line in ``detail``: 401 for a missing or wrong token (nothing is
changed), 403 for a non-admin on an admin call, 404/409 for an unknown or already
labelled task, 405 (with ``Allow``) for a method a path does not take, 413 for a body
over ``max_body_bytes``, 422 for a malformed one: request bodies are strict (a string
where a number belongs, ``true`` for a number, a float for an integer: 422 naming the
field). ``GET /api/openapi.json`` declares every body, the bearer token scheme and the
errors each call can answer.
"""

from __future__ import annotations

import json
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from cloudrl.labelling import ui
from cloudrl.labelling.db import connect
from cloudrl.labelling.favicon import ICO
from cloudrl.labelling.quality import QualityConfig, quality_report
from cloudrl.labelling.queue import (
    QueueConfig,
    TaskError,
    TaskQueue,
    queue_counts,
    set_gold,
    strata_counts,
)
from cloudrl.labelling.tokens import Operator, hash_token, operator_for_token


@dataclass
class ServeConfig:
    """The service's settings (defaults run, given ``db``)."""

    db: str = "results/labelling/labels.db"
    host: str = "127.0.0.1"
    port: int = 18100
    queue: QueueConfig = field(default_factory=QueueConfig)
    quality: QualityConfig = field(default_factory=QualityConfig)
    rate_per_s: float = 2.0
    rate_burst: int = 10
    max_body_bytes: int = 16_384
    max_note_chars: int = 2000
    token_cache_s: float = 10.0
    stats_cache_s: float = 5.0
    sync: str = "normal"
    threads: int = 100


class LabelIn(BaseModel):
    """``POST /api/labels``: a label for a task (``a`` = the left side as shown)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    assignment_id: int = Field(ge=1, le=2**62)
    choice: Literal["a", "b", "equal", "skip"]
    note: str | None = Field(default=None, max_length=2000)
    time_taken_ms: int = Field(default=0, ge=0, le=86_400_000)


class GoldIn(BaseModel):
    """``POST /api/admin/gold``: a pair's known answer (``null`` clears it)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    pair_id: int = Field(ge=1, le=2**62)
    answer: Literal["a", "b", "equal"] | None


class ErrorOut(BaseModel):
    """Every 4xx answer: one line naming the field, value or reason."""

    detail: str


ERRORS = {401: "missing or invalid token (nothing changed)",
          403: "the call needs an admin token",
          404: "no such task, pair or file",
          409: "the task was already labelled or expired and given away",
          413: "body over the size limit",
          422: "malformed body: the detail names the field",
          429: "too many labels: wait Retry-After seconds"}
SECURITY = [{"bearerAuth": []}]


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` of a route that can answer ``codes``."""
    return {c: {"model": ErrorOut, "description": ERRORS[c]} for c in codes}


def api_doc(body: type[BaseModel] | None = None) -> dict[str, Any]:
    """``openapi_extra`` of an ``/api`` route: its token and its JSON body."""
    extra: dict[str, Any] = {"security": SECURITY}
    if body is not None:
        extra["requestBody"] = {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{body.__name__}"}}}}
    return extra


class ApiError(Exception):
    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None):
        super().__init__(detail)
        self.status, self.detail, self.headers = status, detail, headers or {}


class TokenBucket:
    """Per-key token buckets: ``rate`` per second, ``burst`` at most."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, burst
        self._state: dict[Any, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def take(self, key: Any, now: float | None = None) -> float:
        """0.0 when allowed, else the seconds until the next token."""
        now = time.monotonic() if now is None else now
        with self._lock:
            tokens, last = self._state.get(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - last) * self.rate)
            if tokens >= 1.0:
                self._state[key] = (tokens - 1.0, now)
                return 0.0
            self._state[key] = (tokens, now)
            return (1.0 - tokens) / self.rate if self.rate > 0 else 60.0


class BodyLimit:
    """ASGI middleware: 413 for a body over ``max_bytes`` (declared or streamed); adds the
    security headers to every answer (static assets are cacheable: their URLs carry a
    content hash)."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._refuse(send)
            return
        seen = 0
        refused = False
        static = scope.get("path", "").startswith("/static/")

        async def with_headers(message: dict) -> None:
            if message["type"] == "http.response.start":
                have = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(k.encode(), (b"public, max-age=86400" if static and
                                       k == "cache-control" else v.encode()))
                         for k, v in SECURITY_HEADERS.items() if k.encode() not in have]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        async def counted() -> dict:
            nonlocal seen, refused
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    refused = True
                    raise ApiError(413, f"body: over {self.max_bytes} bytes")
            return message

        try:
            await self.app(scope, counted, with_headers)
        except ApiError:
            if refused:
                await self._refuse(send)
            else:
                raise

    async def _refuse(self, send: Any) -> None:
        body = json.dumps({"detail": f"body: over {self.max_bytes} bytes"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def _task_json(task: dict[str, Any] | None) -> str:
    if task is None:
        return "null"
    return (f'{{"assignment_id":{task["assignment_id"]},"expires_at":{task["expires_at"]:.3f},'
            f'"left":{task["left"]},"right":{task["right"]}}}')


SECURITY_HEADERS = {
    "content-security-policy": "default-src 'self'; img-src 'self' data:; "
                               "frame-ancestors 'none'; form-action 'self'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


def create_app(cfg: ServeConfig) -> FastAPI:
    """The app on ``cfg.db`` (opened now: a bad path raises DatabaseError here)."""
    write_conn = connect(cfg.db, sync=cfg.sync)
    queue = TaskQueue(write_conn, cfg.queue)
    local = threading.local()
    bucket = TokenBucket(cfg.rate_per_s, cfg.rate_burst)
    token_cache: dict[str, tuple[Operator, float]] = {}

    def reader():
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = connect(cfg.db, schema=False)
        return conn

    def cached(request: Request, admin: bool = False) -> Operator | None:
        """The operator of a token seen in the last ``token_cache_s`` (no database)."""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        hit = token_cache.get(hash_token(token.strip())) if scheme.lower() == "bearer" \
            else None
        if hit and hit[1] > time.monotonic() and (hit[0].is_admin or not admin):
            return hit[0]
        return None

    async def authed(request: Request, admin: bool = False) -> Operator:
        return cached(request, admin) or await run_in_threadpool(operator, request, admin)

    def operator(request: Request, admin: bool = False) -> Operator:
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ApiError(401, "missing token: send 'Authorization: Bearer <token>'",
                           {"www-authenticate": "Bearer"})
        token = token.strip()
        key = hash_token(token)
        now = time.monotonic()
        hit = token_cache.get(key)
        op = hit[0] if hit and hit[1] > now else operator_for_token(reader(), token)
        if op is None:
            raise ApiError(401, "invalid token", {"www-authenticate": "Bearer"})
        token_cache[key] = (op, now + cfg.token_cache_s)
        if admin and not op.is_admin:
            raise ApiError(403, "this call needs an admin token")
        return op

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        # requests waiting for the write lock hold a worker thread each: room for them
        # all, so a page load never waits behind labels
        anyio.to_thread.current_default_thread_limiter().total_tokens = cfg.threads
        yield

    app = FastAPI(title="cloudrl labelling", docs_url=None, redoc_url=None,
                  openapi_url="/api/openapi.json", lifespan=lifespan)

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"detail": exc.detail}, exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        err = exc.errors()[0] if exc.errors() else {"loc": ("body",), "msg": "invalid"}
        loc = ".".join(str(x) for x in err.get("loc", ()))
        return JSONResponse({"detail": f"{loc}: {err.get('msg', 'invalid')}"}, 422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # keeps the router's headers: Allow on a 405
        headers = dict(getattr(exc, "headers", None) or {})
        detail = str(exc.detail)
        if exc.status_code == 405:
            detail = (f"{request.method} {request.url.path}: method not allowed (allowed: "
                      f"{headers.get('Allow', '-')})")
        return JSONResponse({"detail": detail}, exc.status_code, headers=headers)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, routes=app.routes,
                              description="The labelling API: every /api call takes "
                              "'Authorization: Bearer <token>'.")
            comps = doc.setdefault("components", {})
            schemas = comps.setdefault("schemas", {})
            for model in (LabelIn, GoldIn):
                schemas[model.__name__] = model.model_json_schema(
                    ref_template="#/components/schemas/{model}")
            comps["securitySchemes"] = {"bearerAuth": {
                "type": "http", "scheme": "bearer",
                "description": "an operator's token (cloudrl label operators add NAME)"}}
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(ui.LABEL_HTML)

    @app.get("/admin", response_class=HTMLResponse, include_in_schema=False)
    async def admin_page() -> HTMLResponse:
        return HTMLResponse(ui.ADMIN_HTML)

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> Response:
        return Response(ICO, media_type="image/x-icon",
                        headers={"cache-control": "public, max-age=86400"})

    @app.get("/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        asset = ui.ASSETS.get(name)
        if asset is None:
            raise ApiError(404, f"static/{name}: no such file")
        return Response(asset[1], media_type=asset[0])

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"ok": True}

    @app.get("/api/me", responses=errors(401), openapi_extra=api_doc())
    def me(request: Request) -> dict[str, Any]:
        op = operator(request)
        n = reader().execute("SELECT COUNT(*) FROM labels WHERE operator_id = ?",
                             (op.id,)).fetchone()[0]
        return {"name": op.name, "admin": op.is_admin, "labels": n}

    @app.get("/api/next", responses=errors(401), openapi_extra=api_doc())
    def next_task(request: Request) -> Response:
        op = operator(request)
        task = queue.next_task(op.id)
        return Response(f'{{"task":{_task_json(task)}}}', media_type="application/json")

    async def parsed(request: Request, model: type[BaseModel]) -> Any:
        """The body as ``model`` (read after the token was checked): 422 naming the field."""
        raw = await request.body()
        try:
            return model.model_validate_json(raw or b"null")
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(["body", *(str(x) for x in err.get("loc", ()))])
            raise ApiError(422, f"{loc}: {err.get('msg', 'invalid')}") from None

    @app.post("/api/labels", responses=errors(401, 404, 409, 413, 422, 429),
              openapi_extra=api_doc(LabelIn))
    async def label(request: Request) -> Response:
        op = await authed(request)
        body = await parsed(request, LabelIn)
        wait = bucket.take(op.id)
        if wait > 0:
            raise ApiError(429, f"too many labels: wait {wait:.1f} s",
                           {"retry-after": str(max(1, int(wait + 0.999)))})
        note = (body.note or "").strip()[:cfg.max_note_chars] or None

        def store() -> tuple[dict[str, Any], dict[str, Any] | None]:
            try:
                return queue.submit_and_next(op.id, body.assignment_id, body.choice, note,
                                             body.time_taken_ms)
            except TaskError as e:
                raise ApiError(e.status, e.reason) from None

        stored, task = await run_in_threadpool(store)
        return Response(f'{{"stored":{json.dumps(stored)},"task":{_task_json(task)}}}',
                        media_type="application/json")

    stats_cache: dict[str, Any] = {"at": -1e9, "value": None, "busy": False}
    stats_lock = threading.Lock()

    def compute_stats() -> None:
        conn = connect(cfg.db, schema=False)
        try:
            value = {"queue": queue_counts(conn), "strata": strata_counts(conn),
                     "quality": quality_report(conn, cfg.quality), "computed_at": time.time()}
        finally:
            conn.close()
        with stats_lock:
            stats_cache.update(value=value, at=time.monotonic(), busy=False)

    @app.get("/api/admin/stats", responses=errors(401, 403), openapi_extra=api_doc())
    def stats(request: Request) -> dict[str, Any]:
        """Queue, strata and quality, at most ``stats_cache_s`` old: a stale answer is
        returned at once while a fresh one is computed in the background (the first one
        is computed in the request)."""
        operator(request, admin=True)
        with stats_lock:
            value, stale = stats_cache["value"], (time.monotonic() - stats_cache["at"]
                                                   >= cfg.stats_cache_s)
            start = stale and not stats_cache["busy"] and value is not None
            if start:
                stats_cache["busy"] = True
        if value is None:
            compute_stats()
            return stats_cache["value"]
        if start:
            threading.Thread(target=compute_stats, daemon=True).start()
        return value

    @app.get("/api/admin/votes", responses=errors(401, 403), openapi_extra=api_doc())
    def votes(request: Request) -> dict[str, Any]:
        from cloudrl.labelling.export import voted_pairs
        from cloudrl.labelling.quality import operator_table

        operator(request, admin=True)
        conn = reader()
        flagged = {r["id"] for r in operator_table(conn, cfg.quality) if r["flagged"]}
        return {"pairs": voted_pairs(conn, flagged)}

    @app.post("/api/admin/gold", responses=errors(401, 403, 404, 413, 422),
              openapi_extra=api_doc(GoldIn))
    async def gold(request: Request) -> dict[str, Any]:
        await authed(request, True)
        body = await parsed(request, GoldIn)

        def store() -> None:
            try:
                with queue.lock:
                    set_gold(write_conn, body.pair_id, body.answer)
            except ValueError as e:
                raise ApiError(404, str(e)) from None

        await run_in_threadpool(store)
        return {"pair_id": body.pair_id, "gold": body.answer}

    app.state.queue = queue
    app.add_middleware(BodyLimit, max_bytes=cfg.max_body_bytes)
    return app
