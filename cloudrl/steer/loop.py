"""``cloudrl steer loop``: operators' own trade-offs, end to end through the labelling app.

1. Pool (TRAIN seeds): the heuristic and the MPC at random points of their spaces (and
   the run-at-once corner, the MPC's defaults), each episode recorded tick by tick
   (:mod:`.trace`) and stored as a labelling segment (:mod:`.segments`).
2. Labelling: a fresh store, one token per operator (and an admin), the app started by
   this command (``python -m cloudrl.labelling serve``: real uvicorn, on ``port`` or a
   free one), candidate pairs enqueued for every operator (k = number of operators).
   The scripted operators (:mod:`.operators`, one process each: only they load a hidden
   utility) label over HTTP in ``rounds``; between rounds the learner refits each
   operator's reward model on the labels so far and re-prioritises the open pairs by its
   ensemble's uncertainty (:func:`cloudrl.labelling.active.uncertainty`): active querying.
3. Export and reward models: per operator, its own labels (:func:`.reward.operator_labels`),
   a sequence reward model (:mod:`.reward`); agreement from ``/api/admin/stats``; a drift
   report per operator (recent vs older labels).
4. Steering (VALIDATION seeds): per operator and family, the search point with the highest
   mean learned reward; the default-tuned point (lowest mean cost) beside it.
5. Evaluation (TEST seeds, :mod:`.evaluate`): only now is a hidden utility loaded, to
   measure; ``learner_saw_utilities`` records that nothing before it had loaded one.

``--scenario`` plays one catalog scenario in every phase (the phases differ by their seeds);
``--site`` plays the site's split parts (:func:`phase_scenarios`): the pool, the reward
models' data and every ES candidate (steering and the hidden-tuned reference) read the train
part; whatever selects (the search points, the ES iteration kept) the validation part; the
reported test the test part. ``report["phases"]`` lists the part and seeds each phase played.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cloudrl.protocol import test_seeds, train_seeds, validation_seeds
from cloudrl.scenarios.runner import ControllerSpec
from cloudrl.steer.operators import TOKEN_ENV, OperatorSpec
from cloudrl.steer.trace import Trace, record_many

UTILITIES_MODULE = "cloudrl.steer.utilities"
FAMILIES = ("signal_aware", "mpc")


PARTS = ("train", "validation", "test")
CARBON_MODELS = ("gbt", "seasonal_naive")


@dataclass
class LoopConfig:
    scenario: str | None = None  # a catalog scenario (default tiny), or:
    site: str | None = None  # a real site (``cloudrl sites list``) on its split's parts
    split: str = "temporal"
    carbon_model: str = "gbt"  # the site's carbon forecasts (gbt: fit on the train part)
    operators: tuple[OperatorSpec, ...] = field(default_factory=lambda: (
        OperatorSpec("alice", "hour_carbon"), OperatorSpec("bob", "lc_window")))
    comparisons: int = 300  # labels per operator (skips count)
    rounds: int = 3
    pool_heuristic: int = 20
    pool_mpc: int = 5
    pool_seeds: int = 2
    search_heuristic: int = 16
    search_mpc: int = 4
    val_seeds: int = 4
    n_test_seeds: int = 10
    members: int = 3
    steps: int = 200
    seed: int = 0
    workers: int = 1
    port: int = 0
    out: str = "results/steer/loop"
    start: str | None = None  # a learned checkpoint of the scenario: steered by ES
    pool_learned: int = 4  # perturbed copies of the start in the pool
    es_iterations: int = 8
    es_pairs: int = 3
    es_seeds: int = 2
    es_lr: float = 0.01
    es_sigma: float = 0.02
    snapshots: tuple[int, ...] = ()  # label counts whose reward models also steer
    drift_threshold: float = 0.1  # accuracy drop (recent vs older) that retrains, at least
    # 1.64 standard errors of that drop
    canary: str | None = None  # the operator whose steered policy goes on canary
    serve_port: int = 0
    reference_dir: str | None = None  # cache of the hidden-tuned references

    def __post_init__(self) -> None:
        if self.scenario is not None and self.site is not None:
            raise ValueError("--scenario and --site: give exactly one")
        if self.site is None:
            self.scenario = self.scenario or "tiny"
        else:
            self._check_site()
        if not 1 <= self.comparisons <= 1000:
            raise ValueError(f"--comparisons {self.comparisons}: must be in [1, 1000] "
                             "(labels per operator)")
        if not self.operators:
            raise ValueError("--operators: at least one")
        names = [o.name for o in self.operators]
        if len(set(names)) != len(names):
            raise ValueError(f"--operators: names repeat ({', '.join(names)})")
        for name in ("rounds", "pool_heuristic", "pool_seeds", "search_heuristic",
                     "val_seeds", "n_test_seeds", "members", "steps", "workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("pool_mpc", "search_mpc"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("pool_seeds", "val_seeds", "n_test_seeds"):
            if getattr(self, name) > 50:
                raise ValueError(f"{name} must be <= 50, got {getattr(self, name)}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port {self.port}: not a port")
        if not 0 <= self.serve_port <= 65535:
            raise ValueError(f"--serve-port {self.serve_port}: not a port")
        if self.start is not None and not (Path(self.start) / "policy.json").is_file():
            raise ValueError(f"--start {self.start}: not a learned checkpoint (no policy.json)")
        if self.pool_learned < 0:
            raise ValueError(f"--pool-learned must be >= 0, got {self.pool_learned}")
        for name in ("es_iterations", "es_pairs", "es_seeds"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, "
                                 f"got {getattr(self, name)}")
        for name in ("es_lr", "es_sigma"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0, "
                                 f"got {getattr(self, name)}")
        for n in self.snapshots:
            if not 1 <= n < self.comparisons:
                raise ValueError(f"--snapshots {n}: must be in [1, --comparisons)")
        if self.canary is not None:
            if self.start is None:
                raise ValueError("--canary: needs --start (the learned policy it steers)")
            if self.canary not in names:
                raise ValueError(f"--canary {self.canary}: not an operator "
                                 f"({', '.join(names)})")
            if self.site is not None:
                raise ValueError("--canary: only with --scenario (the decision service "
                                 "serves catalog scenarios)")

    def _check_site(self) -> None:
        from cloudrl.sites.registry import get_site

        site = get_site(self.site)  # UnknownSiteError (a ValueError) names the known ones
        if self.split not in site.splits:
            raise ValueError(f"--split {self.split}: not a split of site {self.site} "
                             f"({', '.join(site.splits)})")
        if self.carbon_model not in CARBON_MODELS:
            raise ValueError(f"--carbon-model {self.carbon_model}: valid: "
                             f"{', '.join(CARBON_MODELS)}")
        if self.start is not None and (Path(self.start) / "policy.json").is_file():
            trained = json.loads((Path(self.start) / "policy.json").read_text()).get("scenario")
            want = f"{self.site}-{self.split}-train"
            if trained != want:
                raise ValueError(f"--start {self.start}: trained on {trained!r}, not on "
                                 f"{want!r} (the site's train part)")

    @property
    def label(self) -> str:
        """The scenario, or ``site/split``."""
        return self.scenario if self.site is None else f"{self.site}/{self.split}"

    def es(self, run_seed: int) -> Any:
        from cloudrl.steer.finetune import SteerES

        return SteerES(iterations=self.es_iterations, pairs=self.es_pairs,
                       seeds_per_candidate=self.es_seeds, n_val_seeds=self.val_seeds,
                       sigma=self.es_sigma, lr=self.es_lr, eval_every=2, run_seed=run_seed)


def phase_scenarios(cfg: LoopConfig) -> dict[str, Any]:
    """The scenario each part of the protocol plays (``train``, ``validation``, ``test``):
    the catalog scenario for all three, or the site's split parts (module docstring)."""
    if cfg.site is None:
        from envs.scenario.catalog import load_scenario

        scn = load_scenario(cfg.scenario)
        return dict.fromkeys(PARTS, scn)
    from cloudrl.sites.registry import get_site
    from cloudrl.sites.scenario import site_scenario
    from cloudrl.sites.splits import check_no_leak

    site = get_site(cfg.site)
    check_no_leak(site, cfg.split)
    return {p: site_scenario(site, cfg.split, p, carbon_model=cfg.carbon_model)
            for p in PARTS}


