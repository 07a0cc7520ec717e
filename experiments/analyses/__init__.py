"""Analyses whose results the docs report; run one as ``python -m experiments.analyses.NAME``."""
