"""Can what a supervisor sees predict the clairvoyant supervisor's gain?

What: reads the decisions that ``experiments/probe_supervisor_ceiling.py --distil N
--save-decisions F.npz`` saved (per decision: the macro state a supervisor sees and every
sub-agent's true-future rollout score), fits gradient-boosted trees on the first
``--train-share`` of the seeds and scores the rest, held out by seed:

* AUC of "some other sub-agent beats the base here" from the macro state;
* a switching rule: switch to the sub-agent with the highest predicted advantage where
  the predicted probability of a win exceeds a threshold; its summed one-step advantage
  per held-out episode, against the oracle's (switch exactly where it pays).

The one-step advantages add up only to first order (each is measured with the base played
afterwards), so these are indications; the probe's ``--distil`` plays a student for real.
scikit-learn comes with MLflow (a dependency).

Run (seconds)::

    .venv/bin/python experiments/analyse_supervisor_predictability.py F.npz

Measured 2026-11-24 on the poisson decisions (N=50, branching, k=5, sub-agents
power_aware;sjf;round_robin, 20 train seeds, 4,000 decisions; train 14 seeds, held out 6):
an alternative beats power_aware at 11.7% of decisions, +3.2 reward each, 74.8 per episode in
all; AUC 0.70 held out; the switching rule's gain per held-out episode against the oracle's
+103: -222 (threshold 0.3), -75 (0.5), -6 (0.7), +3 (0.8). With ``--features full`` (the
whole observation): AUC 0.74; -33, -8, +3, +3. The state tells *when* an alternative may pay,
not *which* times it does: the wrong switches cost more than the right ones gain. Played for
real (``--play 20 --k 5 --specialists "power_aware;sjf;round_robin"``, trees fitted on all
20 seeds, 20 validation seeds), trees minus power_aware at thresholds 0.5 / 0.7 / 0.8:
+0.6 [-15.3, +16.5] / +2.8 [-11.3, +16.8] / +0.7 [-12.8, +14.2] reward, +0.21 / +0.06 /
+0.12 kWh, switching at 3.4 / 2.0 / 1.0% of decisions.

Run with ``--play`` (about 3 min at N=50)::

    .venv/bin/python experiments/analyse_supervisor_predictability.py F.npz --play 20 --k 5 \
        --specialists "power_aware;sjf;round_robin" --thresholds 0.5 0.7 0.8
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


class TreeSupervisor:
    """Switch from the base (sub-agent 0) to the sub-agent of highest predicted advantage
    where the predicted probability that some alternative wins exceeds ``threshold``;
    gradient-boosted trees on the macro state, fitted to the ceiling's decisions."""

    name = "trees"

    def __init__(self, macros: np.ndarray, scores: np.ndarray, threshold: float) -> None:
        from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

        adv = scores[:, 1:] - scores[:, :1]
        self.threshold = threshold
        self.clf = HistGradientBoostingClassifier(max_iter=200, learning_rate=0.05,
                                                  random_state=0).fit(macros, adv.max(1) > 0)
        self.regs = [HistGradientBoostingRegressor(max_iter=200, learning_rate=0.05,
                                                   random_state=0).fit(macros, adv[:, i])
                     for i in range(adv.shape[1])]

    def choose(self, macro: np.ndarray) -> int:
        x = np.asarray(macro, dtype=np.float64)[None]
        if self.clf.predict_proba(x)[0, 1] <= self.threshold:
            return 0
        return 1 + int(np.argmax([r.predict(x)[0] for r in self.regs]))


