"""Canary rollout: a stable and an optional canary policy version with a traffic weight.

Versions are named ``v1``, ``v2``, ... in load order. ``route`` sends a request to the
canary with probability ``weight`` (by a hash of its routing key when it has one, so a
caller sticks to one version). ``start_canary`` loads a new version next to the stable
one; ``promote`` makes the canary the stable version; ``rollback`` drops it.

A canary is loaded and smoke-tested (``Shield.smoke_test``: a few synthetic states,
feasible and finite actions within the time limit) before it is accepted or persisted;
one that fails raises :class:`PolicySpecError`. ``cloudrl serve`` runs the same check
(:func:`load_checked`) on the stable policy before it starts Ray. A persisted canary that
no longer loads or passes its smoke test (after a restart, or on a replica following
another) is dropped with a logged reason, and so is one whose health probe fails at run time
(``drop_canary``): the stable version and the fallback keep serving.

Every change is a logged transition (``rollout_events``: time, event, version, reason):
``canary_started``, ``promoted``, ``rolled_back``, ``paused``, ``resumed``; ``history``
reads them back. The automatic controller (``serve_apps.rollout_controller``) keeps its
plan and pause flag in the state's ``auto`` entry, so they persist and replicate too.

The rollout state is persisted in the service's SQLite database, so a restarted service
keeps a promoted version, and every replica follows a change made through any replica
(``sync`` re-reads the state when SQLite's ``data_version`` says another connection
wrote it). A stored state is used only if it was made from the same configured policy;
a service started with a new policy in its config starts from that policy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cloudrl.feedback import open_db
from cloudrl.policy import Interface
from envs.env_config import EnvConfig
from serve_apps.runtime import PolicySpecError, ServedPolicy
from serve_apps.shield import CircuitBreaker, Shield

log = logging.getLogger("ray.serve")

SCHEMA = "CREATE TABLE IF NOT EXISTS rollout (id INTEGER PRIMARY KEY CHECK (id = 1), " \
         "state TEXT NOT NULL)"
EVENTS_SCHEMA = "CREATE TABLE IF NOT EXISTS rollout_events (id INTEGER PRIMARY KEY " \
    "AUTOINCREMENT, at REAL NOT NULL, event TEXT NOT NULL, version TEXT, spec TEXT, " \
    "reason TEXT NOT NULL)"


@dataclass
class ShieldSettings:
    timeout_s: float = 1.0
    failure_threshold: int = 3
    cooldown_s: float = 5.0
    smoke_timeout_s: float = 10.0


def make_shield(spec: str, version: str, env_config: EnvConfig, interface: Interface,
                settings: ShieldSettings) -> Shield:
    """A policy version behind its shield (loaded, not yet smoke-tested)."""
    policy = ServedPolicy(spec, version, env_config, interface)
    breaker = CircuitBreaker(settings.failure_threshold, settings.cooldown_s)
    return Shield(policy, timeout_s=settings.timeout_s, breaker=breaker)


def require_smoke_test(shield: Shield, timeout_s: float) -> Shield:
    """``shield`` if its model passes the smoke test, else PolicySpecError saying why."""
    error = shield.smoke_test(timeout_s)
    if error:
        raise PolicySpecError(f"policy {shield.policy.spec!r} failed its smoke test: {error}")
    return shield


def load_checked(spec: str, env_config: EnvConfig, interface: Interface,
                 settings: ShieldSettings, version: str = "check") -> Shield:
    """A version loaded and smoke-tested exactly as a canary is (blocking); PolicySpecError
    (or the loader's own error) says why not."""
    return require_smoke_test(make_shield(spec, version, env_config, interface, settings),
                              settings.smoke_timeout_s)


@dataclass
class Rollout:
    """The served versions of one replica, kept in step with the database."""

    configured_policy: str
    env_config: EnvConfig
    interface: Interface
    db_path: Path
    shield: ShieldSettings = field(default_factory=ShieldSettings)
    seed: int = 0

    def __post_init__(self) -> None:
        self._conn: sqlite3.Connection = open_db(self.db_path)
        self._conn.execute(SCHEMA)
        self._conn.execute(EVENTS_SCHEMA)
        self._rng = random.Random(self.seed)
        self._loaded: dict[str, Shield] = {}  # version -> shield (policy inside)
        self._data_version = -1
        stored = self._read()
        if stored is None or stored.get("configured_policy") != self.configured_policy:
            stored = {"configured_policy": self.configured_policy, "next": 2,
                      "stable": {"version": "v1", "spec": self.configured_policy},
                      "canary": None, "weight": 0.0}
            self._write(stored)
        self._apply(stored)

    # ------------------------------------------------------------ persistence
    def _read(self) -> dict[str, Any] | None:
        row = self._conn.execute("SELECT state FROM rollout WHERE id = 1").fetchone()
        return None if row is None else json.loads(row[0])

    def _write(self, state: dict[str, Any]) -> None:
        self._conn.execute("INSERT OR REPLACE INTO rollout (id, state) VALUES (1, ?)",
                           (json.dumps(state),))
        self._data_version = self._version_of_db()

    def _version_of_db(self) -> int:
        return int(self._conn.execute("PRAGMA data_version").fetchone()[0])

    def sync(self) -> None:
        """Follow a change another replica wrote (cheap when nothing changed)."""
        if self._version_of_db() != self._data_version:
            state = self._read()
            if state is not None:
                self._apply(state)
            self._data_version = self._version_of_db()

    def _apply(self, state: dict[str, Any]) -> None:
        stable, canary = state["stable"], state["canary"]
        loaded = dict(self._loaded)
        if stable["version"] not in loaded:
            loaded[stable["version"]] = self._shield_for(stable["spec"], stable["version"])
        if canary and canary["version"] not in loaded:
            try:
                loaded[canary["version"]] = self.load_canary(canary["spec"], canary["version"],
                                                             loaded[stable["version"]])
            except PolicySpecError as e:  # never serve (or crash on) a failing canary
                log.warning("dropping persisted canary %s: %s", canary["version"], e)
                state = dict(state, canary=None, weight=0.0, auto=None)
                self._write(state)
                self.log_event("rolled_back", f"persisted canary does not load: {e}", canary)
        keep = {stable["version"]} | ({state["canary"]["version"]} if state["canary"] else set())
        self._loaded = {v: s for v, s in loaded.items() if v in keep}
        self.state = state

    def _shield_for(self, spec: str, version: str) -> Shield:
        return make_shield(spec, version, self.env_config, self.interface, self.shield)

    def load_canary(self, spec: str, version: str | None = None,
                    stable: Shield | None = None) -> Shield:
        """A new version, loaded and smoke-tested (blocking); PolicySpecError says why not."""
        shield = self._shield_for(spec, version or f"v{self.state['next']}")
        stable = stable or self.stable
        if shield.policy.fleet_signature() != stable.policy.fleet_signature():
            raise PolicySpecError(f"policy {spec!r} was trained for another fleet, queue or "
                                  "signals than the stable version; requests could not fit "
                                  "both")
        return require_smoke_test(shield, self.shield.smoke_timeout_s)

    # ------------------------------------------------------------ routing
    @property
    def stable(self) -> Shield:
        return self._loaded[self.state["stable"]["version"]]

    @property
    def canary(self) -> Shield | None:
        entry = self.state["canary"]
        return None if entry is None else self._loaded[entry["version"]]

    def route(self, routing_key: str | None = None) -> Shield:
        canary, weight = self.canary, float(self.state["weight"])
        if canary is None or weight <= 0.0:
            return self.stable
        if routing_key is None:
            draw = self._rng.random()
        else:
            digest = hashlib.sha256(routing_key.encode()).digest()
            draw = int.from_bytes(digest[:8], "big") / 2.0**64
        return canary if draw < weight else self.stable

    def shields(self) -> list[Shield]:
        return list(self._loaded.values())

    # ------------------------------------------------------------ changes
    def start_canary(self, spec: str | Shield, weight: float,
                     auto: dict[str, Any] | None = None, reason: str = "operator") -> str:
        """Serve ``spec`` (or a shield from :meth:`load_canary`) as the canary; persisted.
        ``auto``: the automatic controller's plan (None: promote and roll back by hand)."""
        shield = self.load_canary(spec) if isinstance(spec, str) else spec
        version = f"v{self.state['next']}"
        shield.policy.version = version
        self._loaded[version] = shield
        state = dict(self.state, next=self.state["next"] + 1, weight=weight, auto=auto,
                     canary={"version": version, "spec": shield.policy.spec})
        self._write(state)
        self._apply(state)
        mode = "automatic" if auto else "manual"
        self.log_event("canary_started", f"{reason}; weight {weight:g}, {mode}", state["canary"])
        return version

    def drop_canary(self, version: str, reason: str) -> bool:
        """Roll back canary ``version`` (if it still is the canary), logging why."""
        if self.state["canary"] is None or self.state["canary"]["version"] != version:
            return False
        log.warning("dropping canary %s (%s): %s", version, self.state["canary"]["spec"], reason)
        self.rollback(reason)
        return True

    def set_weight(self, weight: float) -> None:
        if self.canary is None:
            raise PolicySpecError("no canary to weight; start one with action 'canary'")
        self._commit(dict(self.state, weight=weight))

    def promote(self, reason: str = "operator") -> None:
        if self.canary is None:
            raise PolicySpecError("no canary to promote")
        entry = self.state["canary"]
        self._commit(dict(self.state, stable=entry, canary=None, weight=0.0, auto=None))
        self.log_event("promoted", reason, entry)

    def rollback(self, reason: str = "operator") -> None:
        if self.canary is None:
            raise PolicySpecError("no canary to roll back")
        entry = self.state["canary"]
        self._commit(dict(self.state, canary=None, weight=0.0, auto=None))
        self.log_event("rolled_back", reason, entry)

    def set_auto(self, auto: dict[str, Any] | None, event: str | None = None,
                 reason: str = "operator") -> None:
        """Persist the automatic controller's state (plan, pause flag), logging ``event``."""
        if self.canary is None:
            raise PolicySpecError("no canary: start one with action 'canary'")
        self._commit(dict(self.state, auto=auto))
        if event:
            self.log_event(event, reason, self.state["canary"])

    @property
    def auto(self) -> dict[str, Any] | None:
        return self.state.get("auto") if self.state["canary"] else None

    # ------------------------------------------------------------ transition log
    def log_event(self, event: str, reason: str, entry: dict[str, Any] | None = None) -> None:
        entry = entry or {}
        self._conn.execute("INSERT INTO rollout_events (at, event, version, spec, reason) "
                           "VALUES (?, ?, ?, ?, ?)",
                           (time.time(), event, entry.get("version"), entry.get("spec"), reason))
        self._data_version = self._version_of_db()
        log.info("rollout %s %s: %s", event, entry.get("version"), reason)

    def history(self, limit: int = 50, after_id: int = 0) -> list[dict[str, Any]]:
        """The last ``limit`` transitions with id > ``after_id``, oldest first."""
        rows = self._conn.execute(
            "SELECT id, at, event, version, spec, reason FROM rollout_events WHERE id > ? "
            "ORDER BY id DESC LIMIT ?", (after_id, limit)).fetchall()
        return [{"id": r[0], "at": r[1], "event": r[2], "version": r[3], "spec": r[4],
                 "reason": r[5]} for r in reversed(rows)]

    def _commit(self, state: dict[str, Any]) -> None:
        self._write(state)
        self._apply(state)

    def report(self, show_paths: bool = True) -> dict[str, Any]:
        """Versions, weights and counters; without ``show_paths`` a checkpoint's spec (a
        file path) reads ``checkpoint``."""
        def describe(entry: dict[str, Any] | None, weight: float) -> dict[str, Any] | None:
            if entry is None:
                return None
            shield = self._loaded[entry["version"]]
            spec = entry["spec"]
            if not show_paths and not spec.startswith(("heuristic:", "python:")):
                spec = "checkpoint"
            return {"version": entry["version"], "spec": spec,
                    "policy": shield.policy.name, "interface": shield.policy.interface,
                    "weight": weight, "counters": shield.report()}

        weight = float(self.state["weight"])
        canary = describe(self.state["canary"], weight)
        return {"stable": describe(self.state["stable"], 1.0 - weight if canary else 1.0),
                "canary": canary, "auto": self.auto}