def _phase(name: str, part: str, scn: Any, seeds: Any, played: Any = None
           ) -> dict[str, Any]:
    """One entry of ``report["phases"]``: what a phase played (``played``: the scenario
    names its episodes recorded, when not ``scn``'s)."""
    return {"phase": name, "part": part, "scenario": scn.name,
            "played": sorted(set(played)) if played is not None else [scn.name],
            "csv_path": getattr(scn.signals, "csv_path", None),
            "seeds": sorted({int(s) for s in seeds})}


def _es_phases(name: str, history: list[dict[str, Any]], scns: dict[str, Any]
               ) -> list[dict[str, Any]]:
    """The ES candidates' train seeds and the validations' seeds of a fine-tune, with the
    scenarios the fine-tune's own history says they played."""
    cand = [h for h in history if "seeds" in h]
    val = [h for h in history if "val_seeds" in h]
    return [_phase(f"{name} candidates", "train", scns["train"],
                   [s for h in cand for s in h["seeds"]],
                   [h.get("scenario", "?") for h in cand]),
            _phase(f"{name} validation", "validation", scns["validation"],
                   [s for h in val for s in h["val_seeds"]],
                   [h.get("val_scenario", "?") for h in val])]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _specs(rng: np.random.Generator, n_h: int, n_m: int) -> list[ControllerSpec]:
    from cloudrl.scenarios.steering import steer_mpc_space
    from cloudrl.scenarios.tuning import RUN_AT_ONCE_LIKE, heuristic_space

    out = [ControllerSpec("signal_aware", dict(RUN_AT_ONCE_LIKE))]
    out += [ControllerSpec("signal_aware", heuristic_space(rng)) for _ in range(n_h)]
    if n_m:
        out.append(ControllerSpec("mpc", {}))
        out += [ControllerSpec("mpc", steer_mpc_space(rng)) for _ in range(n_m - 1)]
    return out