def play(args: argparse.Namespace, x: np.ndarray, scores: np.ndarray) -> None:
    """Fit :class:`TreeSupervisor` on every decision; play it on validation seeds against
    the base sub-agent alone, paired by seed (in this process: forking after the trees'
    OpenMP threads start can hang)."""
    from cloudrl.protocol import seeds_for
    from experiments.probe_supervisor_ceiling import _base_episode, _ci, _student_episodes

    specs = [s.strip() for s in args.specialists.split(";") if s.strip()]
    seeds = seeds_for("validation", args.play)
    alone = np.array([_base_episode((args.workload, args.interface, args.n_servers, specs[0],
                                     s)) for s in seeds])
    for thr in args.thresholds:
        student = TreeSupervisor(x, scores, thr)
        mine = [_student_episodes((args.workload, args.interface, args.n_servers, specs,
                                   args.k, s, student)) for s in seeds]
        got = np.array([m[:3] for m in mine])
        share = np.sum([m[3] for m in mine], axis=0)
        print(f"  played, P(win) > {thr:.2f}, {len(seeds)} validation seeds: trees - "
              f"{specs[0]} reward {_ci(got[:, 0] - alone[:, 0])}, kWh "
              f"{_ci(got[:, 1] - alone[:, 1])}; switched at {1 - share[0] / share.sum():.1%}",
              flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("decisions", help="npz written by probe_supervisor_ceiling --save-decisions")
    p.add_argument("--train-share", type=float, default=0.7)
    p.add_argument("--features", default="macro", choices=("macro", "full"),
                   help="macro: what the supervisor sees; full: the whole observation "
                        "(macro, servers, jobs), what a per-tick policy sees")
    p.add_argument("--thresholds", type=float, nargs="+", default=[0.3, 0.5, 0.7, 0.8])
    p.add_argument("--play", type=int, default=0, metavar="N_VAL",
                   help="fit the trees on every decision (macro state) and play them as the "
                        "supervisor on N_VAL validation seeds; needs the run's settings:")
    p.add_argument("--specialists", default="", help="the probe run's --specialists")
    p.add_argument("--workload", default="poisson", choices=("poisson", "google_v2_like"))
    p.add_argument("--interface", default="branching", choices=("flat", "branching"))
    p.add_argument("--n-servers", type=int, default=50)
    p.add_argument("--k", type=int, default=5)
    args = p.parse_args(argv)
    if args.play and not args.specialists:
        p.error("--play needs --specialists (the probe run's)")
    if args.play and args.features != "macro":
        p.error("--play: a supervisor sees the macro state; use --features macro")
    for name in ("play", "n_servers", "k"):
        if getattr(args, name) < (0 if name == "play" else 1):
            p.error(f"--{name.replace('_', '-')}: bad value {getattr(args, name)}")
    if not 0 < args.train_share < 1:
        p.error(f"--train-share must be in (0, 1), got {args.train_share}")
    try:
        data = np.load(args.decisions)
        x = data["macros"] if args.features == "macro" else data["observations"]
        scores, group = data["scores"], data["seed_index"]
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {args.decisions}: not a decisions file ({exc})", file=sys.stderr)
        return 2
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
    from sklearn.metrics import roc_auc_score

    adv = scores[:, 1:] - scores[:, :1]  # each other sub-agent's advantage over the base
    best = adv.max(axis=1)
    seeds = np.unique(group)
    cut = seeds[int(len(seeds) * args.train_share)]
    tr, te = group < cut, group >= cut
    n_test = len(np.unique(group[te]))
    if n_test == 0 or tr.sum() == 0 or len(np.unique(best[te] > 0)) < 2:
        print("error: too few seeds or no alternative wins to score", file=sys.stderr)
        return 2
    win = best > 0
    print(f"{len(x)} decisions, {len(seeds)} seeds (train {len(seeds) - n_test}, held out "
          f"{n_test}); an alternative beats the base at {win.mean():.1%} of decisions, "
          f"+{best[win].mean():.2f} each, {best.clip(0).sum() / len(seeds):.1f} per episode")
    clf = HistGradientBoostingClassifier(max_iter=200, learning_rate=0.05, random_state=0)
    prob = clf.fit(x[tr], win[tr]).predict_proba(x[te])[:, 1]
    print(f"AUC (held out) of 'an alternative wins' from the {args.features} observation: "
          f"{roc_auc_score(win[te], prob):.3f}")
    pred = np.stack([HistGradientBoostingRegressor(max_iter=200, learning_rate=0.05,
                                                   random_state=0).fit(x[tr], adv[tr, i])
                     .predict(x[te]) for i in range(adv.shape[1])], axis=1)
    taken = adv[te][np.arange(te.sum()), pred.argmax(axis=1)]
    print(f"oracle switching gain per held-out episode: {best[te].clip(0).sum() / n_test:+.1f}")
    for thr in args.thresholds:
        switch = prob > thr
        print(f"  switch where P(win) > {thr:.2f}: {switch.mean():5.1%} of decisions, "
              f"gain per episode {taken[switch].sum() / n_test:+.1f}")
    if args.play:
        n_subs = scores.shape[1]
        if len([s for s in args.specialists.split(";") if s.strip()]) != n_subs:
            print(f"error: --specialists must name the run's {n_subs} sub-agents",
                  file=sys.stderr)
            return 2
        play(args, x, scores)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
