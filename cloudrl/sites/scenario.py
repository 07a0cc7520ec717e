"""A site's scenario: the catalog workload and fleet on the site's signals, in UTC.

The fleet, job classes, power states and cost come from the site's ``workload`` catalog
scenario (``scarcity_spikes`` by default: 60% deferrable batch work with 8 h of slack,
latency-critical bursts, carbon at $50/t, SLA $1 / $2 per violation). The signals are the
split part's slice (:mod:`cloudrl.sites.splits`) with market-true forecasts
(:mod:`envs.signals.market`). The series' clock is UTC, so each class's ``peak_hour`` (a
local hour in the catalog) is moved by the site's standard UTC offset.
"""

from __future__ import annotations

import datetime as _dt
from zoneinfo import ZoneInfo

from cloudrl.sites.registry import Site
from cloudrl.sites.splits import slice_path
from envs.scenario.catalog import load_scenario
from envs.scenario.config import ScenarioConfig


def standard_offset_hours(timezone: str) -> float:
    """The zone's UTC offset on 15 January (standard time), hours."""
    d = _dt.datetime(2023, 1, 15, 12, tzinfo=ZoneInfo(timezone))
    return d.utcoffset().total_seconds() / 3600.0


def site_scenario(site: Site, split: str, part: str, start_date: str | None = None,
                  carbon_model: str = "gbt", overrides: dict | None = None
                  ) -> ScenarioConfig:
    """The scenario of ``site`` on ``part`` of ``split``; ``start_date`` fixes the window
    (None: each seed draws a start day inside the part's file)."""
    base = load_scenario(site.workload)
    off = standard_offset_hours(site.timezone)
    classes = [c.model_dump() | {"peak_hour": (c.peak_hour - off) % 24.0}
               for c in base.classes]
    train = str(slice_path(site, split, "train"))
    signals = {"source": "csv", "csv_path": str(slice_path(site, split, part)),
               "start_date": start_date, "solar_kwp": 0.0,
               "market": site.market(carbon_model, train).model_dump()}
    return load_scenario(site.workload, {"name": f"{site.name}-{split}-{part}",
                                         "description": site.description,
                                         "classes": classes, "signals": signals,
                                         **(overrides or {})})
