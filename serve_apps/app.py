"""The decision service: a Ray Serve deployment with a FastAPI ingress.

Endpoints (JSON):
* ``POST /v1/decide``: a cluster state -> the action (structured and raw), the policy
  version, whether the model or the fallback answered, and the server-side latency.
  Requests from many callers are batched into one model forward (``@serve.batch``).
  A policy whose env has signals (``EnvConfig.signals``) requires the state's ``signals``
  (price, carbon, solar now and their forecasts; ``cloudrl.serving.schemas.Signals``), one
  without refuses them (422 naming ``signals``).
* ``GET /v1/policy``: versions, weights, breaker states and counters.
* ``POST /v1/rollout`` (bearer token): start a canary (by hand, or with an ``auto`` plan that
  the rollout controller follows: promote after N canary decisions, roll back at once when
  a signal crosses its threshold), set its weight, pause/resume the controller, force a
  promotion or a rollback. ``GET /v1/rollout`` (bearer token): the controller's state,
  live signals per version and the transition log.
* ``GET /v1/metrics``: what this replica recorded into its Prometheus metrics
  (``serve_apps.metrics``; Ray exports the same on its metrics endpoint).
* ``POST /v1/feedback`` (bearer token): ranked trajectory pairs into the SQLite store.
* ``GET /v1/fleet``: the deployed fleet's layout (per-index tiers and capacities, queue and
  priority limits) and a minimal valid request (``serve_apps.fleet_layout``).
* ``POST /v1/scenario/decide``: a scenario state (signals, forecasts, load, fleet by power
  state, held batch pool) -> the two standing controls of the configured scenario
  controller, shielded (``serve_apps.scenario_service``); ``GET /v1/scenario``: the
  served scenario's horizon, fleet cores, decision period and an example request. Both
  answer 404 unless the config names a ``scenario``.
* ``GET /healthz``: liveness.

Run it with ``serve run serve_apps/config.yaml``, ``cloudrl serve --checkpoint PATH`` or
``serve.run(build_app({...}))``. Bad input is answered 4xx naming the field (400 for a
body that cannot be parsed: not JSON, not UTF-8 text, or nested too deeply; 422 for JSON
that fails validation; 413 for an oversized body, 401 without the token, 405 for a method
the path does not take) and nothing is stored. Every error body has one format:
``{"error": "<one line>", "errors": [{"field": ..., "message": ...}, ...]}``; a field is
written as in the body (``servers[3].used_cpu_cores``) and no message shows Python
internals (``cloudrl.serving.errors``). A canary whose model hangs is rolled back at its
``canary_rollback_timeouts``-th timed-out decision (``serve_apps.rollout_controller``).
The token is checked before the body is read (``serve_apps.http_guards``): without it, a
protected endpoint answers 401 whatever the body. ``OPTIONS`` and 405 answers list every
method a path takes in ``Allow``.

The health check fails only for a broken stable version; a canary that fails its probe
is dropped (``Rollout.drop_canary``), so a bad canary can never take replicas down. The
OpenAPI schema (``/openapi.json``) carries the deployed fleet's rules: the exact server
count and the tier and capacity at each index, the queue capacity, the largest job, the
priority levels and the batch size.
"""


import asyncio
import hmac
import time
from typing import Any

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from ray import serve
from starlette.exceptions import HTTPException as StarletteHTTPException

from cloudrl.feedback import FeedbackStore
from cloudrl.serving.errors import clean_message, field_errors
from cloudrl.serving.schemas import (
    ClusterState,
    DecideBatchRequest,
    DecideBatchResponse,
    DecideRequest,
    DecideResponse,
    FeedbackRequest,
    RolloutRequest,
)
from cloudrl.serving.state import StateError
from serve_apps.body_limit import BodyLimit
from serve_apps.fleet_layout import fleet_layout, fleet_openapi
from serve_apps.http_guards import AllowedMethods, BearerAuth
from serve_apps.metrics import ServiceMetrics
from serve_apps.rollout import Rollout, ShieldSettings, log
from serve_apps.rollout_controller import RolloutController, sla_risk
from serve_apps.runtime import PolicySpecError
from serve_apps.scenario_canary import CanaryError, CanaryRequest, ScenarioRollout
from serve_apps.scenario_schemas import ScenarioDecision, ScenarioState
from serve_apps.scenario_service import ScenarioService, scenario_openapi
from serve_apps.service_config import ServiceConfig
from serve_apps.shield import Outcome, Shield

