"""Hierarchical control: a supervisor that picks, every ``k`` ticks, which sub-agent acts.

* :mod:`.sub_agents`: frozen sub-agents by spec (a heuristic name or a checkpoint path);
* :mod:`.supervisors`: the rule-based supervisor (thresholds on load), a fixed one,
  and the learned one (a trained ``SupervisorPPOTorchRLModule``);
* :mod:`.policy`: the hierarchy as a cloudrl ``Policy`` on the cluster env (evaluation,
  serving), reporting which sub-agent decided each tick;
* :mod:`.hparams`: ``cloudrl train --algo hierarchical --hparams`` (Ray-free);
* :mod:`.hierarchical`: the RLlib side: ``HierarchicalPPOConfig`` (PPO on the supervisor
  of ``envs.hierarchical_env.HierarchicalClusterEnv``, in a ``MultiRLModule``).
"""
