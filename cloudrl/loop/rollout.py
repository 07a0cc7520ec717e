"""``cloudrl loop rollout``: put a policy on canary in a running decision service and wait
for the service's automatic decision.

    export CLOUDRL_SERVE_TOKEN=...            # the service's bearer token
    cloudrl loop rollout --url http://127.0.0.1:8000 --policy models:/cloudrl-policy@challenger \\
        --weight 0.1 --promote-after 2000

It posts ``{"action": "canary", "policy": ..., "weight": ..., "auto": {...}}`` to the
service's ``/v1/rollout`` (the plan's fields are ``cloudrl.serving.schemas.AutoPlan``: the flags
below), then polls ``GET /v1/rollout`` and prints each transition of its canary (started,
paused, resumed) until the service promotes or rolls it back, with the reason. An operator
can pause, resume or force the decision meanwhile through the same endpoint.

The policy is a checkpoint directory, ``heuristic:NAME``, ``python:MODULE:FACTORY`` or a
registry URI (``models:/NAME@ALIAS`` or ``models:/NAME/VERSION``), which is resolved here
to its registered files (``cloudrl.loop.registry.resolve``), so the service must see the
same filesystem. When a registry version is promoted, the ``champion`` alias moves to it.

Exit codes: 0 promoted, 1 rolled back, 2 bad input (a flag, the token, the URL, a spec the
service refuses: one line naming it), 3 no decision within ``--timeout`` (the canary keeps
running under the service's controller) or the service failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, TextIO

from cloudrl.argparsing import CliParser

TOKEN_ENV = "CLOUDRL_SERVE_TOKEN"
PROMOTED, ROLLED_BACK, BAD_INPUT, NO_DECISION = 0, 1, 2, 3
PLAN_FLAGS = ("promote_after", "min_decisions", "max_fallback_rate", "max_intervention_rate",
              "max_infeasible", "max_latency_p95_ms", "max_sla_risk_excess")


class UsageError(ValueError):
    """Bad input: one line, exit code 2."""


class ServiceError(RuntimeError):
    """The service failed (5xx) or did not answer in time: exit code 3."""


@dataclass
class Service:
    """A minimal client of the decision service's rollout endpoint."""

    url: str
    token: str
    timeout_s: float = 30.0

    def call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url.rstrip("/") + path, data=data, method=method,
            headers={"content-type": "application/json", "authorization": f"Bearer {self.token}"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            try:
                message = json.loads(text).get("error", text)
            except (json.JSONDecodeError, AttributeError):
                message = text.strip()[:300]
            if e.code < 500:
                raise UsageError(f"{self.url}{path}: {e.code} {message}") from None
            raise ServiceError(f"{self.url}{path}: {e.code} {message}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise UsageError(f"--url {self.url}: cannot reach the service ({reason})") from None


def plan_of(args: argparse.Namespace) -> dict[str, Any]:
    """The AutoPlan fields given as flags, validated here (one line naming a bad flag)."""
    from pydantic import ValidationError

    from cloudrl.serving.schemas import AutoPlan

    given = {k: getattr(args, k) for k in PLAN_FLAGS if getattr(args, k) is not None}
    try:
        AutoPlan.model_validate(given)
    except ValidationError as e:
        err = e.errors()[0]
        flag = "--" + str(err["loc"][0]).replace("_", "-") if err["loc"] else "plan"
        raise UsageError(f"{flag}: {err['msg']}") from None
    return given


def resolve_spec(spec: str, tracking_uri: str | None) -> tuple[str, tuple[str, int] | None]:
    """(what the service loads, (registered name, version) for a registry URI else None)."""
    if not spec.startswith("models:/"):
        return spec, None
    from cloudrl.loop import registry

    try:
        version = registry.lookup(spec, tracking_uri=tracking_uri)
        path = registry.resolve(f"models:/{version.name}/{version.version}",
                                tracking_uri=tracking_uri)
    except registry.RegistryError as e:
        raise UsageError(f"--policy: {e}") from None
    return str(path), (version.name, version.version)


def wait_for_decision(service: Service, version: str, after_id: int, timeout_s: float,
                      poll_s: float, out: TextIO | None = None) -> dict[str, Any]:
    """Print the canary's transitions to ``out`` (default: ``sys.stdout`` at call time, not
    at import time, so a stream swapped since, e.g. a closed capture, is never used); return
    the one that settled it (promoted/rolled back)."""
    out = out if out is not None else sys.stdout
    deadline = time.monotonic() + timeout_s
    while True:
        status = service.call("GET", f"/v1/rollout?after_id={after_id}&limit=1000")
        for event in status["history"]:
            after_id = max(after_id, int(event["id"]))
            if event["version"] != version:
                continue
            print(f"{time.strftime('%H:%M:%S', time.localtime(event['at']))} {version} "
                  f"{event['event']}: {event['reason']}", file=out, flush=True)
            if event["event"] in ("promoted", "rolled_back"):
                return {**event, "signals": status["controller"]["signals"].get(version)}
        if time.monotonic() > deadline:
            raise ServiceError(f"no decision on canary {version} within {timeout_s:g} s "
                               "(it keeps running under the service's controller)")
        time.sleep(poll_s)


def rollout(args: argparse.Namespace) -> int:
    token = os.environ.get(TOKEN_ENV)
    if not token:
        raise UsageError(f"{TOKEN_ENV} is not set: the rollout endpoint needs the service's "
                         "bearer token")
    parsed = urllib.parse.urlparse(args.url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise UsageError(f"--url {args.url!r}: expected http://HOST:PORT")
    if not 0.0 <= args.weight <= 1.0:
        raise UsageError(f"--weight {args.weight:g}: outside [0, 1]")
    if args.timeout <= 0 or args.poll <= 0:
        raise UsageError("--timeout and --poll must be positive")
    plan = plan_of(args)
    spec, registered = resolve_spec(args.policy, args.tracking_uri)
    service = Service(args.url, token)
    after_id = max([0] + [e["id"] for e in service.call("GET", "/v1/rollout?limit=1")["history"]])
    started = service.call("POST", "/v1/rollout", {
        "action": "canary", "policy": spec, "weight": args.weight, "auto": plan,
        "reason": args.reason or f"cloudrl loop rollout {args.policy}"})
    version = started["canary"]["version"]
    print(f"canary {version} ({args.policy}) at weight {args.weight:g}, plan "
          f"{json.dumps(started['auto']['plan'])}", flush=True)
    decision = wait_for_decision(service, version, after_id, args.timeout, args.poll)
    promoted = decision["event"] == "promoted"
    if promoted and registered is not None:
        from cloudrl.loop import registry

        name, number = registered
        try:
            registry.set_alias(name, registry.CHAMPION, number, tracking_uri=args.tracking_uri)
        except registry.RegistryError as e:
            raise ServiceError(f"{version} promoted, but the champion alias did not move: "
                               f"{e}") from None
        print(f"models:/{name}@{registry.CHAMPION} -> version {number}", flush=True)
    print(json.dumps({"decision": decision["event"], "version": version,
                      "policy": args.policy, "reason": decision["reason"],
                      "signals": decision["signals"]}), flush=True)
    return PROMOTED if promoted else ROLLED_BACK


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True, help="the decision service, http://HOST:PORT")
    p.add_argument("--policy", required=True, help="checkpoint dir, heuristic:NAME, "
                   "python:MODULE:FACTORY or models:/NAME@ALIAS")
    p.add_argument("--weight", type=float, default=0.1, help="canary traffic share (0.1)")
    p.add_argument("--promote-after", type=int, help="canary decisions before promotion (500)")
    p.add_argument("--min-decisions", type=int, help="canary decisions before rates, latency "
                   "and SLA risk are judged (50)")
    p.add_argument("--max-fallback-rate", type=float, help="(0.05)")
    p.add_argument("--max-intervention-rate", type=float, help="(0.02)")
    p.add_argument("--max-infeasible", type=int, help="infeasible attempts tolerated (0)")
    p.add_argument("--max-latency-p95-ms", type=float, help="(250)")
    p.add_argument("--max-sla-risk-excess", type=float, help="canary minus stable (off)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait (3600)")
    p.add_argument("--poll", type=float, default=1.0, help="seconds between polls (1)")
    p.add_argument("--reason", help="kept in the service's transition log")
    p.add_argument("--tracking-uri", help="MLflow tracking URI of the registry")


def run(args: argparse.Namespace) -> int:
    """Exit code of ``cloudrl loop rollout`` (errors as one line on stderr)."""
    try:
        return rollout(args)
    except UsageError as e:
        print(f"cloudrl loop rollout: {e}", file=sys.stderr)
        return BAD_INPUT
    except ServiceError as e:
        print(f"cloudrl loop rollout: {e}", file=sys.stderr)
        return NO_DECISION


def main(argv: list[str] | None = None) -> int:
    parser = CliParser(prog="cloudrl loop rollout", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
