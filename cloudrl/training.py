"""Training driver: RLlib algorithm configs for the cluster envs, a train loop, checkpoints.

``build_algo_config(cfg)`` returns a plain RLlib ``AlgorithmConfig`` (PPO,
DQN, BDQ, APPO or IMPALA on the new API stack, with cloudrl's masked
RLModules), so anything a user knows about RLlib applies. ``train(cfg)`` runs
it to an env-step budget on the 50 train seeds only and writes a checkpoint
that ``cloudrl evaluate --checkpoint PATH`` runs on the held-out test seeds.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cloudrl.checkpoint_policy import META_FILE, is_checkpoint
from cloudrl.config import ConfigError
from cloudrl.protocol import TRAIN_SEEDS
from envs.env_config import EnvConfig
from envs.registration import BRANCHING_ID, FLAT_ID, register_rllib_envs

Algo = Literal["ppo", "dqn", "bdq", "appo", "impala", "apex_bdq"]
ALGOS: tuple[str, ...] = ("ppo", "dqn", "bdq", "appo", "impala", "apex_bdq")
BRANCHING_ALGOS = frozenset({"bdq", "apex_bdq"})
# RLlib's asynchronous actor-learner algorithms (V-trace); see ``_async_settings``.
ASYNC_ALGOS = frozenset({"appo", "impala"})


class TrainConfig(BaseModel):
    """One training run. ``hparams`` go to ``AlgorithmConfig.training(...)`` verbatim."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    algo: Algo = "ppo"
    env: EnvConfig = Field(default_factory=EnvConfig)
    env_steps: int = Field(default=20_000, ge=1)
    num_env_runners: int = Field(default=0, ge=0, description="0 = sample in the driver")
    num_learners: int = Field(default=0, ge=0,
                              description="0 = learn in the driver; n = n remote learner actors")
    envs_per_runner: int = Field(default=8, ge=1, description="vectorized envs per runner")
    num_gpus_per_learner: float = Field(default=0.0, ge=0,
                                        description="GPU for the (local) learner on a cluster")
    run_seed: int = Field(default=0, ge=0)
    reward_scale: float = Field(default=0.01, gt=0,
                                description="rewards are multiplied by this for learning")
    hidden: int = Field(default=128, ge=8)
    hparams: dict[str, Any] = Field(default_factory=dict)
    checkpoint_dir: str | None = None
    checkpoint_every: int = Field(default=0, ge=0,
                                  description="checkpoint every k iterations (0: at the end)")
    resume: bool = Field(default=False,
                         description="start from the checkpoint in checkpoint_dir if present")

    @model_validator(mode="after")
    def _apex_has_actors(self) -> TrainConfig:
        if self.algo == "apex_bdq" and self.num_env_runners < 1:
            raise ValueError("num_env_runners: apex_bdq samples on remote env runners "
                             "(its actors); give at least 1")
        return self

    def interface(self) -> str:
        """BDQ and Ape-X BDQ act on the branching interface; PPO, DQN, APPO and IMPALA on
        the flat one."""
        return "branching" if self.algo in BRANCHING_ALGOS else "flat"

    def train_env_config(self) -> dict[str, Any]:
        """The env_config RLlib gets: the env config on the train seeds, plus the reward scale."""
        env = self.env.model_copy(update={"seed_pool": TRAIN_SEEDS})
        return {**env.model_dump(mode="json"), "reward_scale": self.reward_scale}


def _ppo_defaults() -> dict[str, Any]:
    return {"lr": 3e-4, "gamma": 0.99, "lambda_": 0.95, "train_batch_size_per_learner": 2000,
            "minibatch_size": 250, "num_epochs": 4, "entropy_coeff": 0.01, "clip_param": 0.2,
            "vf_loss_coeff": 0.5, "vf_clip_param": 100.0, "grad_clip": 1.0}