class LabellingApp:
    """The labelling service in its own process (uvicorn), stopped on exit."""

    def __init__(self, db: Path, port: int, log: Path) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cloudrl.labelling", "serve", "--db", str(db), "--port",
             str(self.port), "--gold-rate", "0", "--rate", "1000", "--burst", "1000"],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the labelling app did not start on port {self.port} "
                                   f"(see {log})")
            time.sleep(0.2)

    def get(self, path: str, token: str) -> dict[str, Any]:
        req = urllib.request.Request(self.url + path,
                                     headers={"authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _run_operators(app: LabellingApp, ops: tuple[OperatorSpec, ...], tokens: dict[str, str],
                   n: int, offsets: dict[str, int], total: int, seed: int, rnd: int
                   ) -> list[dict[str, Any]]:
    """One round: every operator labels up to ``n`` more pairs, all at once, each in its
    own process; their counts."""
    procs = []
    for i, op in enumerate(ops):
        env = {**os.environ, TOKEN_ENV: tokens[op.name]}
        cmd = [sys.executable, "-m", "cloudrl.steer.operators", "--url", app.url, "--name",
               op.name, "--utility", op.utility, "--flip", str(op.flip), "--temperature",
               str(op.temperature), "--equal", str(op.equal), "--skip", str(op.skip),
               "--max-labels", str(n), "--offset", str(offsets[op.name]),
               "--total", str(total), "--seed", str(seed * 1000 + i * 100 + rnd)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    out = []
    for op, p in zip(ops, procs, strict=True):
        stdout, stderr = p.communicate(timeout=3600)
        if p.returncode != 0:
            raise RuntimeError(f"operator {op.name} failed ({p.returncode}): "
                               f"{(stderr or '').strip().splitlines()[-1:]}")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def _learned_pool(start: str, n: int, rng: np.random.Generator, out: Path
                  ) -> list[ControllerSpec]:
    """The start and ``n`` copies of it with every weight perturbed (sigma 0.05), written
    under ``out``: the pool shows the operators behaviour near the policy to be steered."""
    import torch

    from cloudrl.algorithms.distill.policy import (
        load_checkpoint,
        ready_margins_of,
        release_levels_of,
        save_checkpoint,
    )

    specs = [ControllerSpec("learned", {"checkpoint": str(start)})]
    for k in range(n):
        module, spec = load_checkpoint(start)
        with torch.no_grad():
            for prm in module.parameters():
                prm.add_(torch.as_tensor(rng.normal(0.0, 0.05, tuple(prm.shape)),
                                         dtype=prm.dtype))
        path = save_checkpoint(module, out / f"p{k}", tuple(spec["model_config"]["hiddens"]),
                               {"scenario": spec.get("scenario"), "perturbed_from": str(start)},
                               release_levels_of(spec), ready_margins_of(spec))
        specs.append(ControllerSpec("learned", {"checkpoint": str(path)}))
    return specs


def _round_sizes(comparisons: int, rounds: int, snapshots: tuple[int, ...]) -> list[int]:
    """Labels per round: ``rounds`` even rounds, split further at every snapshot count."""
    ends = {comparisons * (r + 1) // rounds for r in range(rounds)} | set(snapshots)
    ends = sorted(e for e in ends if 0 < e <= comparisons)
    return [b - a for a, b in zip([0, *ends[:-1]], ends, strict=True)]


def _candidate_pairs(keys: list[str], n: int, rng: np.random.Generator) -> list[tuple[str, str]]:
    """Up to ``n`` distinct unordered pairs of distinct keys, at random."""
    allp = [(keys[i], keys[j]) for i in range(len(keys)) for j in range(i + 1, len(keys))]
    idx = rng.permutation(len(allp))[:n]
    return [allp[i] for i in idx]


def _reprioritise(conn: Any, models: dict[str, Any], traces: dict[str, Trace]) -> int:
    """Open pairs ranked by the operators' reward models' uncertainty (mean over them)."""
    from cloudrl.labelling.active import uncertainty
    from cloudrl.labelling.queue import set_priorities

    rows = conn.execute("SELECT p.id, sa.seg_key, sb.seg_key FROM pairs p JOIN segments sa "
                        "ON sa.id = p.a_seg JOIN segments sb ON sb.id = p.b_seg "
                        "WHERE p.taken < p.k").fetchall()
    if not rows or not models:
        return 0
    keys = list(traces)
    index = {k: i for i, k in enumerate(keys)}
    a = np.array([index[r[1]] for r in rows])
    b = np.array([index[r[2]] for r in rows])
    pri = np.zeros(len(rows))
    for model in models.values():
        inp = model.inputs([traces[k] for k in keys])
        pri += uncertainty(model.pair_gaps(inp, a, b)) / len(models)
    return set_priorities(conn, [(int(r[0]), float(p)) for r, p in zip(rows, pri, strict=True)])


def steer_loop(cfg: LoopConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The loop (module docstring); returns the report, also written to ``out``."""
    from cloudrl.labelling.db import connect
    from cloudrl.labelling.tokens import add_operator
    from cloudrl.steer.reward import drift_forward, drift_report, learn, operator_labels
    from cloudrl.steer.segments import enqueue_pairs, segment_key, segment_of

    t0 = time.perf_counter()
    scns = phase_scenarios(cfg)
    scn = scns["train"]
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([cfg.seed, 0x57EE])

    # 1. the pool, on train seeds
    pspecs = _specs(rng, cfg.pool_heuristic, cfg.pool_mpc)
    if cfg.start is not None:
        pspecs += _learned_pool(cfg.start, cfg.pool_learned, rng, out / "pool_learned")
    pseeds = list(train_seeds(cfg.pool_seeds))
    ptraces = record_many(scn, pspecs, pseeds, cfg.workers)
    traces: dict[str, Trace] = {}
    segments = {}
    for spec, row in zip(pspecs, ptraces, strict=True):
        for seed, tr in zip(pseeds, row, strict=True):
            key = segment_key(scn.name, spec.kind, spec.params, seed)
            traces[key] = tr
            segments[key] = segment_of(key, tr, scn.name, spec.kind, seed)
    phases = [_phase("pool and reward-model data", "train", scn, pseeds)]
    log(f"pool: {len(traces)} episodes ({len(pspecs)} behaviours x {len(pseeds)} train "
        f"seeds of {scn.name}), {time.perf_counter() - t0:.0f} s")

    # 2. the store, tokens, the app, candidate pairs
    db = out / "labels.db"
    for suffix in ("", "-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    conn = connect(db)
    tokens = {op.name: add_operator(conn, op.name) for op in cfg.operators}
    admin = add_operator(conn, "steer-admin", admin=True)
    n_cand = min(len(traces) * (len(traces) - 1) // 2, 2 * cfg.comparisons)
    pairs = _candidate_pairs(list(traces), n_cand, rng)
    enqueue_pairs(conn, segments, pairs, k=len(cfg.operators))
    log(f"enqueued {len(pairs)} pairs, each for {len(cfg.operators)} operators")

    app = LabellingApp(db, cfg.port, out / "app.log")
    counts: dict[str, dict[str, int]] = {op.name: {} for op in cfg.operators}
    offsets = {op.name: 0 for op in cfg.operators}
    models: dict[str, Any] = {}
    infos: dict[str, Any] = {}
    snap: dict[int, dict[str, Any]] = {}  # label count -> operator -> reward model
    snap_info: dict[int, dict[str, Any]] = {}
    try:
        per_round = _round_sizes(cfg.comparisons, cfg.rounds, tuple(cfg.snapshots))
        for rnd, n in enumerate(per_round):
            if n == 0:
                continue
            res = _run_operators(app, cfg.operators, tokens, n, offsets, cfg.comparisons,
                                 cfg.seed, rnd)
            for c in res:
                offsets[c["operator"]] += c["labels"]
                for k, v in c.items():
                    if isinstance(v, int) and k != "switch_at":
                        counts[c["operator"]][k] = counts[c["operator"]].get(k, 0) + v
            labels = operator_labels(conn)
            for op in cfg.operators:
                if len(labels.get(op.name, [])) >= 2:
                    models[op.name], infos[op.name] = learn(
                        traces, labels[op.name], seed=cfg.seed, steps=cfg.steps,
                        members=cfg.members)
            done = sum(per_round[:rnd + 1])
            if done in cfg.snapshots:
                snap[done], snap_info[done] = dict(models), {
                    k: v["heldout_acc"] for k, v in infos.items()}
            if rnd < len(per_round) - 1:
                _reprioritise(conn, models, traces)
            log(f"round {rnd + 1}/{len(per_round)}: " + ", ".join(
                f"{op.name} {offsets[op.name]} labels (held-out pair accuracy "
                f"{infos.get(op.name, {}).get('heldout_acc', float('nan')):.3f})"
                for op in cfg.operators) + f" ({time.perf_counter() - t0:.0f} s)")
        stats = app.get("/api/admin/stats", admin)
    finally:
        app.stop()

    # 3. export: each operator's labels; drift
    labels = operator_labels(conn)
    (out / "labels.json").write_text(json.dumps(labels))
    drift = {name: drift_report(models[name], traces, labels[name])
             for name in models if len(labels.get(name, [])) >= 10}
    stale: dict[str, Any] = {}
    for name, d in drift.items():  # a drop in accuracy on the newest labels: retrain on them
        d["forward"] = drift_forward(traces, labels[name], seed=cfg.seed, steps=cfg.steps,
                                     members=cfg.members)
        # a drop larger than the threshold and than 1.64 standard errors (one-sided 95%)
        fw = d["forward"]
        # (a negative threshold retrains every operator: a drill)
        d["retrained"] = cfg.drift_threshold < 0 or fw["accuracy_change"] <= -max(
            cfg.drift_threshold, 1.64 * fw["standard_error"])
        if d["retrained"]:
            recent = labels[name][-int(round(0.4 * len(labels[name]))):]
            stale[name] = models[name]
            models[name], info = learn(traces, recent, seed=cfg.seed, steps=cfg.steps,
                                       members=cfg.members)
            d["retrained_on"] = len(recent)
            d["retrained_heldout_acc"] = info["heldout_acc"]
            log(f"drift: a model of {name}'s older labels predicts its newest ones "
                f"{-d['forward']['accuracy_change']:.3f} worse than its held-out older "
                f"ones: retrained on its newest {len(recent)} labels "
                f"(held-out pair accuracy {info['heldout_acc']:.3f})")

    # 4. steering on validation seeds (the learner's choice)
    srng = np.random.default_rng([cfg.seed, 13])
    search = {f: [s for s in _specs(srng, cfg.search_heuristic, cfg.search_mpc)
                  if s.kind == f] for f in FAMILIES}
    vseeds = list(validation_seeds(cfg.val_seeds))
    vtraces = {f: record_many(scns["validation"], search[f], vseeds, cfg.workers)
               for f in FAMILIES if search[f]}
    phases.append(_phase("search selection", "validation", scns["validation"], vseeds))
    chosen: dict[str, dict[str, int]] = {}
    for f, rows in vtraces.items():
        cost = [np.mean([t.cost_usd() for t in row]) for row in rows]
        chosen.setdefault("default", {})[f] = int(np.argmin(cost))
        for name, model in models.items():
            r = [float(model.score(model.inputs(row)).mean()) for row in rows]
            chosen.setdefault(name, {})[f] = int(np.argmax(r))
    steered = _steer_learned(cfg, scns, models, snap, stale, out, log) \
        if cfg.start is not None else {}
    for key, st in steered.items():
        phases += _es_phases(f"steering {key}", st.pop("history"), scns)
    learner_saw = UTILITIES_MODULE in sys.modules
    log(f"steered (validation, {len(vseeds)} seeds): " + ", ".join(
        f"{name}: " + " ".join(f"{f} #{i}" for f, i in ch.items())
        for name, ch in chosen.items()) + f" ({time.perf_counter() - t0:.0f} s)")

    # 5. evaluation under each operator's hidden utility, on test seeds
    from cloudrl.steer.evaluate import hidden_choice, rows_for

    tseeds = list(test_seeds(cfg.n_test_seeds))
    need: dict[tuple[str, int], None] = {}
    hidden: dict[str, dict[str, int]] = {}
    for op in cfg.operators:
        for f, rows in vtraces.items():
            hidden.setdefault(op.name, {})[f] = hidden_choice(op.utility, rows)
            for who in ("default", op.name):
                if who in chosen:
                    need[(f, chosen[who][f])] = None
            need[(f, hidden[op.name][f])] = None
    need[("signal_aware", chosen["default"]["signal_aware"])] = None
    order = list(need)
    ttr = record_many(scns["test"], [search[f][i] for f, i in order], tseeds, cfg.workers)
    test = dict(zip(order, ttr, strict=True))
    base = test[("signal_aware", chosen["default"]["signal_aware"])]
    table = []
    for op in cfg.operators:
        if op.name not in chosen:
            continue
        for f in vtraces:
            rows = rows_for(op.utility, f, {
                "default": test[(f, chosen["default"][f])],
                "hidden": test[(f, hidden[op.name][f])],
                "steered": test[(f, chosen[op.name][f])]}, base)
            for r in rows:
                r["operator"] = op.name
            table.extend(rows)
    if steered:
        table.extend(_learned_rows(cfg, scns, steered, tseeds, base, out, log, phases))
    phases.append(_phase("test", "test", scns["test"], tseeds))
    canary = None
    if cfg.canary is not None:
        from cloudrl.steer.canary import canary_rollout

        canary = canary_rollout(cfg.scenario, steered[cfg.canary], cfg.start, out,
                                cfg.serve_port, log)
    report = {"config": {**asdict(cfg), "operators": [asdict(o) for o in cfg.operators]},
              "pool_episodes": len(traces), "pairs_enqueued": len(pairs),
              "label_counts": counts, "reward_models": infos, "drift": drift,
              "agreement": stats.get("quality", {}), "queue": stats.get("queue", {}),
              "chosen": {k: {f: search[f][i].params for f, i in v.items()}
                         for k, v in chosen.items()},
              "hidden_tuned": {k: {f: search[f][i].params for f, i in v.items()}
                               for k, v in hidden.items()},
              "learner_saw_utilities": learner_saw, "rows": table,
              "steered_learned": steered, "snapshot_heldout_acc": snap_info,
              "canary": canary, "phases": phases,
              "wall_s": time.perf_counter() - t0}
    report["table"] = format_table(report)
    (out / "report.json").write_text(json.dumps(report, indent=2, default=float))
    return report


def _steer_learned(cfg: LoopConfig, scns: dict[str, Any], models: dict[str, Any],
                   snap: dict[int, dict[str, Any]], stale: dict[str, Any], out: Path,
                   log: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """The start fine-tuned by ES on each operator's learned reward (validation seeds,
    the learned reward only), also on every snapshot's model and on a drifted operator's
    stale one; per key (``alice``, ``alice@100``, ``carol:stale``) its checkpoint."""
    from cloudrl.steer.finetune import save_steered, steer_policy

    jobs = [(name, name, None, m) for name, m in models.items()]
    jobs += [(f"{name}@{n}", name, n, m) for n, ms in sorted(snap.items())
             for name, m in ms.items()]
    jobs += [(f"{name}:stale", name, None, m) for name, m in stale.items()]
    done: dict[str, dict[str, Any]] = {}
    for key, name, n, model in jobs:
        es = cfg.es(cfg.seed)

        def objective(trs: list[Trace], model: Any = model) -> np.ndarray:
            return -model.score(model.inputs(trs))

        log(f"steering the learned policy on {key}'s learned reward (ES, "
            f"{es.episodes()} episodes)")
        res = steer_policy(scns["train"], cfg.start, objective, es, log,
                           _val_scn(cfg, scns))
        path = save_steered(res, cfg.start, out / "steered" / key.replace("@", "_at")
                            .replace(":", "_"), scns["train"], es, f"learned reward of {key}")
        done[key] = {"operator": name, "labels": n or cfg.comparisons,
                     "stale": key.endswith(":stale"), "checkpoint": str(path),
                     "kept_iteration": res.kept_iteration, "val_learned_start": -res.val_start,
                     "val_learned_kept": -res.val_kept, "episodes": res.episodes,
                     "wall_s": res.wall_s, "history": res.history}
    return done


def _val_scn(cfg: LoopConfig, scns: dict[str, Any]) -> Any:
    """The ES validations' scenario: a site's validation part (None: the one scenario)."""
    return scns["validation"] if cfg.site is not None else None


def _learned_rows(cfg: LoopConfig, scns: dict[str, Any], steered: dict[str, dict[str, Any]],
                  tseeds: list[int], base: list[Trace], out: Path,
                  log: Callable[[str], None], phases: list[dict[str, Any]]
                  ) -> list[dict[str, Any]]:
    """Test-seed rows of the learned family: the start (default), the start fine-tuned on
    the hidden utility (hidden) and each steered checkpoint, under the hidden utility."""
    from cloudrl.steer.evaluate import hidden_reference, rows_for

    ops = {o.name: o for o in cfg.operators}
    cache = Path(cfg.reference_dir) if cfg.reference_dir else out / "reference"
    refs = {o.name: str(hidden_reference(scns["train"], cfg.start, o.utility, cfg.es(0), cache,
                                         log, _val_scn(cfg, scns)))
            for o in cfg.operators}
    for name, ref in refs.items():
        hist = json.loads((Path(ref) / "manifest.json").read_text())["history"]
        phases += _es_phases(f"hidden-tuned reference {name}", hist, scns)
    paths = list(dict.fromkeys([cfg.start, *refs.values(),
                                *(s["checkpoint"] for s in steered.values())]))
    trs = record_many(scns["test"], [ControllerSpec("learned", {"checkpoint": p}) for p in paths],
                      tseeds, cfg.workers)
    test = dict(zip(paths, trs, strict=True))
    rows = []
    for key, st in steered.items():
        op = ops[st["operator"]]
        for r in rows_for(op.utility, "learned", {
                "default": test[cfg.start], "hidden": test[refs[op.name]],
                "steered": test[st["checkpoint"]]}, base):
            if key != op.name and r["policy"] != "steered":
                continue
            r.update(operator=key, labels=st["labels"])
            rows.append(r)
    return rows


def format_table(rep: dict[str, Any]) -> str:
    c = rep["config"]
    where = c.get("scenario") or f"{c['site']}/{c['split']} (site)"
    lines = [f"{where}: {c['comparisons']} labels per operator over HTTP, "
             f"{c['n_test_seeds']} test seeds; U = the operator's hidden utility "
             "($/episode, lower is better)",
             f"{'operator':10s} {'utility':24s} {'family':13s} {'policy':8s} {'U':>8s} "
             f"{'cost':>7s}  {'U - default heuristic [95% CI]':>30s} {'gap closed':>10s}"]
    for r in rep["rows"]:
        d, lo, hi = r["vs_default_heuristic"]
        gap = "" if r["policy"] != "steered" else (
            "n/a" if not np.isfinite(r["gap_closed"]) else f"{100 * r['gap_closed']:.0f}%")
        lines.append(f"{r['operator']:10s} {r['utility']:24s} {r['family']:13s} "
                     f"{r['policy']:8s} {r['utility_mean']:8.3f} {r['cost_usd_mean']:7.3f}  "
                     f"{d:+8.3f} [{lo:+8.3f}, {hi:+8.3f}]  {gap:>10s}")
    for name, info in rep["reward_models"].items():
        cnt = rep["label_counts"].get(name, {})
        lines.append(f"{name}: {cnt.get('labels', 0)} labels ({cnt.get('skip', 0)} skip, "
                     f"{cnt.get('equal', 0)} equal, {cnt.get('flipped', 0)} flipped), "
                     f"held-out pair accuracy {info['heldout_acc']:.3f}")
    q = rep.get("agreement", {})
    alpha = q.get("krippendorff_alpha", q.get("alpha"))
    if alpha is not None:
        lines.append(f"agreement between operators: Krippendorff's alpha {alpha}")
    for name, d in rep.get("drift", {}).items():
        f = d.get("forward", {})
        lines.append(f"drift {name}: accuracy on newest {d['recent']['labels']} labels "
                     f"{d['recent']['accuracy']:.3f} vs older {d['older']['accuracy']:.3f}; "
                     f"a model of the older labels: {f.get('recent_accuracy', float('nan')):.3f}"
                     f" on the newest vs {f.get('older_heldout_accuracy', float('nan')):.3f} "
                     "held out"
                     + (f"; retrained on the newest {d['retrained_on']}" if d.get("retrained")
                        else ""))
    can = rep.get("canary")
    if can:
        lines.append(f"canary: version {can['registered_version']} {can['outcome']} after "
                     f"{can['canary_decisions']} canary decisions ({can['reason']})")
    lines.append(f"wall time {rep['wall_s']:.0f} s")
    return "\n".join(lines)