api = FastAPI(title="cloudrl decision service", version="1")
api.add_middleware(BodyLimit)  # innermost: the body is read only once the token passed
api.add_middleware(BearerAuth)
api.add_middleware(AllowedMethods, routes_of=lambda: api.routes)
PROTECTED = {"/v1/rollout": frozenset({"GET", "POST"}), "/v1/feedback": frozenset({"POST"}),
             "/v1/scenario/canary": frozenset({"GET", "POST"})}
DECIDE_PATHS = ("/v1/decide", "/v1/decide/batch", "/v1/scenario/decide")


def protected_paths(cfg: ServiceConfig) -> dict[str, frozenset[str]]:
    """Path -> the methods that need the bearer token under ``cfg``."""
    protected = dict(PROTECTED)
    if cfg.decide_requires_token:
        protected.update({path: frozenset({"POST"}) for path in DECIDE_PATHS})
    return protected


@api.exception_handler(RequestValidationError)
async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
    """400 for a body that is not JSON (``json_invalid``: where it stops parsing), else 422
    naming each field; no message carries Python internals (``cloudrl.serving.errors``)."""
    raw = list(exc.errors())
    unparsable = [e for e in raw if e.get("type") == "json_invalid"]
    if unparsable:  # loc is ("body", character position)
        error = unparsable[0]
        loc = tuple(error.get("loc", ()))
        why = (error.get("ctx") or {}).get("error") or error.get("msg") or "invalid JSON"
        where = f" at character {loc[-1]}" if len(loc) > 1 else ""
        message = f"the body is not valid JSON ({clean_message(str(why))}{where})"
        return JSONResponse({"error": message, "errors": [{"field": "body",
                                                           "message": message}]},
                            status_code=400)
    body = getattr(exc, "body", None)
    errors = []
    for e in raw:
        loc = tuple(e.get("loc", ()))
        if loc[:1] == ("body",):
            errors += field_errors([e], body, prefix=("body",))
        else:  # a query or path parameter: "query.limit"
            errors += field_errors([e])
    summary = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5])
    return JSONResponse({"error": f"invalid request: {summary}", "errors": errors},
                        status_code=422)


_HTTP_FIELD = {400: "body", 401: "authorization", 404: "path", 405: "method"}


@api.exception_handler(StarletteHTTPException)
async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
    message = str(exc.detail)
    if exc.status_code == 400:
        message = f"{message}: {_why_unparsable(exc.__cause__)}"
    return JSONResponse({"error": message, "errors": [{
        "field": _HTTP_FIELD.get(exc.status_code, "request"), "message": message}]},
        status_code=exc.status_code, headers=exc.headers)


def _why_unparsable(cause: BaseException | None) -> str:
    if isinstance(cause, RecursionError):
        return ("the JSON body nests arrays/objects too deeply to parse (a request nests "
                "at most 10 levels)")
    if isinstance(cause, UnicodeError):
        return "the body is not UTF-8 text"
    return "the body is not UTF-8 JSON text"


@api.exception_handler(StateError)
async def _state_error(_: Request, exc: StateError) -> JSONResponse:
    return JSONResponse({"error": str(exc), "errors": [{"field": exc.field,
                                                        "message": exc.message}]},
                        status_code=422)


@api.exception_handler(PolicySpecError)
async def _spec_error(_: Request, exc: PolicySpecError) -> JSONResponse:
    message = clean_message(str(exc))  # a loader's error may quote an object's repr
    return JSONResponse({"error": message, "errors": [{"field": "policy",
                                                       "message": message}]},
                        status_code=422)