def _dqn_defaults(env_steps: int) -> dict[str, Any]:
    return {
        "lr": 5e-4, "gamma": 0.99, "train_batch_size_per_learner": 64, "double_q": True,
        "dueling": False, "n_step": 3, "target_network_update_freq": 1000,
        "num_steps_sampled_before_learning_starts": min(2000, env_steps // 5),
        "epsilon": [[0, 1.0], [max(1, env_steps // 2), 0.05]],
        "replay_buffer_config": {"type": "PrioritizedEpisodeReplayBuffer", "capacity": 100_000,
                                 "alpha": 0.6, "beta": 0.4},
        "grad_clip": 10.0,
    }


def _bdq_defaults(env_steps: int) -> dict[str, Any]:
    hp = _dqn_defaults(env_steps)
    for key in ("double_q", "dueling"):  # BDQ is always dueling with a double-Q target
        hp.pop(key)
    return hp


def _impala_defaults() -> dict[str, Any]:
    """IMPALA (V-trace actor-critic): the PPO defaults' lr, discount and loss weights.

    One train batch is two sample() calls of one runner at RLlib's rollout fragment of
    50 steps x 8 vectorized envs; each batch is used once (no epochs, no minibatches).
    With remote env runners the driver waits up to 0.1 s for their samples instead of
    polling in a busy loop (RLlib's 0 s): on a small machine the loop took the CPU the
    runners sample with (APPO, 1 runner, 2 cores: 2-3.3x the env steps/s with the wait;
    ``experiments/bench_appo.py``).
    """
    return {"lr": 3e-4, "gamma": 0.99, "train_batch_size_per_learner": 800,
            "entropy_coeff": 0.01, "vf_loss_coeff": 0.5, "grad_clip": 1.0,
            "vtrace_clip_rho_threshold": 1.0, "vtrace_clip_pg_rho_threshold": 1.0,
            "timeout_s_sampler_manager": 0.1}


def _appo_defaults() -> dict[str, Any]:
    """APPO: IMPALA's settings plus PPO's clipped surrogate against a target policy.

    The circular buffer holds 8 batches and trains on each at most twice; the target
    policy is copied from the learner's (``tau`` 1) every ``2 * 8 * 2`` batch updates
    (``target_network_update_freq`` x buffer size x passes: RLlib's rule and defaults).
    """
    return {**_impala_defaults(), "clip_param": 0.2, "use_kl_loss": False,
            "circular_buffer_num_batches": 8, "circular_buffer_iterations_per_batch": 2,
            "target_network_update_freq": 2}


def _algo_parts(cfg: TrainConfig) -> tuple[Any, type, dict[str, Any]]:
    """(empty RLlib config, RLModule class, default hparams) of ``cfg.algo``."""
    from ray.rllib.algorithms.appo import APPOConfig
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.algorithms.impala import IMPALAConfig
    from ray.rllib.algorithms.ppo import PPOConfig

    from cloudrl.algorithms.bdq import BDQConfig
    from models.bdq import BDQTorchRLModule
    from models.masked_appo import MaskedAPPOTorchRLModule
    from models.masked_dqn import MaskedDQNTorchRLModule
    from models.masked_ppo import MaskedPPOTorchRLModule

    if cfg.algo == "ppo":
        return PPOConfig(), MaskedPPOTorchRLModule, _ppo_defaults()
    if cfg.algo == "dqn":
        return DQNConfig(), MaskedDQNTorchRLModule, _dqn_defaults(cfg.env_steps)
    if cfg.algo == "appo":
        return APPOConfig(), MaskedAPPOTorchRLModule, _appo_defaults()
    if cfg.algo == "impala":
        return IMPALAConfig(), MaskedPPOTorchRLModule, _impala_defaults()
    if cfg.algo == "apex_bdq":
        from cloudrl.algorithms.apex_bdq import ApexBDQConfig
        return ApexBDQConfig(), BDQTorchRLModule, _apex_bdq_defaults(cfg)
    return BDQConfig(), BDQTorchRLModule, _bdq_defaults(cfg.env_steps)


def _apex_bdq_defaults(cfg: TrainConfig) -> dict[str, Any]:
    """BDQ's settings; exploration is Ape-X's per-actor constant epsilon (no schedule), and
    there are as many replay shards as actors, at most 2."""
    hp = _bdq_defaults(cfg.env_steps)
    hp.pop("epsilon")
    hp["num_replay_shards"] = min(2, cfg.num_env_runners)
    return hp


def _async_settings(config: Any) -> None:
    """APPO/IMPALA: an iteration is one train batch of env steps, as for PPO.

    RLlib's IMPALA family defaults to iterations of at least 10 s, however few steps
    that is; cloudrl logs and checkpoints per iteration, so iterations follow the
    batch size instead. Sampling works in the driver (``num_env_runners=0``, then
    sampling and learning alternate) and on remote env runners (sampling overlaps
    learning: the asynchronous actor-learner split these algorithms are made for).
    """
    config.reporting(min_time_s_per_iteration=0,
                     min_sample_timesteps_per_iteration=config.total_train_batch_size)


def build_algo_config(cfg: TrainConfig):
    """The RLlib AlgorithmConfig of ``cfg`` (new API stack, masked module, train seeds)."""
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from cloudrl.callbacks import ClusterMetricsCallback

    register_rllib_envs()
    config, module, hp = _algo_parts(cfg)
    hp.update(cfg.hparams)
    env_id = FLAT_ID if cfg.interface() == "flat" else BRANCHING_ID
    config = (
        config.api_stack(enable_rl_module_and_learner=True,
                         enable_env_runner_and_connector_v2=True)
        .environment(env_id, env_config=cfg.train_env_config())
        .env_runners(num_env_runners=cfg.num_env_runners,
                     num_envs_per_env_runner=cfg.envs_per_runner)
        .learners(num_learners=cfg.num_learners, num_gpus_per_learner=cfg.num_gpus_per_learner)
        .training(**hp)
        .rl_module(rl_module_spec=RLModuleSpec(module_class=module, model_config={
            "encoder": {"hidden": cfg.hidden}, "head_hiddens": [cfg.hidden]}))
        .callbacks(ClusterMetricsCallback)
        .debugging(seed=cfg.run_seed)
        .reporting(metrics_num_episodes_for_smoothing=20)
    )
    if cfg.algo in ASYNC_ALGOS:
        _async_settings(config)
    return config


def env_steps_of(result: dict[str, Any]) -> int:
    """Lifetime sampled env steps from an RLlib result dict."""
    runners = result.get("env_runners", {})
    return int(runners.get("num_env_steps_sampled_lifetime",
                           result.get("num_env_steps_sampled_lifetime", 0)))


# Tracked learner metric -> RLlib result keys, first found wins. IMPALA logs its policy and
# value losses summed over the batch ("pi_loss", "vf_loss") next to the per-step means that
# PPO and APPO report; the means are the comparable numbers.
LEARNER_METRICS: dict[str, tuple[str, ...]] = {
    "total_loss": ("total_loss",), "policy_loss": ("policy_loss", "mean_pi_loss"),
    "vf_loss": ("mean_vf_loss", "vf_loss"), "entropy": ("entropy",), "qf_loss": ("qf_loss",)}


def flat_metrics(result: dict[str, Any]) -> dict[str, float]:
    """The small metric set cloudrl tracks, from one RLlib result.

    Episode metrics are absent (not NaN) on an iteration in which no episode ended:
    RLlib's DQN-family results carry NaN there (1000-tick episodes end every few
    iterations), and a NaN would show up as a gap or a bogus point in MLflow.
    """
    runners = result.get("env_runners", {})
    cluster = runners.get("cluster", {})
    out = {"env_steps": float(env_steps_of(result)),
           "episode_return_mean": runners.get("episode_return_mean"),
           "energy_kwh": cluster.get("energy_kwh"),
           "sla_violation_rate": cluster.get("sla_violation_rate"),
           "toggles": cluster.get("toggles"),
           "invalid_actions": cluster.get("invalid_actions")}
    learner = result.get("learners", {}).get("default_policy", {})
    for key, sources in LEARNER_METRICS.items():
        out[key] = next((learner[s] for s in sources if s in learner), None)
    return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(v)}


def write_meta(path: Path, cfg: TrainConfig) -> None:
    meta = {"algo": cfg.algo, "interface": cfg.interface(),
            "env": cfg.env.model_dump(mode="json"), "hidden": cfg.hidden,
            "env_steps": cfg.env_steps, "run_seed": cfg.run_seed}
    (path / META_FILE).write_text(json.dumps(meta, indent=1))


def check_cluster_fits(config: Any) -> None:
    """Fail fast, naming the knobs, when the run's actors need more CPUs than Ray has.

    Without this an oversized request (say 2 env runners and 2 replay shards at 1 CPU
    each on a 2-CPU laptop) waits forever for actors Ray cannot place. The driver's own
    bundle (the first) is not counted: outside Tune the driver is this process.
    """
    import ray

    bundles = config.algo_class.default_resource_request(config).bundles[1:]
    need = sum(float(b.get("CPU", 0.0)) for b in bundles)
    have = float(ray.cluster_resources().get("CPU", 0.0))
    if need > have + 1e-9:
        raise ConfigError(
            f"the run's actors need {need:g} CPUs, the Ray cluster has {have:g}: lower "
            "num_env_runners, or the CPUs per actor (env_runners num_cpus_per_env_runner, "
            "hparams num_cpus_per_replay_shard for apex_bdq)")


def checkpoint_path(cfg: TrainConfig) -> Path:
    """Where ``train`` writes (and, with ``resume``, reads) the checkpoint of ``cfg``."""
    wl = cfg.env.workload.kind
    return Path(cfg.checkpoint_dir or
                f"results/checkpoints/{cfg.algo}_{wl}_n{cfg.env.sim.fleet.n_servers}"
                f"_s{cfg.run_seed}").resolve()


def train(cfg: TrainConfig,
          on_iteration: Callable[[int, dict[str, float]], None] | None = None,
          ) -> tuple[Path, list[dict[str, float]]]:
    """Train to ``cfg.env_steps``; returns (checkpoint dir, per-iteration metrics).

    With ``checkpoint_every=k`` the run checkpoints every k iterations; with ``resume``
    it starts from the checkpoint at :func:`checkpoint_path` when there is one (weights,
    optimizer, replay state RLlib keeps, and the env-step counter), so a run whose driver
    died goes on where its last checkpoint left it.
    """
    config = build_algo_config(cfg)
    check_cluster_fits(config)
    algo = config.build_algo()
    out = checkpoint_path(cfg)
    history: list[dict[str, float]] = []
    start = time.perf_counter()
    try:
        if cfg.resume and is_checkpoint(out):
            algo.restore_from_path(str(out))
        steps, it = 0, 0
        while steps < cfg.env_steps:
            result = algo.train()
            it += 1
            metrics = flat_metrics(result)
            metrics["wall_s"] = time.perf_counter() - start
            steps = int(metrics["env_steps"])
            history.append(metrics)
            if on_iteration:
                on_iteration(it, metrics)
            if cfg.checkpoint_every and it % cfg.checkpoint_every == 0 and steps < cfg.env_steps:
                algo.save_to_path(str(out))
                write_meta(out, cfg)
        algo.save_to_path(str(out))
        write_meta(out, cfg)
    finally:
        algo.stop()
    return out, history
