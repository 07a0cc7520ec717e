"""Request and response bodies of the decision service (pydantic, strict).

The cluster state is given in the env's own terms, in operator units: per server its
tier, power state and used CPU cores / memory GiB; per pending job its demand, estimated
duration, deadline and age in ticks. Validation is strict: unknown fields, wrong types
(``"2"`` or ``true`` for a number, ``5.5`` for an integer), NaN/inf, negative quantities and
physically implausible values (the bounds below, shown in the OpenAPI schema) are
rejected with the field named (the service answers 422). An integer may be written ``5``
or ``5.0``: JSON Schema's ``integer`` (what the OpenAPI schema says, and what
schema-driven clients send) is any number without a fractional part. Checks that need the policy's
fleet (server count, tiers, capacities) happen in ``cloudrl.serving.state``; the service
writes them into its own OpenAPI schema too.

``signals`` (:class:`Signals`) carries the exogenous signals of a policy trained with
``EnvConfig.signals``: the price, carbon (and, when the policy's signals carry solar, on-site
solar) now and their forecasts for the next ticks, in the units of ``envs.signals``. A
policy with signals requires it, one without refuses it, and the forecast length must be
the policy's horizon in ticks; those checks need the policy and happen in
``cloudrl.serving.state`` (``GET /v1/fleet`` and the OpenAPI schema state them).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    model_validator,
)

from envs.snapshot import MAX_JOBS, MAX_TICKS

MAX_RATE = 10_000.0  # jobs or SLA violations per tick
MAX_CORES = 1e6  # CPU cores of one server or job
MAX_GIB = 1e9  # memory GiB of one server or job
MAX_SERVERS = 4096  # the largest fleet an env config allows
MAX_ACTION = 2**31 - 1  # raw action components (indices)
_TICKS = f"(0 to {MAX_TICKS:,})"
MAX_PRICE = 20_000.0  # $/MWh; the highest wholesale caps are ~5,000-15,000 $/MWh
MAX_CARBON = 5_000.0  # gCO2/kWh; coal plants emit ~1,000
MAX_KW = 1e7  # kW of on-site solar
MAX_FORECAST_TICKS = 604_800  # 168 h (SignalConfig's longest horizon) of 1-second ticks
MAX_POLICY_SPEC = 1024  # characters of a policy spec (a checkpoint path, heuristic:NAME, ...)


def _integral(value: object) -> object:
    """``5.0`` -> ``5`` (an integer in JSON Schema's sense); anything else is left for the
    strict integer check (``5.5``, ``"5"``, ``true`` and NaN stay errors)."""
    if type(value) is float and value.is_integer():
        return int(value)
    return value


Int = Annotated[int, BeforeValidator(_integral)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)


class ServerState(_Strict):
    """One server; the list index is the server's index in the fleet."""

    tier: str = Field(description="tier name of the policy's fleet at this index")
    power_state: Literal["active", "asleep", "waking"] = "active"
    wake_left: Int = Field(default=0, ge=0, le=MAX_TICKS,
                           description=f"ticks until a waking server is active {_TICKS}")
    used_cpu_cores: float = Field(default=0.0, ge=0, le=MAX_CORES,
                                  description="at most the tier's cores")
    used_mem_gib: float = Field(default=0.0, ge=0, le=MAX_GIB,
                                description="at most the tier's memory")
    n_running: Int = Field(default=0, ge=0, le=MAX_JOBS, description="jobs running on the server")

    @model_validator(mode="after")
    def _consistent(self) -> ServerState:
        busy = self.n_running > 0 or self.used_cpu_cores > 0 or self.used_mem_gib > 0
        if self.power_state != "active" and busy:
            raise ValueError(f"a {self.power_state} server runs no jobs: n_running, "
                             "used_cpu_cores and used_mem_gib must be 0")
        if self.n_running == 0 and (self.used_cpu_cores > 0 or self.used_mem_gib > 0):
            raise ValueError("n_running is 0 but used_cpu_cores/used_mem_gib are not")
        if self.power_state == "waking" and self.wake_left < 1:
            raise ValueError("a waking server needs wake_left >= 1")
        return self


class PendingJob(_Strict):
    """One pending job; the list order is the service order (index 0 is served first)."""

    cpu_cores: float = Field(gt=0, le=MAX_CORES, description="at most the largest server's")
    mem_gib: float = Field(ge=0, le=MAX_GIB, description="at most the largest server's")
    duration: Int = Field(ge=1, le=MAX_TICKS, description="estimated run time in ticks")
    deadline: Int = Field(ge=1, le=MAX_TICKS, description="ticks from now until the SLA "
                          "deadline")
    age: Int = Field(default=0, ge=0, le=MAX_TICKS, description="ticks since the job arrived")


Price = Annotated[float, Field(ge=-MAX_PRICE, le=MAX_PRICE)]
Carbon = Annotated[float, Field(ge=0.0, le=MAX_CARBON)]
Kw = Annotated[float, Field(ge=0.0, le=MAX_KW)]


def _forecast(item: object, what: str) -> object:
    return Annotated[list[item],  # type: ignore[valid-type]
                     Field(min_length=1, max_length=MAX_FORECAST_TICKS,
                           description=f"{what} at ticks t+1..t+H, H the policy's forecast "
                                       "horizon in ticks (GET /v1/fleet: signals.horizon_ticks)")]


class Signals(_Strict):
    """Exogenous signals at this tick and their forecasts, in ``envs.signals`` units.

    The forecasts are per tick of the policy's env (``sim.tick_seconds``) for the next H
    ticks, H = ``SignalConfig.horizon_ticks``. Solar (both fields) is given exactly when
    the policy's signals carry solar (``solar_kwp > 0`` or a ``csv`` source). Those checks
    need the policy (``cloudrl.serving.state.signal_row``)."""

    price_now: float = Field(ge=-MAX_PRICE, le=MAX_PRICE, description="electricity price "
                             "now, $/MWh (negative prices exist on real markets)")
    carbon_now: float = Field(ge=0.0, le=MAX_CARBON, description="grid carbon intensity "
                              "now, gCO2/kWh")
    solar_now_kw: float | None = Field(default=None, ge=0.0, le=MAX_KW, description="on-site "
                                       "solar output now, kW (only with solar)")
    price_fc: _forecast(Price, "price forecast, $/MWh,")  # type: ignore[valid-type]
    carbon_fc: _forecast(Carbon, "carbon forecast, gCO2/kWh,")  # type: ignore[valid-type]
    solar_fc_kw: _forecast(Kw, "solar forecast, kW,") | None = None  # type: ignore[valid-type]


class ClusterState(_Strict):
    """The cluster as the policy sees it at one tick."""

    tick: Int = Field(default=0, ge=0, le=MAX_TICKS,
                      description="ticks since the start of the horizon")
    time_of_day_tick: Int | None = Field(default=None, ge=0, le=MAX_TICKS,
                                         description="tick of the day (default: tick)")
    servers: list[ServerState] = Field(min_length=1, max_length=MAX_SERVERS,
                                       description="exactly the policy's fleet, in order")
    jobs: list[PendingJob] = Field(default_factory=list, description="at most the policy's "
                                   "queue capacity")
    arrival_rate: float = Field(default=0.0, ge=0, le=MAX_RATE,
                                description="recent arrivals per tick")
    violation_rate: float = Field(default=0.0, ge=0, le=MAX_RATE,
                                  description="recent SLA violations per tick")
    priority_level: Int = Field(default=0, ge=0, le=15, description="current queue-order level "
                                "(below the policy's number of levels)")
    signals: Signals | None = Field(default=None, description="price, carbon (and solar) now "
                                    "and forecast: required by a policy trained with "
                                    "signals, refused by one without")


class DecideRequest(ClusterState):
    """POST /v1/decide: a cluster state, plus an optional key for sticky canary routing."""

    routing_key: str | None = Field(default=None, max_length=256)


class DecideBatchRequest(_Strict):
    """POST /v1/decide/batch: several states decided in one request."""

    states: list[DecideRequest] = Field(min_length=1, description="at most the service's "
                                        "max_batch_size")


class Placement(BaseModel):
    job: int = Field(description="index into the request's jobs")
    server: int = Field(description="index into the request's servers")


class PowerCommand(BaseModel):
    server: int | None = None  # flat interface: one server
    tier: str | None = None  # branching interface: one tier
    command: Literal["sleep", "wake", "sleep_one", "hold", "wake_one"]


class Decision(BaseModel):
    """The action in both forms: structured, and the env's raw action."""

    raw: int | list[int]
    placements: list[Placement]
    power: list[PowerCommand]
    priority_level: int | None = None
    wait: bool = False


class DecideResponse(BaseModel):
    action: Decision
    policy: str
    policy_version: str
    answered_by: Literal["model", "fallback"]
    fallback_reason: str | None = None
    decided_by: str | None = Field(default=None, description="hierarchical policies: the "
                                   "sub-agent the supervisor chose (None on a fallback)")
    latency_ms: float


class DecideBatchResponse(BaseModel):
    decisions: list[DecideResponse]


class AutoPlan(_Strict):
    """When the controller promotes a canary and what rolls it back."""

    promote_after: Int = Field(default=500, ge=1, le=100_000_000,
                               description="canary decisions (while not paused) before "
                                           "promotion")
    min_decisions: Int = Field(default=50, ge=1, le=1_000_000,
                               description="canary decisions before rates, latency and SLA "
                                           "risk are judged")
    max_fallback_rate: float = Field(default=0.05, ge=0.0, le=1.0,
                                     description="share of canary decisions answered by the "
                                                 "fallback (any reason)")
    max_intervention_rate: float = Field(default=0.02, ge=0.0, le=1.0,
                                         description="share of canary decisions where the "
                                                     "shield replaced the model's answer")
    max_infeasible: Int = Field(default=0, ge=0, le=1_000_000,
                                description="infeasible actions tolerated "
                                "from the canary (the next one rolls it back)")
    max_latency_p95_ms: float = Field(default=250.0, gt=0.0, le=600_000.0,
                                      description="server-side latency p95 of the canary")
    max_sla_risk_excess: float | None = Field(default=None, ge=0.0, le=1.0,
                                              description="canary's mean SLA risk minus the "
                                                          "stable version's (None: off)")



class RolloutRequest(_Strict):
    """POST /v1/rollout: start a canary (by hand, or watched by the automatic controller
    when ``auto`` is given), change its weight, pause or resume the controller, force a
    promotion or a rollback. ``reason`` goes into the transition log."""

    model_config = ConfigDict(json_schema_extra={"oneOf": [  # what each action needs
        {"properties": {"action": {"const": action}}, "required": ["action", *needs]}
        for action, needs in (("canary", ["policy"]), ("weight", ["weight"]), ("promote", []),
                              ("rollback", []), ("pause", []), ("resume", []))]})

    action: Literal["canary", "weight", "promote", "rollback", "pause", "resume"]
    policy: str | None = Field(default=None, min_length=1, max_length=MAX_POLICY_SPEC,
                               description="canary: checkpoint path or heuristic:NAME or "
                               "python:MODULE:FACTORY or models:/NAME@ALIAS (at most "
                               f"{MAX_POLICY_SPEC} characters)")
    weight: float | None = Field(default=None, ge=0.0, le=1.0)
    auto: AutoPlan | None = Field(default=None, description="canary: promote or roll back "
                                  "automatically by this plan")
    reason: str | None = Field(default=None, min_length=1, max_length=500,
                               description="why (kept in the transition log)")

    @model_validator(mode="after")
    def _fields_for_action(self) -> RolloutRequest:
        if self.action == "canary" and not self.policy:
            raise ValueError("action 'canary' needs 'policy'")
        if self.action == "weight" and self.weight is None:
            raise ValueError("action 'weight' needs 'weight'")
        if self.action != "canary" and (self.policy is not None or self.auto is not None):
            raise ValueError(f"action {self.action!r} takes no 'policy' or 'auto'")
        if self.action not in ("canary", "weight") and self.weight is not None:
            raise ValueError(f"action {self.action!r} takes no 'weight'")
        return self


Index = Annotated[Int, Field(ge=0, le=MAX_ACTION)]


def _index_or_indices(value: object) -> str:
    """The member of :data:`Action` a value is checked against: a JSON array is a branching
    action, anything else a flat one (so a bad value gets one error, not one per member)."""
    return "indices" if isinstance(value, list) else "index"


Action = Annotated[Annotated[Index, Tag("index")] | Annotated[list[Index], Tag("indices")],
                   Discriminator(_index_or_indices)]


class TrajectoryStep(_Strict):
    state: ClusterState
    action: Action = Field(description="the env's raw action: an index (flat interface) or "
                           f"one per branch (branching), each 0 to {MAX_ACTION:,}")
    reward: float | None = Field(default=None, ge=-1e12, le=1e12)


class Trajectory(_Strict):
    steps: list[TrajectoryStep] = Field(min_length=1, max_length=5000)


class TrajectoryRef(_Strict):
    """A trajectory given inline, or by the id of one the operator's system stores."""

    model_config = ConfigDict(json_schema_extra={"oneOf": [{"required": ["trajectory_id"]},
                                                           {"required": ["trajectory"]}]})

    trajectory_id: str | None = Field(default=None, min_length=1, max_length=256)
    trajectory: Trajectory | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> TrajectoryRef:
        if (self.trajectory_id is None) == (self.trajectory is None):
            raise ValueError("give exactly one of trajectory_id and trajectory")
        return self


class PreferencePair(_Strict):
    """Operator judgement: trajectory ``a`` preferred to ``b`` (or the reverse, or equal)."""

    a: TrajectoryRef
    b: TrajectoryRef
    preferred: Literal["a", "b", "equal"]
    operator: str | None = Field(default=None, max_length=256)
    note: str | None = Field(default=None, max_length=4096)


class FeedbackRequest(_Strict):
    pairs: list[PreferencePair] = Field(min_length=1, max_length=100)
