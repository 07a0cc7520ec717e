"""The deployed fleet's layout, for clients: ``GET /v1/fleet`` and the OpenAPI schema.

A request must list exactly the policy's servers, in fleet order, each with the tier at
its index and usage within that tier's capacity; pending jobs may not exceed the largest
server or the queue. :func:`fleet_layout` states all of it as one JSON document (with a
minimal valid request to start from), and :func:`fleet_openapi` writes the same rules
into the OpenAPI schema: ``servers`` becomes a tuple (``prefixItems``) whose item ``i``
fixes server ``i``'s tier and capacity and spells out the consistent server states
(busy, idle or asleep, waking), so a client or a schema-driven fuzzer can build a valid
``/v1/decide`` request from the schema alone. For a policy with signals both state the
``signals`` it requires (the forecast length is its horizon in ticks; solar fields only
when it observes solar); for one without, ``signals`` is not in the schema (refused).
The states inside ``/v1/feedback`` trajectories (``ClusterState``) carry the fleet's rules
too, but their ``signals`` stay what that endpoint accepts: optional, any forecast length,
solar optional (it stores them as given; the pair export checks them against the env).
"""

from __future__ import annotations

import copy
from typing import Any

from envs.snapshot import MAX_JOBS, MAX_TICKS
from serve_apps.runtime import ServedPolicy


def _servers(policy: ServedPolicy) -> list[dict[str, Any]]:
    fleet = policy.fleet
    return [{"index": i, "tier": fleet.tier_names[int(t)],
             "cpu_cores": float(fleet.cpu_cap[i] * fleet.largest_cpu_cores),
             "mem_gib": float(fleet.mem_cap[i] * fleet.largest_mem_gib)}
            for i, t in enumerate(fleet.tier.tolist())]


def fleet_layout(policy: ServedPolicy, max_batch_size: int) -> dict[str, Any]:
    """What a valid request must match, per server index, plus a minimal valid request."""
    fleet, sim = policy.fleet, policy.env_config.sim
    counts = {name: int((fleet.tier == i).sum()) for i, name in enumerate(fleet.tier_names)}
    servers = _servers(policy)
    return {
        "policy": policy.name, "interface": policy.interface, "n_servers": fleet.n_servers,
        "servers": servers,
        "tiers": [{"name": t.name, "cpu_cores": t.cpu_cores, "mem_gib": t.mem_gib,
                   "p_idle_w": t.p_idle_w, "p_max_w": t.p_max_w,
                   "power_exponent": t.power_exponent, "count": counts.get(t.name, 0)}
                  for t in sim.fleet.tiers],
        "largest_cpu_cores": float(fleet.largest_cpu_cores),
        "largest_mem_gib": float(fleet.largest_mem_gib),
        "queue_capacity": sim.queue_capacity, "queue_window": sim.queue_window,
        "priority_levels": sim.priority_levels, "max_batch_size": max_batch_size,
        "signals": None if policy.signals is None else policy.signals.describe(),
        "example": example_request(policy),
    }


def example_request(policy: ServedPolicy) -> dict[str, Any]:
    """A minimal valid request: every server idle, no jobs, and for a policy with signals
    flat signals at the configured means (price, carbon; no solar output)."""
    fleet = policy.fleet
    body: dict[str, Any] = {"servers": [{"tier": fleet.tier_names[int(t)]}
                                        for t in fleet.tier.tolist()], "jobs": []}
    layout, cfg = policy.signals, policy.env_config.signals
    if layout is not None:
        h = layout.horizon_ticks
        price, carbon = float(cfg.price_mean_usd_per_mwh), float(cfg.carbon_mean_g_per_kwh)
        body["signals"] = {"price_now": price, "carbon_now": carbon,
                           "price_fc": [price] * h, "carbon_fc": [carbon] * h}
        if layout.solar:
            body["signals"].update(solar_now_kw=0.0, solar_fc_kw=[0.0] * h)
    return body


def _signals_openapi(comps: dict[str, Any], props: dict[str, Any], required: list[str],
                     policy: ServedPolicy) -> None:
    """The request's ``signals`` as ``policy`` needs it (see the module docstring)."""
    layout = policy.signals
    if layout is None:
        props.pop("signals", None)
        return
    signals = props.get("signals")
    if signals is None or "Signals" not in comps:
        return
    signals.pop("anyOf", None)
    signals.pop("default", None)
    signals["$ref"] = "#/components/schemas/Signals"
    if "signals" not in required:
        required.append("signals")
    sig = comps["Signals"]
    sig_props, sig_required = sig["properties"], sig.setdefault("required", [])
    for name in ("solar_now_kw", "solar_fc_kw"):
        prop = sig_props.get(name)
        if prop is None:
            continue
        if not layout.solar:
            sig_props.pop(name)
            continue
        options = [o for o in prop.pop("anyOf", []) if o.get("type") != "null"]
        prop.pop("default", None)
        if options:
            prop.update(options[0])
        if name not in sig_required:
            sig_required.append(name)
    for name in ("price_fc", "carbon_fc", "solar_fc_kw"):
        if name in sig_props:
            sig_props[name].update(minItems=layout.horizon_ticks, maxItems=layout.horizon_ticks)


