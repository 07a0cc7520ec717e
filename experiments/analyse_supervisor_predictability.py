"""Can what a supervisor sees predict the clairvoyant supervisor's gain? (issue 15)

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
not *which* times it does: the wrong switches cost more than the right ones gain.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("decisions", help="npz written by probe_supervisor_ceiling --save-decisions")
    p.add_argument("--train-share", type=float, default=0.7)
    p.add_argument("--features", default="macro", choices=("macro", "full"),
                   help="macro: what the supervisor sees; full: the whole observation "
                        "(macro, servers, jobs), what a per-tick policy sees")
    p.add_argument("--thresholds", type=float, nargs="+", default=[0.3, 0.5, 0.7, 0.8])
    args = p.parse_args(argv)
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
