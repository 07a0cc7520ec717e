"""Evolution strategies on a policy's weights inside an :class:`InputDrivenModel`."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from cloudrl.algorithms.model_es.config import ModelESConfig
from cloudrl.algorithms.model_es.dynamics import InputDrivenModel

FlatActions = Callable[[torch.Tensor], torch.Tensor]  # a policy's greedy actions -> flat


def searched(module: Any) -> list[torch.nn.Parameter]:
    """The weights a search moves: ``module.searched_parameters()`` where it names them
    (a release-capped policy: its own, not its anchor's), else all of them."""
    own = getattr(module, "searched_parameters", None)
    return list(own()) if own is not None else list(module.parameters())


@torch.no_grad()
def model_rollout(model: InputDrivenModel, policies: list[Any], traces: torch.Tensor,
                  to_flat: FlatActions, policy_columns: int | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every policy (``greedy(obs)``) along every logged day of ``traces`` ``(S, T + 1,
    D)``: the inputs replayed as logged, the endogenous columns from the model, starting
    from each day's logged first state. Returns each policy's mean cost per day, mean
    summed disagreement (the members' standard deviation of each period's cost), ``(P,)``
    each, and its mean summed extra counts per day, ``(P, n_extra)``. The policies see the
    first ``policy_columns`` columns (all when None); the rest are the model's alone."""
    n_pol, n_days, n_steps = len(policies), traces.shape[0], traces.shape[1] - 1
    endo = torch.as_tensor(model.endo)
    state = traces[:, 0, endo].repeat(n_pol, 1)
    cost = torch.zeros(n_pol * n_days)
    spread = torch.zeros(n_pol * n_days)
    extra = torch.zeros(n_pol * n_days, model.n_extra)
    for t in range(n_steps):
        obs = traces[:, t].repeat(n_pol, 1)
        obs[:, endo] = state
        seen = obs[:, :policy_columns]
        acts = torch.cat([to_flat(p.greedy(seen[k * n_days:(k + 1) * n_days]))
                          for k, p in enumerate(policies)])
        state, c, s, e = model.step(obs, acts)
        cost += c
        spread += s
        extra += e
    return (cost.view(n_pol, n_days).mean(1), spread.view(n_pol, n_days).mean(1),
            extra.view(n_pol, n_days, model.n_extra).mean(1))


@torch.no_grad()
def logged_counts(model: InputDrivenModel, policies: list[Any], states: torch.Tensor,
                  to_flat: FlatActions, policy_columns: int | None = None) -> torch.Tensor:
    """Every policy's action at each logged state ``(N, D)`` and the extra counts the model
    predicts for the period after it, averaged over the states: ``(P, n_extra)``. Unlike
    :func:`model_rollout` nothing is rolled forward, so the states are real."""
    seen = states[:, :policy_columns]
    return torch.stack([model.step(states, to_flat(p.greedy(seen)))[3].mean(0)
                        for p in policies])


def search(module: Any, model: InputDrivenModel, train_traces: torch.Tensor,
           held_traces: torch.Tensor, cfg: ModelESConfig, to_flat: FlatActions,
           log: Callable[[str], None] = print,
           logged: tuple[torch.Tensor, torch.Tensor] | None = None,
           policy_columns: int | None = None) -> tuple[Any, list[dict[str, Any]], int]:
    """ES from ``module``'s weights on the model's cost plus ``cfg.penalty`` times its
    disagreement along ``train_traces``; ``module`` ends with the weights of the iteration
    that scores lowest on ``held_traces`` (the start, iteration 0, competing).

    With ``cfg.constrained`` and a model that predicts extra counts (violations per
    class), each count is a constraint at the start's level: every iteration also plays
    the start on the same days, a candidate's relative excess ``V_c / V_c(start) - 1``
    costs ``lambda_c`` times the start's model cost, ``lambda_c`` rises by ``cfg.dual_lr``
    times the candidates' mean excess (never below 0), and only iterations that predict
    no more of any count than the start on the held-out days can be kept.

    With ``cfg.logged_states`` as well, ``logged`` holds the logged observations of the
    search days and of the held-out days (``(N, D)`` each); the counts each policy's
    actions predict there (:func:`logged_counts`, ``cfg.logged_batch`` search rows per
    iteration) are a second constraint of the same form, with multipliers of their own,
    and the held-out check requires both. Returns the module, the history and the kept
    iteration. ``policy_columns``: as in :func:`model_rollout`."""
    gen = torch.Generator().manual_seed(cfg.run_seed)
    theta = parameters_to_vector(searched(module)).detach().clone()
    workers = [copy.deepcopy(module) for _ in range(2 * cfg.pairs)]
    anchor = copy.deepcopy(module)  # the start, played beside the candidates
    constrained = cfg.constrained and model.n_extra > 0
    on_logged = constrained and cfg.logged_states
    if on_logged and logged is None:
        raise ValueError("model search: logged_states needs the logged observations")
    lam = torch.zeros(model.n_extra)
    lam_logged = torch.zeros(model.n_extra)
    m1 = torch.zeros_like(theta)
    m2 = torch.zeros_like(theta)
    t0 = time.perf_counter()

    def held(vec: torch.Tensor) -> tuple[float, float, torch.Tensor]:
        vector_to_parameters(vec, searched(workers[0]))
        c, s, e = model_rollout(model, [workers[0]], held_traces, to_flat, policy_columns)
        return float(c[0]), float(s[0]), e[0]

    def held_logged(vec: torch.Tensor) -> torch.Tensor:
        vector_to_parameters(vec, searched(workers[0]))
        return logged_counts(model, [workers[0]], logged[1], to_flat, policy_columns)[0]

    c0, s0, e0 = held(theta)
    history: list[dict[str, Any]] = [{"iteration": 0, "held_cost": c0, "held_spread": s0,
                                      "held_objective": c0 + cfg.penalty * s0,
                                      "held_extra": e0.tolist(), "feasible": True}]
    if on_logged:
        l0 = held_logged(theta)
        history[0]["held_logged_extra"] = l0.tolist()
        log(f"model search: start, held-out logged states: predicted counts "
            f"{[round(float(x) * 1000, 2) for x in l0]} per 1,000 decisions")
    best = (history[0]["held_objective"], 0, theta.clone())
    log(f"model search: start, held-out days: model cost {c0:.2f}, disagreement {s0:.2f}"
        + (f", predicted counts {[round(float(x), 2) for x in e0]}" if model.n_extra else ""))
    n_train = train_traces.shape[0]
    for it in range(1, cfg.iterations + 1):
        eps = torch.randn(cfg.pairs, theta.numel(), generator=gen)
        cand = torch.cat([theta + cfg.sigma * eps, theta - cfg.sigma * eps])
        for w, vec in zip(workers, cand, strict=True):
            vector_to_parameters(vec, searched(w))
        days = torch.randperm(n_train, generator=gen)[:cfg.traces_per_iteration]
        players = workers + [anchor] if constrained else workers
        c, s, e = model_rollout(model, players, train_traces[days], to_flat,
                                policy_columns)
        f = c[:len(workers)] + cfg.penalty * s[:len(workers)]
        if constrained:
            excess = e[:len(workers)] / e[-1].clamp(min=1e-6) - 1.0
            f = f + float(c[-1]) * (excess * lam).sum(1)
            lam = (lam + cfg.dual_lr * excess.mean(0)).clamp(min=0.0)
        if on_logged:
            rows = torch.randint(0, len(logged[0]), (cfg.logged_batch,), generator=gen)
            le = logged_counts(model, players, logged[0][rows], to_flat, policy_columns)
            excess = le[:len(workers)] / le[-1].clamp(min=1e-6) - 1.0
            f = f + float(c[-1]) * (excess * lam_logged).sum(1)
            lam_logged = (lam_logged + cfg.dual_lr * excess.mean(0)).clamp(min=0.0)
        ranks = torch.argsort(torch.argsort(f)).float()
        util = 0.5 - ranks / max(len(f) - 1, 1)  # the cheapest candidate gets +0.5
        grad = ((util[:cfg.pairs] - util[cfg.pairs:])[:, None] * eps).sum(0) / \
            (2 * cfg.pairs * cfg.sigma)
        m1 = 0.9 * m1 + 0.1 * grad
        m2 = 0.999 * m2 + 0.001 * grad ** 2
        theta = theta + cfg.lr * (m1 / (1 - 0.9 ** it)) / \
            ((m2 / (1 - 0.999 ** it)).sqrt() + 1e-8)
        if it % cfg.eval_every == 0 or it == cfg.iterations:
            hc, hs, he = held(theta)
            feasible = not constrained or bool((he <= e0 + 1e-9).all())
            row = {"iteration": it, "train_objective": float(f.mean()), "held_cost": hc,
                   "held_spread": hs, "held_objective": hc + cfg.penalty * hs,
                   "held_extra": he.tolist(), "multipliers": lam.tolist()}
            if on_logged:
                hl = held_logged(theta)
                feasible = feasible and bool((hl <= l0 + 1e-9).all())
                row.update(held_logged_extra=hl.tolist(),
                           logged_multipliers=lam_logged.tolist())
            row["feasible"] = feasible
            history.append(row)
            if feasible and row["held_objective"] < best[0]:
                best = (row["held_objective"], it, theta.clone())
            log(f"model search: iteration {it}, held-out days: model cost {hc:.2f}, "
                f"disagreement {hs:.2f}"
                + (f", predicted counts {[round(float(x), 2) for x in he]}"
                   + (f", at the logged states {[round(float(x) * 1000, 2) for x in hl]}"
                      f" per 1,000 decisions" if on_logged else "")
                   + f" ({'within' if feasible else 'above'} the start's), multipliers "
                   f"{[round(float(x), 3) for x in lam]}" if constrained else "")
                + f" ({time.perf_counter() - t0:.0f} s)")
    vector_to_parameters(best[2], searched(module))
    log(f"model search: kept iteration {best[1]} (held-out penalised cost {best[0]:.2f})")
    return module, history, best[1]