def _feedback_signals_openapi(props: dict[str, Any], signals: dict[str, Any] | None) -> None:
    """A feedback trajectory state's ``signals`` as ``/v1/feedback`` accepts it: optional
    (null or left out), validated as ``Signals`` alone (``signals`` is that model's schema,
    before the policy's rules are written into it)."""
    if signals is None:
        return
    props["signals"] = {
        "anyOf": [signals, {"type": "null"}], "default": None,
        "description": "price, carbon (and solar) now and forecast, as observed at this "
                       "state: optional here (stored as given); exporting the feedback as "
                       "preference pairs needs them for a policy with signals (forecasts of "
                       "its horizon in ticks, solar exactly when it observes solar) and "
                       "refuses them for one without"}


def _zero() -> dict[str, Any]:
    return {"type": "number", "minimum": 0, "maximum": 0}


def server_schema(tier: str, cpu_cores: float, mem_gib: float) -> dict[str, Any]:
    """Server ``i``'s rules: its tier, and one of the consistent states within capacity."""
    def state(power: dict[str, Any], busy: bool, waking: bool,
              required: list[str]) -> dict[str, Any]:
        return {"type": "object", "additionalProperties": False, "required": required,
                "properties": {
                    "tier": {"type": "string", "const": tier},
                    "power_state": power,
                    "wake_left": {"type": "integer", "minimum": 1 if waking else 0,
                                  "maximum": MAX_TICKS},
                    "used_cpu_cores": {"type": "number", "minimum": 0, "maximum": cpu_cores}
                    if busy else _zero(),
                    "used_mem_gib": {"type": "number", "minimum": 0, "maximum": mem_gib}
                    if busy else _zero(),
                    "n_running": {"type": "integer", "minimum": 1, "maximum": MAX_JOBS}
                    if busy else {"type": "integer", "minimum": 0, "maximum": 0}}}

    return {"description": f"a {tier} server ({cpu_cores:g} cores, {mem_gib:g} GiB): busy "
                           "(active, running jobs), idle or asleep, or waking",
            "anyOf": [
                state({"type": "string", "const": "active"}, True, False, ["tier", "n_running"]),
                state({"type": "string", "enum": ["active", "asleep"]}, False, False, ["tier"]),
                state({"type": "string", "const": "waking"}, False, True,
                      ["tier", "power_state", "wake_left"])]}


def fleet_openapi(schema: dict[str, Any], policy: ServedPolicy, max_batch_size: int
                  ) -> dict[str, Any]:
    """``schema`` with the rules of ``policy``'s fleet that a client must follow."""
    comps = schema.get("components", {}).get("schemas", {})
    n, sim, fleet = policy.fleet.n_servers, policy.env_config.sim, policy.fleet
    per_index = [server_schema(s["tier"], s["cpu_cores"], s["mem_gib"])
                 for s in _servers(policy)]
    signals = copy.deepcopy(comps.get("Signals"))  # as the model accepts it, any policy
    for name in ("ClusterState", "DecideRequest"):
        props = comps.get(name, {}).get("properties")
        if props:
            servers = props["servers"]
            servers.pop("items", None)
            servers.update(minItems=n, maxItems=n, prefixItems=per_index, items=False)
            props["jobs"]["maxItems"] = sim.queue_capacity
            props["priority_level"]["maximum"] = sim.priority_levels - 1
            if name == "ClusterState":  # the states of /v1/feedback trajectories
                _feedback_signals_openapi(props, signals)
            else:
                _signals_openapi(comps, props, comps[name].setdefault("required", []),
                                 policy)
    if "ServerState" in comps:
        tiers = list(dict.fromkeys(fleet.tier_names[t] for t in fleet.tier))
        comps["ServerState"]["properties"]["tier"]["enum"] = tiers
    job = comps.get("PendingJob", {}).get("properties")
    if job:
        job["cpu_cores"]["maximum"] = float(fleet.largest_cpu_cores)
        job["mem_gib"]["maximum"] = float(fleet.largest_mem_gib)
    if "DecideBatchRequest" in comps:
        comps["DecideBatchRequest"]["properties"]["states"]["maxItems"] = max_batch_size
    return schema
