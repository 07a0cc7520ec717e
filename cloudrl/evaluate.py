"""Evaluation protocol: run policies on the held-out seeds and report mean +- 95% CI.

``evaluate(cfg)`` runs every (policy, seed) episode, as Ray tasks on ``workers`` CPUs when
``workers > 1`` (:mod:`cloudrl.parallel`), with a progress bar, and returns per-episode
metrics; the
report helpers turn them into the comparison table (stdout), CSV and JSON.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cloudrl.heuristics.tuned import TUNED_SUFFIX
from cloudrl.metrics import METRIC_LABELS, METRICS, EpisodeMetrics, episode_metrics, summarize
from cloudrl.policy import Interface, Policy
from cloudrl.protocol import N_SEEDS, Split, seeds_for
from envs.cluster_env import ClusterBranchingEnv, ClusterSchedulingEnv
from envs.env_config import EnvConfig


class EvalConfig(BaseModel):
    """What to evaluate, on which env, with which seeds."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    env: EnvConfig = Field(default_factory=EnvConfig)
    interface: Interface = "flat"
    policies: list[str] = Field(default_factory=lambda: ["all"], validate_default=True)
    split: Split = "test"
    n_seeds: int = Field(default=N_SEEDS, ge=1, le=N_SEEDS)
    workers: int = Field(default=2, ge=1, le=64)
    # tuned parameters per heuristic (`cloudrl tune-heuristic`): policy "<name>_tuned" runs them
    heuristic_params: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @field_validator("policies")
    @classmethod
    def _known(cls, names: list[str]) -> list[str]:
        from cloudrl.heuristics import HEURISTICS

        if not names:
            raise ValueError("at least one policy is required")
        expanded: list[str] = []
        for name in names:
            if name == "all":
                expanded.extend(HEURISTICS)
            elif name in HEURISTICS or name.removesuffix(TUNED_SUFFIX) in HEURISTICS:
                expanded.append(name)
            elif Path(name).exists():
                from cloudrl.checkpoint_policy import is_checkpoint

                if not is_checkpoint(name):
                    raise ValueError(f"{name} is not a cloudrl checkpoint (no cloudrl.json "
                                     f"and RLModule inside)")
                expanded.append(str(Path(name).resolve()))
            else:
                raise ValueError(f"unknown policy {name!r}: expected one of "
                                 f"{sorted(HEURISTICS)}, 'all', or a checkpoint path")
        return list(dict.fromkeys(expanded))

    @model_validator(mode="after")
    def _tuned_rows_have_params(self) -> EvalConfig:
        from cloudrl.heuristics.tuned import tuned_heuristic

        for base, params in self.heuristic_params.items():
            try:
                tuned_heuristic(base, params, self.interface)
            except ValueError as e:
                raise ValueError(f"heuristic_params.{base}: {e}") from None
        for name in self.policies:
            base = name.removesuffix(TUNED_SUFFIX)
            if name.endswith(TUNED_SUFFIX) and base not in self.heuristic_params:
                raise ValueError(f"policy {name!r} needs heuristic_params.{base} "
                                 f"(--heuristic-params FILE from cloudrl tune-heuristic)")
        return self


def make_env(env_cfg: EnvConfig, interface: Interface):
    return ClusterSchedulingEnv(env_cfg) if interface == "flat" else ClusterBranchingEnv(env_cfg)


def resolve_policy(name: str, interface: Interface, env_cfg: EnvConfig | None = None,
                   heuristic_params: dict[str, dict[str, Any]] | None = None) -> Policy:
    """A heuristic by name, a tuned one (``<name>_tuned`` with ``heuristic_params[name]``),
    or a trained checkpoint by path (checked against the env)."""
    from cloudrl.checkpoint_policy import is_checkpoint, load_policy
    from cloudrl.heuristics import make_heuristic

    if is_checkpoint(name):
        policy = load_policy(name)
        if policy.interface != interface:
            raise ValueError(f"checkpoint {name} acts on the {policy.interface} interface, "
                             f"evaluation asked for {interface}")
        if env_cfg is not None:
            policy.check_env(env_cfg)
        return policy
    base = name.removesuffix(TUNED_SUFFIX)
    if name.endswith(TUNED_SUFFIX) and base in (heuristic_params or {}):
        from cloudrl.heuristics.tuned import tuned_heuristic

        return tuned_heuristic(base, heuristic_params[base], interface)
    return make_heuristic(name, interface)