@serve.deployment(max_ongoing_requests=256, health_check_period_s=10)
@serve.ingress(api)
class DecisionService:
    """One replica: the rollout (policy versions and their shields) and the feedback store."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = ServiceConfig.coerce(config)
        cfg = self.config
        BodyLimit.max_bytes = cfg.max_body_bytes
        self.token = cfg.token()
        BearerAuth.configure(self.token, protected_paths(cfg))
        self.rollout = Rollout(
            cfg.policy, cfg.env, cfg.interface, db_path=cfg.state_db, seed=cfg.routing_seed,
            shield=ShieldSettings(cfg.model_timeout_s, cfg.failure_threshold, cfg.cooldown_s,
                                  cfg.smoke_timeout_s))
        if cfg.canary and self.rollout.canary is None:
            try:
                self.rollout.start_canary(cfg.canary, cfg.canary_weight)
            except PolicySpecError as e:  # the stable version serves alone
                log.warning("configured canary not started: %s", e)
        api.openapi_schema = None
        api.openapi = self._openapi  # type: ignore[method-assign]
        self.feedback = FeedbackStore(cfg.state_db)
        self._batched.set_max_batch_size(cfg.max_batch_size)
        self._batched.set_batch_wait_timeout_s(cfg.batch_wait_timeout_s)
        self.metrics = ServiceMetrics()
        self.controller = RolloutController(self.rollout, cfg.canary_rollback_timeouts)
        self._canary_seen: tuple[str | None, float] = (None, 0.0)
        self.scenario = ScenarioService(cfg.scenario) if cfg.scenario else None
        self.scenario_rollout = ScenarioRollout(self.scenario) if self.scenario else None
        self._sync()

    def _sync(self) -> None:
        """Follow the persisted rollout state; keep the canary-share gauge in step."""
        self.rollout.sync()
        canary = self.rollout.state["canary"]
        seen = (canary["version"] if canary else None, float(self.rollout.state["weight"]))
        if seen != self._canary_seen:
            self.metrics.rollout_state(*seen, self._canary_seen[0])
            self._canary_seen = seen

    def _transition(self, event: str | None) -> None:
        if event:
            self.metrics.transitions.inc(tags={"event": event})
            self._sync()

    def _openapi(self) -> dict[str, Any]:
        if api.openapi_schema is None:
            schema = get_openapi(title=api.title, version=api.version, routes=api.routes)
            api.openapi_schema = fleet_openapi(schema, self.rollout.stable.policy,
                                               self.config.max_batch_size)
            if self.scenario is not None:
                api.openapi_schema = scenario_openapi(api.openapi_schema, self.scenario)
        return api.openapi_schema

    async def check_health(self) -> None:
        """A canary that fails its probe is dropped; only a broken stable version fails."""
        self._sync()
        timeout = self.config.smoke_timeout_s
        canary = self.rollout.canary
        if canary is not None:
            error = await canary.probe(timeout)
            if error and self.rollout.drop_canary(canary.policy.version,
                                                  f"health probe: {error}"):
                self._transition("rolled_back")
        stable = self.rollout.stable
        error = await stable.probe(timeout)
        if error:
            raise RuntimeError(f"broken model: {stable.policy.version} "
                               f"({stable.policy.spec}): {error}")

    def _has_token(self, request: Request) -> bool:
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        return bool(self.token) and scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode(), (self.token or "").encode())  # bytes: any header text

    def _require_token(self, request: Request) -> None:
        if not self.token:
            raise HTTPException(401, "this endpoint needs a bearer token: set auth_token in "
                                     "the service config or CLOUDRL_SERVE_TOKEN",
                                headers={"WWW-Authenticate": "Bearer"})
        if not self._has_token(request):
            raise HTTPException(401, "missing or wrong bearer token",
                                headers={"WWW-Authenticate": "Bearer"})

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.0)
    async def _batched(self, items: list[tuple[Shield, dict]]) -> list[Outcome]:
        """One shielded forward per policy version among the batch's requests."""
        groups: dict[int, list[int]] = {}
        for i, (shield, _) in enumerate(items):
            groups.setdefault(id(shield), []).append(i)
        out: list[Outcome | None] = [None] * len(items)
        for indices in groups.values():
            shield = items[indices[0]][0]
            outcomes = await shield.decide([items[i][1] for i in indices])
            for i, outcome in zip(indices, outcomes, strict=True):
                out[i] = outcome
        return out  # type: ignore[return-value]

    @api.post("/v1/decide", response_model=DecideResponse)
    async def decide(self, body: DecideRequest, request: Request) -> DecideResponse:
        start = time.perf_counter()
        if self.config.decide_requires_token:
            self._require_token(request)
        self._sync()
        shield = self.rollout.route(body.routing_key)
        obs = shield.policy.observe(body)
        outcome = await self._batched((shield, obs))
        return self._response(shield, obs, outcome, start, body)

    @api.post("/v1/decide/batch", response_model=DecideBatchResponse)
    async def decide_batch(self, body: DecideBatchRequest, request: Request
                           ) -> DecideBatchResponse:
        """Many states in one request (one controller, many queues): one forward per version.

        Every state is validated before any is decided; a bad one answers 422 naming
        ``states[i]...``."""
        start = time.perf_counter()
        if self.config.decide_requires_token:
            self._require_token(request)
        if len(body.states) > self.config.max_batch_size:
            raise StateError("states", f"{len(body.states)} states, at most "
                             f"{self.config.max_batch_size} per request")
        self._sync()
        routed = []
        for i, state in enumerate(body.states):
            shield = self.rollout.route(state.routing_key)
            try:
                routed.append((shield, shield.policy.observe(state)))
            except StateError as e:
                raise StateError(f"states[{i}].{e.field}", e.message) from None
        outcomes = await asyncio.gather(*(self._batched(item) for item in routed))
        return DecideBatchResponse(decisions=[
            self._response(shield, obs, outcome, start, state)
            for (shield, obs), outcome, state in zip(routed, outcomes, body.states,
                                                      strict=True)])

    def _response(self, shield: Shield, obs: dict, outcome: Outcome, start: float,
                  state: ClusterState) -> DecideResponse:
        """The answer; the decision is counted in the metrics and by the rollout controller
        (which may promote or roll back the canary on it)."""
        policy = shield.policy
        version = policy.version
        action = policy.describe(outcome.action, obs)
        latency_ms = (time.perf_counter() - start) * 1e3
        self.metrics.decision(version, outcome.by_model, outcome.reason, latency_ms)
        risk = sla_risk(state.jobs, [p.job for p in action.placements])
        self._transition(self.controller.observe(shield, outcome, latency_ms, risk))
        return DecideResponse(
            action=action, policy=policy.name,
            policy_version=version, answered_by="model" if outcome.by_model else "fallback",
            fallback_reason=outcome.reason, decided_by=outcome.decided_by,
            latency_ms=latency_ms)

    @api.get("/v1/policy")
    async def policy(self, request: Request) -> dict[str, Any]:
        """Checkpoint paths are shown to bearer-token holders only."""
        self._sync()
        return self.rollout.report(show_paths=self._has_token(request))

    @api.post("/v1/rollout")
    async def rollout_change(self, body: RolloutRequest, request: Request) -> dict[str, Any]:
        """Every change is logged with ``reason`` (default ``operator``); a bad body, a
        missing token or an action the state does not allow changes nothing."""
        self._require_token(request)
        self._sync()
        reason = body.reason or "operator"
        if body.action == "canary":
            weight = self.config.canary_weight if body.weight is None else body.weight
            # loaded and smoke-tested off the event loop; nothing is persisted on failure
            shield = await asyncio.to_thread(self.rollout.load_canary, body.policy)
            self.controller.start(shield, weight, body.auto, reason)
            self._transition("canary_started")
        elif body.action == "weight":
            self.rollout.set_weight(body.weight)
            self._sync()
        elif body.action == "promote":
            self.rollout.promote(f"forced: {reason}")
            self._transition("promoted")
        elif body.action == "rollback":
            self.rollout.rollback(f"forced: {reason}")
            self._transition("rolled_back")
        elif body.action == "pause":
            self.controller.pause(reason)
            self._transition("paused")
        else:
            self.controller.resume(reason)
            self._transition("resumed")
        return self.rollout.report()

    @api.get("/v1/rollout")
    async def rollout_status(self, request: Request,
                             after_id: int = Query(0, ge=0, le=2**62),
                             limit: int = Query(50, ge=1, le=1000)) -> dict[str, Any]:
        """The versions, the controller (plan, pause, live signals per version) and the
        transitions with id > ``after_id`` (the last ``limit``, oldest first)."""
        self._require_token(request)
        self._sync()
        return {**self.rollout.report(), "controller": self.controller.report(),
                "history": self.rollout.history(limit, after_id)}

    @api.get("/v1/metrics")
    async def metrics_snapshot(self) -> dict[str, Any]:
        """What this replica recorded into its Ray (Prometheus) metrics; ``worker_id`` is
        the ``WorkerId`` label of its lines on Ray's metrics endpoint, ``pid`` its process."""
        import os

        import ray

        return {"worker_id": ray.get_runtime_context().get_worker_id(), "pid": os.getpid(),
                "metrics": self.metrics.snapshot()}

    @api.post("/v1/feedback")
    async def feedback_add(self, body: FeedbackRequest, request: Request) -> dict[str, Any]:
        self._require_token(request)
        pairs = [pair.model_dump(mode="json", exclude_none=True) for pair in body.pairs]
        stored, duplicates = self.feedback.add_pairs(
            pairs, policy_version=self.rollout.stable.policy.version)
        if stored:
            self.metrics.feedback_rows.inc(len(stored))
        return {"stored": len(stored), "duplicates": duplicates, "ids": stored}

    @api.get("/v1/fleet")
    async def fleet(self) -> dict[str, Any]:
        """The stable version's fleet: per-index tier and capacity, queue and priority
        limits, batch size, and a minimal valid ``/v1/decide`` body (``example``)."""
        self._sync()
        return fleet_layout(self.rollout.stable.policy, self.config.max_batch_size)

    def _scenario_rollout(self) -> ScenarioRollout:
        if self.scenario_rollout is None:
            raise HTTPException(404, "no scenario is served: start the service with "
                                     "--scenario NAME (ServiceConfig.scenario)")
        return self.scenario_rollout

    @api.post("/v1/scenario/decide", response_model=ScenarioDecision)
    async def scenario_decide(self, body: ScenarioState, request: Request
                              ) -> ScenarioDecision:
        """The scenario controller's (release_util, ready_cores), always feasible; the
        signal-aware rule answers (``fallback: true``) when the controller fails."""
        if self.config.decide_requires_token:
            self._require_token(request)
        return await self._scenario_rollout().decide(body)

    @api.get("/v1/scenario")
    async def scenario_info(self) -> dict[str, Any]:
        """The served scenario: horizon, fleet cores, decision period, bounds, counters and
        an example ``/v1/scenario/decide`` body."""
        return self._scenario_rollout().stable.info()

    @api.post("/v1/scenario/canary")
    async def scenario_canary(self, body: CanaryRequest, request: Request) -> dict[str, Any]:
        """Start a canary of the scenario controller, or promote or roll it back
        (``serve_apps.scenario_canary``); 422 naming the field for a refused one."""
        self._require_token(request)
        try:
            return self._scenario_rollout().handle(body)
        except CanaryError as e:
            field, _, message = str(e).partition(": ")
            raise StateError(field, message) from None

    @api.get("/v1/scenario/canary")
    async def scenario_canary_state(self, request: Request) -> dict[str, Any]:
        """The scenario rollout: stable and canary policies, counters, events."""
        self._require_token(request)
        return self._scenario_rollout().report()

    @api.get("/healthz")
    async def healthz(self) -> dict[str, str]:
        return {"status": "ok"}


def build_app(args: dict[str, Any] | ServiceConfig | None = None) -> "serve.Application":
    """The Serve application of a config (``serve run serve_apps.app:build_app``)."""
    cfg = ServiceConfig.coerce(args).resolved()
    cfg = cfg.model_copy(update={"auth_token": cfg.token()})
    deployment = DecisionService.options(
        num_replicas=cfg.num_replicas, ray_actor_options={"num_cpus": cfg.num_cpus},
        health_check_period_s=cfg.health_check_period_s,
        health_check_timeout_s=cfg.health_check_timeout_s)
    return deployment.bind(cfg.model_dump(mode="json"))
