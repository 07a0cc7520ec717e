"""Experiments, by role; every module runs as ``python -m experiments.<role>.<name>``.

* ``experiments/benchmarks/``: each prints a table with its reference measured in the
  same run (and the sweep runner, the production-loop soak, the hierarchy's sub-agents);
* ``experiments/configs/``: the sweep, headline, alignment and offline YAML files;
* ``experiments/analyses/``: analyses whose results the docs report.
"""
