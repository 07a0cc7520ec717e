"""The table of algorithms: one row each; ``cloudrl train``, sweeps and evaluation read it.

A row (:class:`AlgorithmSpec`) says everything the rest of cloudrl needs to know about
an algorithm: its RLlib config class and RLModule class (as import paths, so the table
loads without Ray), the action interface it acts on, whether it samples synchronously
or asynchronously, its typed hyperparameters with cloudrl's defaults, and the extra
hooks it needs (an ``AlgorithmConfig`` hook, a minimum number of remote env runners,
whether a trained policy samples by default). Adding an algorithm is its folder (or
module) under ``cloudrl/algorithms/`` plus one row in ``ALGORITHMS``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import import_module
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, create_model

from cloudrl.algorithms.apex_bdq.hparams import ApexBDQHparams
from cloudrl.algorithms.appo import APPOHparams
from cloudrl.algorithms.bdq.hparams import BDQHparams
from cloudrl.algorithms.cql_lag.hparams import CQLLagHparams
from cloudrl.algorithms.dqn import DQNHparams
from cloudrl.algorithms.gated.hparams import GatedHparams
from cloudrl.algorithms.hierarchical.hparams import (
    HierarchicalBranchingHparams,
    HierarchicalHparams,
    hierarchy_hook,
)
from cloudrl.algorithms.hparams import Hparams, RunShape
from cloudrl.algorithms.impala import IMPALAHparams, iterations_per_train_batch
from cloudrl.algorithms.ppo import PPOHparams


def load(path: str) -> Any:
    """The object at ``"package.module:Name"``."""
    module, _, name = path.partition(":")
    return getattr(import_module(module), name)


@dataclass(frozen=True)
class AlgorithmSpec:
    """One algorithm: what cloudrl builds, and how, for ``TrainConfig(algo=name)``."""

    name: str
    config_class: str  # "module:Class" of its RLlib AlgorithmConfig
    module_class: str  # "module:Class" of its RLModule
    interface: Literal["flat", "branching"]
    execution: Literal["sync", "async"]  # sampling and learning alternate | overlap
    hparams: type[Hparams]  # typed ``.training(...)`` arguments with cloudrl's defaults
    configure: Callable[[Any], None] | None = None  # extra AlgorithmConfig settings
    min_env_runners: int = 0  # its actors are remote env runners (Ape-X)
    samples_actions: bool = False  # a trained policy samples by default (actor-critic)
    # phase 3 of alignment (learned reward + anchor to the phase-1 policy): the learner
    # class with the anchor (cloudrl.algorithms.anchor); None: no phase 3 for it
    anchored_learner: str | None = None
    # "module:Class" with ``from_checkpoint(path, mode=...)`` for checkpoints that are not
    # one RLModule acting alone (the hierarchy); None: cloudrl.checkpoint_policy's own
    policy_loader: str | None = None

    def new_config(self) -> Any:
        """An empty RLlib ``AlgorithmConfig`` of this algorithm."""
        return load(self.config_class)()

    def module(self) -> type:
        """The RLModule class."""
        return load(self.module_class)

    def training_kwargs(self, hparams: Mapping[str, Any], run: RunShape) -> dict[str, Any]:
        """``AlgorithmConfig.training(**kwargs)``: the defaults updated by ``hparams``."""
        return self.hparams.model_validate(dict(hparams)).training_kwargs(run)


def _configure_gated(config: Any) -> None:
    """Train on the gated env (``cloudrl.algorithms.gated.config``; imports RLlib)."""
    from cloudrl.algorithms.gated.config import configure_gated

    configure_gated(config)


ALGORITHMS: dict[str, AlgorithmSpec] = {spec.name: spec for spec in (
    AlgorithmSpec("ppo", "cloudrl.algorithms.masked_ppo:MaskedPPOConfig",
                  "models.masked_ppo:MaskedPPOTorchRLModule", "flat", "sync", PPOHparams,
                  samples_actions=True,
                  anchored_learner="cloudrl.algorithms.anchor:AnchoredPPOTorchLearner"),
    AlgorithmSpec("dqn", "ray.rllib.algorithms.dqn:DQNConfig",
                  "models.masked_dqn:MaskedDQNTorchRLModule", "flat", "sync", DQNHparams),
    AlgorithmSpec("bdq", "cloudrl.algorithms.bdq.bdq:BDQConfig",
                  "models.bdq:BDQTorchRLModule", "branching", "sync", BDQHparams,
                  anchored_learner="cloudrl.algorithms.anchor:AnchoredBDQTorchLearner"),
    AlgorithmSpec("appo", "ray.rllib.algorithms.appo:APPOConfig",
                  "models.masked_appo:MaskedAPPOTorchRLModule", "flat", "async", APPOHparams,
                  configure=iterations_per_train_batch, samples_actions=True,
                  anchored_learner="cloudrl.algorithms.anchor:AnchoredAPPOTorchLearner"),
    AlgorithmSpec("impala", "ray.rllib.algorithms.impala:IMPALAConfig",
                  "models.masked_ppo:MaskedPPOTorchRLModule", "flat", "async", IMPALAHparams,
                  configure=iterations_per_train_batch, samples_actions=True),
    AlgorithmSpec("apex_bdq", "cloudrl.algorithms.apex_bdq.apex_bdq:ApexBDQConfig",
                  "models.bdq:BDQTorchRLModule", "branching", "async", ApexBDQHparams,
                  min_env_runners=1),
    AlgorithmSpec("hierarchical",
                  "cloudrl.algorithms.hierarchical.hierarchical:HierarchicalPPOConfig",
                  "models.hierarchical:SupervisorPPOTorchRLModule", "flat", "sync",
                  HierarchicalHparams, configure=hierarchy_hook, samples_actions=True,
                  policy_loader="cloudrl.algorithms.hierarchical.policy:HierarchicalPolicy"),
    # the same hierarchy on the branching interface (e.g. over gated_dqn / BDQ sub-agents)
    AlgorithmSpec("hierarchical_branching",
                  "cloudrl.algorithms.hierarchical.hierarchical:HierarchicalPPOConfig",
                  "models.hierarchical:SupervisorPPOTorchRLModule", "branching", "sync",
                  HierarchicalBranchingHparams, configure=hierarchy_hook, samples_actions=True,
                  policy_loader="cloudrl.algorithms.hierarchical.policy:HierarchicalPolicy"),
    # the power-aware heuristic acts; the module picks its preset (on the branching env)
    AlgorithmSpec("gated_dqn", "cloudrl.algorithms.gated.config:GatedDQNConfig",
                  "models.masked_dqn:MaskedDQNTorchRLModule", "branching", "sync", GatedHparams,
                  configure=_configure_gated),
    # offline: learns from a recorded dataset (`cloudrl offline train`), acts greedily
    AlgorithmSpec("cql_lag", "cloudrl.algorithms.cql_lag.cql_lag:CQLLagConfig",
                  "models.cql_lag:CQLLagTorchRLModule", "flat", "sync", CQLLagHparams),
)}
ALGOS: tuple[str, ...] = tuple(ALGORITHMS)
Algo = Literal[ALGOS]  # type: ignore[valid-type]


def spec_of(name: str) -> AlgorithmSpec:
    """The row of algorithm ``name``; a ValueError names the known ones."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; expected one of {list(ALGOS)}") from None


def checked_hparams(algo: str, hparams: Mapping[str, Any]) -> dict[str, Any]:
    """``hparams`` validated against ``algo``'s model, as given (defaults not filled in).

    Raises pydantic's ValidationError located at the offending key (``lr``,
    ``replay_buffer_config.capacity``).
    """
    model = spec_of(algo).hparams.model_validate(dict(hparams))
    return model.model_dump(mode="json", exclude_unset=True)


@cache
def hparams_by_algo() -> type[BaseModel]:
    """A model with one optional field per algorithm, its hyperparameter model (a sweep's
    ``hparams: {ppo: {...}, dqn: {...}}``), so errors read ``hparams.dqn.lr``."""
    fields: dict[str, Any] = {name: (spec.hparams | None, None)
                              for name, spec in ALGORITHMS.items()}
    return create_model("HparamsByAlgo", __config__=ConfigDict(extra="forbid"), **fields)
