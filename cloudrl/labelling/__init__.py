"""Operators' labelling app: trajectory pairs shown side by side, labelled in a web page.

Pieces, each its own module: :mod:`.segments` (what a segment shows: per-tick series
and summary numbers, plus the observations the reward model reads), :mod:`.db` (the
SQLite store), :mod:`.tokens` (operators and their hashed tokens), :mod:`.queue` (task
allocation: k distinct operators per pair, expiry, gold, active-learning priority,
strata), :mod:`.enqueue` (pairs from rollouts, recorded episodes or the decision
service's feedback store), :mod:`.active` (reward-model uncertainty), :mod:`.quality`
(gold accuracy, agreement, Krippendorff's alpha, Cohen's kappa), :mod:`.export` (majority
vote into the reward model's pair dataset, drift), :mod:`.app` (the FastAPI service and
its page) and :mod:`.cli` (``cloudrl label ...``).
"""