def run_episode(policy: Policy, env, seed: int) -> EpisodeMetrics:
    """One full episode of ``policy`` on ``env`` with episode seed ``seed``."""
    obs, _ = env.reset(seed=seed)
    policy.reset()
    total, invalid, done = 0.0, 0, False
    while not done:
        obs, reward, terminated, truncated, info = env.step(policy.act(obs))
        total += reward
        invalid += bool(info["invalid_action"])
        done = terminated or truncated
    return episode_metrics(policy.name, seed, env.sim.stats, total, invalid)


def _run_chunk(args: tuple[EnvConfig, Interface, str, tuple[int, ...], dict]
               ) -> list[EpisodeMetrics]:
    env_cfg, interface, name, seeds, params = args
    env = make_env(env_cfg, interface)
    policy = resolve_policy(name, interface, env_cfg, params)
    return [run_episode(policy, env, s) for s in seeds]


def evaluate(cfg: EvalConfig, progress: bool = True) -> list[EpisodeMetrics]:
    """All (policy, seed) episodes of ``cfg``; results ordered by policy then seed."""
    seeds = seeds_for(cfg.split, cfg.n_seeds)
    chunk = max(1, len(seeds) // (4 * cfg.workers))
    tasks = [(cfg.env, cfg.interface, name, seeds[i:i + chunk], cfg.heuristic_params)
             for name in cfg.policies for i in range(0, len(seeds), chunk)]
    if cfg.workers > 1:
        from cloudrl.parallel import WorkerPool

        with WorkerPool(cfg.workers) as pool:
            parts = pool.map(_run_chunk, tasks, "episodes" if progress else None,
                             total=len(cfg.policies) * len(seeds), count=len, unit="ep")
        return [r for part in parts for r in part]
    from cloudrl.progress import progress_bar

    results: list[EpisodeMetrics] = []
    with progress_bar(len(cfg.policies) * len(seeds), "episodes", unit="ep",
                      enabled=progress) as bar:
        for task in tasks:
            results.extend(_run_chunk(task))
            bar.update(len(task[3]))
    return results


def summary_rows(results: Iterable[EpisodeMetrics]) -> list[dict]:
    """One row per policy: ``<metric>_mean`` and ``<metric>_ci95`` for every metric."""
    by_policy: dict[str, list[EpisodeMetrics]] = {}
    for r in results:
        by_policy.setdefault(r.policy, []).append(r)
    rows = []
    for name, eps in by_policy.items():
        row: dict = {"policy": name, "episodes": len(eps)}
        for m in METRICS:
            s = summarize([getattr(e, m) for e in eps])
            row[f"{m}_mean"], row[f"{m}_ci95"] = s.mean, s.ci95
        rows.append(row)
    return rows


def _fmt(mean: float, ci: float, metric: str) -> str:
    if metric == "sla_violation_rate":
        return f"{100 * mean:.2f}% ± {100 * ci:.2f}"
    if metric in ("energy_kwh", "episode_reward", "toggles"):
        return f"{mean:.1f} ± {ci:.1f}"
    return f"{mean:.3f} ± {ci:.3f}"


def format_table(rows: list[dict], markdown: bool = False) -> str:
    """The comparison table: one row per policy, mean ± 95% CI per metric."""
    header = ["policy"] + [METRIC_LABELS[m] for m in METRICS]
    body = [[r["policy"]] + [_fmt(r[f"{m}_mean"], r[f"{m}_ci95"], m) for m in METRICS]
            for r in rows]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(row) + " |" for row in body]
        return "\n".join(lines)
    widths = [max(len(str(c)) for c in col) for col in zip(header, *body, strict=True)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    sep = "  ".join("-" * w for w in widths)
    return "\n".join([fmt.format(*header), sep] + [fmt.format(*row) for row in body])


def write_results(results: list[EpisodeMetrics], rows: list[dict], out: Path,
                  cfg: EvalConfig) -> list[Path]:
    """Per-episode CSV next to a JSON with the config, the summary and the episodes."""
    import csv

    out.parent.mkdir(parents=True, exist_ok=True)
    csv_path = out.with_suffix(".csv")
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(results[0].as_dict()))
        writer.writeheader()
        writer.writerows(r.as_dict() for r in results)
    json_path = out.with_suffix(".json")
    json_path.write_text(json.dumps({
        "config": cfg.model_dump(mode="json"),
        "summary": rows,
        "episodes": [r.as_dict() for r in results],
    }, indent=1))
    return [csv_path, json_path]
