"""ScenarioServing: which scenario the service serves and which controller decides on it.

Part of :class:`serve_apps.service_config.ServiceConfig` (``scenario:``), or
``cloudrl serve --scenario NAME --scenario-policy POLICY``. ``policy`` is one of

* ``signal_aware``: :class:`cloudrl.heuristics.signal_aware.SignalAwareDeferral`;
* ``mpc``: :class:`cloudrl.mpc.forecast_mpc.ForecastMPC` (HiGHS);
* ``learned:PATH``: a checkpoint written by ``cloudrl scenarios distill`` for this scenario
  (:class:`cloudrl.algorithms.distill.policy.ServedLearnedController`; ``params``:
  ``threads``, torch threads per forward, default 1); a relative ``PATH`` is made absolute
  here, where the config is read (replicas may run in another directory);
* ``python:MODULE:FACTORY``: ``FACTORY()`` returns an object with ``reset(sim)`` and
  ``decide_view(view) -> (release_util, ready_cores)`` (fault drills:
  :mod:`serve_apps.scenario_faults`).

With ``site`` (``cloudrl serve --site NAME``) the scenario is that real site's
(:func:`cloudrl.sites.scenario.site_scenario` on the test part of ``split``: its fleet,
workload and market publication time), ``name`` is the site's workload scenario, and a
learned checkpoint must have been trained on the site (``cloudrl sites train``).

``params`` are the controller's knobs (``SignalAwareConfig`` or ``MPCConfig`` fields, e.g.
tuned ones). The signal-aware rule with its defaults is the fallback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

BUILTIN = ("signal_aware", "mpc")


class ScenarioServing(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(default="carbon_shift", description="a scenario of the catalog "
                                                          "(cloudrl scenarios list)")
    policy: str = Field(default="signal_aware", description="signal_aware, mpc, "
                        "learned:PATH or python:MODULE:FACTORY")
    params: dict[str, Any] = Field(default_factory=dict, description="the controller's knobs")
    n_servers: int | None = Field(default=None, ge=1, le=4096, description="another fleet "
                                  "size for the scenario (its load scales with it, as "
                                  "'cloudrl scenarios evaluate --n-servers' does); default "
                                  "the scenario's own")
    site: str | None = Field(default=None, description="a real site (cloudrl sites list): "
                             "the service builds its state with the site's scenario")
    split: str = Field(default="temporal", description="the site's split whose test part "
                       "the service's scenario reads")
    decide_timeout_s: float = Field(default=2.0, gt=0.0, le=600.0, description="a controller "
                                    "slower than this is answered by the fallback")
    max_release_util: float = Field(default=2.0, gt=0.0, le=10.0, description="release_util "
                                    "is clamped to [0, this] (>= 1: no limit)")

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        from envs.scenario.catalog import scenario_names

        if name not in scenario_names():
            raise ValueError(f"unknown scenario {name!r}; valid: {', '.join(scenario_names())}")
        return name

    @field_validator("site")
    @classmethod
    def _known_site(cls, site: str | None) -> str | None:
        if site is None:
            return None
        from cloudrl.sites.registry import get_site

        get_site(site)  # ValueError: unknown site, naming the known ones
        return site

    @field_validator("policy")
    @classmethod
    def _policy_form(cls, policy: str) -> str:
        if policy.startswith("learned:") and len(policy) > 8:
            return "learned:" + str(Path(policy[8:]).expanduser().absolute())
        if policy in BUILTIN or (policy.startswith("python:") and policy.count(":") == 2):
            return policy
        raise ValueError(f"policy {policy!r}: expected signal_aware, mpc, learned:PATH or "
                         f"python:MODULE:FACTORY")

    @model_validator(mode="after")
    def _site_fits(self) -> ScenarioServing:
        if self.site is None:
            return self
        if self.n_servers is not None:
            raise ValueError("n_servers: a site serves its own fleet (no n_servers with site)")
        from cloudrl.sites.registry import get_site

        site = get_site(self.site)
        if self.split not in site.splits:
            raise ValueError(f"split: {self.split!r} is not a split of site {site.name} "
                             f"({', '.join(site.splits)})")
        return self
