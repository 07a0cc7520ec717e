"""Which sites exist: the two shipped ones and those a user added to the sites directory.

A user's site lives in ``$CLOUDRL_SITES_DIR/<name>/`` (default ``./sites``): ``site.yaml``
(this module's :class:`Site`) beside ``signals.csv.gz`` (the importer's schema, UTC).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from envs.signals.market import MarketForecastConfig

DATA_DIR = Path(__file__).resolve().parents[2] / "envs" / "signals" / "data" / "sites"
NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
SITE_FILE, SIGNALS_FILE = "site.yaml", "signals.csv.gz"


class Period(BaseModel):
    """``[start, end)`` in UTC dates (YYYY-MM-DD)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    start: str
    end: str

    def __str__(self) -> str:
        return f"{self.start}..{self.end}"


class SplitSpec(BaseModel):
    """A temporal split: train, validation and test periods, in that order in time."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    train: Period
    validation: Period
    test: Period


class Site(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    description: str = ""
    signals_path: str
    timezone: str = "UTC"
    publish_local: str = "12:00"
    currency_rate: float = Field(default=1.0, gt=0.0, le=1000.0)
    workload: str = "scarcity_spikes"
    builtin: bool = False
    splits: dict[str, SplitSpec]

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(f"name: {v!r} must be lower-case letters, digits and _ "
                             "(starting with a letter, at most 32)")
        return v

    def market(self, carbon_model: str = "gbt", train_path: str | None = None
               ) -> MarketForecastConfig:
        return MarketForecastConfig(timezone=self.timezone, publish_local=self.publish_local,
                                    carbon_model=carbon_model, train_path=train_path)


def _year_splits() -> dict[str, SplitSpec]:
    return {
        "temporal": SplitSpec(train=Period(start="2021-01-01", end="2022-01-01"),
                              validation=Period(start="2022-01-01", end="2022-07-01"),
                              test=Period(start="2023-01-01", end="2024-01-01")),
        "regime_shift": SplitSpec(train=Period(start="2021-01-01", end="2021-10-01"),
                                  validation=Period(start="2021-10-01", end="2022-01-01"),
                                  test=Period(start="2022-01-01", end="2023-01-01")),
    }


BUILTIN = {
    "de_lu": Site(name="de_lu", description="Germany-Luxembourg: EPEX day-ahead prices and "
                  "grid carbon 2021-2023 (Electricity Maps via SustainCluster, ODbL)",
                  signals_path=str(DATA_DIR / "de_lu.csv.gz"), timezone="Europe/Berlin",
                  publish_local="12:00", builtin=True, splits=_year_splits()),
    "caiso": Site(name="caiso", description="California: CAISO day-ahead prices and grid "
                  "carbon 2021-2023 (Electricity Maps via SustainCluster, ODbL)",
                  signals_path=str(DATA_DIR / "caiso.csv.gz"),
                  timezone="America/Los_Angeles", publish_local="13:00", builtin=True,
                  splits=_year_splits()),
}


def sites_dir() -> Path:
    """Where added sites live: ``$CLOUDRL_SITES_DIR``, else ``./sites``."""
    return Path(os.environ.get("CLOUDRL_SITES_DIR") or "sites")


def cache_dir() -> Path:
    """Where split slices are written: ``$CLOUDRL_CACHE_DIR/site_slices``, else
    ``~/.cache/cloudrl/site_slices``."""
    base = os.environ.get("CLOUDRL_CACHE_DIR")
    root = Path(base) if base else Path.home() / ".cache" / "cloudrl"
    return root / "site_slices"


class UnknownSiteError(ValueError):
    """A site name that is neither shipped nor in the sites directory."""


def added_sites() -> dict[str, Site]:
    out = {}
    root = sites_dir()
    if root.is_dir():
        for f in sorted(root.glob(f"*/{SITE_FILE}")):
            site = Site.model_validate(yaml.safe_load(f.read_text()))
            out[site.name] = site.model_copy(update={
                "signals_path": str(f.parent / SIGNALS_FILE)})
    return out


def all_sites() -> dict[str, Site]:
    return {**BUILTIN, **added_sites()}


def get_site(name: str) -> Site:
    sites = all_sites()
    if name not in sites:
        raise UnknownSiteError(f"unknown site {name!r}; known: {', '.join(sorted(sites))} "
                               f"(added sites are read from {sites_dir()})")
    return sites[name]


def save_site(site: Site) -> Path:
    folder = sites_dir() / site.name
    folder.mkdir(parents=True, exist_ok=True)
    data = site.model_dump()
    data["signals_path"] = SIGNALS_FILE
    (folder / SITE_FILE).write_text(yaml.safe_dump(data, sort_keys=False))
    return folder
