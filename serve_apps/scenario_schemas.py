"""Request and response bodies of ``POST /v1/scenario/decide`` (pydantic, strict).

A scenario state is what an online controller knows at one tick (the service turns it
into an :class:`envs.scenario.control.PlanView`): the present electricity price, grid
carbon intensity and on-site solar, their forecasts for the next ticks, the forecast
busy cores per job class, the running and queued cores per class, the held batch pool as
parallel arrays, and the fleet's cores by power state.

Bounds (also in the OpenAPI schema; a value outside one is a 422 naming the field):

* every number finite (no NaN or inf); integers may be written ``5`` or ``5.0``;
* price in [-``MAX_PRICE``, ``MAX_PRICE``] $/MWh (negative prices exist on real
  markets); carbon intensity in [0, ``MAX_CARBON``] gCO2/kWh; solar in [0, ``MAX_KW``] kW;
* every forecast array (price, carbon, solar, load and running per class) has one common
  length L, at most ``MAX_FORECAST`` in the schema and at most the deployed scenario's
  horizon (``GET /v1/scenario``), at least its decision period;
* the batch pool holds at most ``MAX_POOL`` jobs; cores and durations positive.

Checks that need the deployed scenario (horizon, fleet cores) happen in
:mod:`serve_apps.scenario_state`.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from cloudrl.serving.schemas import _integral

MAX_PRICE = 20_000.0  # $/MWh; the highest wholesale caps are ~5,000-15,000 $/MWh
MAX_CARBON = 5_000.0  # gCO2/kWh; coal plants emit ~1,000
MAX_KW = 1e7  # kW of on-site solar
MAX_CORES = 1e7  # cores of a fleet, a class or a job
MAX_FORECAST = 20_000  # forecast ticks in one request (the catalog's horizons are < 1,000)
MAX_POOL = 20_000  # held batch jobs in one request
MAX_TICK = 10**9

_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)

Price = Annotated[float, Field(ge=-MAX_PRICE, le=MAX_PRICE)]
Carbon = Annotated[float, Field(ge=0.0, le=MAX_CARBON)]
Kw = Annotated[float, Field(ge=0.0, le=MAX_KW)]
Cores = Annotated[float, Field(ge=0.0, le=MAX_CORES)]


def _array(item: object, what: str) -> object:
    return Annotated[list[item],  # type: ignore[valid-type]
                     Field(min_length=1, max_length=MAX_FORECAST, description=what)]


PriceArray = _array(Price, "$/MWh at ticks t+1..t+L")
CarbonArray = _array(Carbon, "gCO2/kWh at ticks t+1..t+L")
KwArray = _array(Kw, "kW at ticks t+1..t+L")
CoresArray = _array(Cores, "cores at ticks t+1..t+L (running: t..t+L-1)")


def _int(lo: int, hi: int, **kw: object) -> object:
    """An integer in [lo, hi]; ``5.0`` counts as ``5`` (JSON Schema's integer)."""
    return Annotated[int, Field(ge=lo, le=hi, **kw), BeforeValidator(_integral)]


Tick = _int(0, MAX_TICK)
Ticks = _int(1, MAX_TICK)
Float = float  # strict: a JSON integer is a float too, true/false and "3" are not


class PerClass(BaseModel):
    """One array per job class."""

    model_config = _STRICT
    latency_critical: CoresArray
    batch: CoresArray


class QueuedCores(BaseModel):
    """Cores of jobs waiting in the run queue, per class."""

    model_config = _STRICT
    latency_critical: Annotated[Float, Field(ge=0.0, le=MAX_CORES)] = 0.0
    batch: Annotated[Float, Field(ge=0.0, le=MAX_CORES)] = 0.0


class FleetByState(BaseModel):
    """The fleet's cores by power state; they sum to the scenario's fleet cores."""

    model_config = _STRICT
    active: Annotated[Float, Field(ge=0.0, le=MAX_CORES)]
    suspended: Annotated[Float, Field(ge=0.0, le=MAX_CORES)] = 0.0
    off: Annotated[Float, Field(ge=0.0, le=MAX_CORES)] = 0.0
    resuming: Annotated[Float, Field(ge=0.0, le=MAX_CORES)] = 0.0
    booting: Annotated[Float, Field(ge=0.0, le=MAX_CORES)] = 0.0

    @property
    def total(self) -> float:
        return self.active + self.suspended + self.off + self.resuming + self.booting


class BatchPool(BaseModel):
    """Held batch jobs as parallel arrays (one entry per job, at most ``MAX_POOL``; the
    three have one length)."""

    model_config = _STRICT
    cores: Annotated[list[Annotated[float, Field(gt=0.0, le=MAX_CORES)]],
                     Field(max_length=MAX_POOL)] = []
    duration_ticks: Annotated[list[Ticks],  # type: ignore[valid-type]
                              Field(max_length=MAX_POOL)] = []
    latest_start_tick: Annotated[list[Tick],  # type: ignore[valid-type]
                                 Field(max_length=MAX_POOL, description="absolute tick by "
                                       "which the job must start")] = []


class ScenarioState(BaseModel):
    """What an online controller knows at tick ``tick`` (see the module docstring)."""

    model_config = _STRICT
    tick: Tick = Field(description="ticks since the episode (or the service's clock) "  # type: ignore[valid-type]
                             "began")
    ticks_left: Ticks | None = Field(  # type: ignore[valid-type]
        default=None, description="ticks until the episode ends (default: a whole episode)")
    hour_of_week: Annotated[Float, Field(ge=0.0, lt=168.0)] | None = Field(
        default=None, description="hours since Monday 00:00 at this tick (required when a "
                                  "learned policy is served: it observes the time of week; "
                                  "informational otherwise)")
    decision_ticks: _int(1, MAX_FORECAST) | None = Field(  # type: ignore[valid-type]
        default=None, description="ticks until the next decision (default: the scenario's)")
    price_now: Annotated[Float, Field(ge=-MAX_PRICE, le=MAX_PRICE, description="$/MWh")]
    carbon_now: Annotated[Float, Field(ge=0.0, le=MAX_CARBON, description="gCO2/kWh")]
    solar_now_kw: Annotated[Float, Field(ge=0.0, le=MAX_KW)] = 0.0
    price_fc: PriceArray
    carbon_fc: CarbonArray
    solar_fc_kw: KwArray
    load_fc: PerClass = Field(description="forecast busy cores per class")
    running: PerClass = Field(description="cores of running jobs still busy per class")
    queued: QueuedCores = Field(default_factory=QueuedCores)
    pool: BatchPool = Field(default_factory=BatchPool)
    fleet: FleetByState


class ScenarioDecision(BaseModel):
    """The two standing controls for the next decision period, always feasible."""

    release_util: float = Field(description="release held batch work while committed cores "
                                            "stay within this share of the fleet's cores")
    ready_cores: float = Field(description="cores kept ready (not off)")
    policy: str = Field(description="the controller that answered")
    decide_ms: float = Field(description="server-side time of this decision, ms: from the "
                                         "validated request to the answer, in the replica")
    controller_ms: float | None = Field(default=None, description="the configured "
                                        "controller's decide_view alone, ms (the MPC: its LP "
                                        "and HiGHS solve; the learned policy: observation and "
                                        "forward); null when it did not answer")
    fallback: bool = Field(description="true when the configured controller did not answer")
    reason: str | None = Field(default=None, description="why the fallback answered or the "
                                                         "controls were clamped")
