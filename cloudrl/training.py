"""Training driver: RLlib algorithm configs for the cluster envs, a train loop, checkpoints.

``build_algo_config(cfg)`` returns a plain RLlib ``AlgorithmConfig`` (PPO,
DQN, BDQ, APPO, IMPALA or Ape-X BDQ on the new API stack, with cloudrl's masked
RLModules; the algorithms and their defaults are the table in
``cloudrl.algorithms.specs``), so anything a user knows about RLlib applies.
``train(cfg)`` runs it to an env-step budget on the 50 train seeds only and writes a checkpoint
that ``cloudrl evaluate --checkpoint PATH`` runs on the held-out test seeds.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from cloudrl.algorithms.hparams import RunShape
from cloudrl.algorithms.specs import Algo, checked_hparams, spec_of
from cloudrl.checkpoint_policy import META_FILE, is_checkpoint
from cloudrl.config_loader import ConfigError
from cloudrl.protocol import TRAIN_SEEDS
from cloudrl.threads import TorchThreads, thread_callbacks
from envs.env_config import EnvConfig
from envs.registration import BRANCHING_ID, FLAT_ID, register_rllib_envs

# What ``scenario=NAME`` trains: the algorithms whose masked RLModules run on the scenario
# env (envs.scenario.env.MaskedScenarioEnv: PPO and DQN on its Discrete(24) flat
# interface, BDQ on the MultiDiscrete([6, 4]) branching one, the gated DQN on the presets of
# the signal-aware heuristic, envs.scenario.gated), and its reward scale unless
# ``reward_scale`` is given (the reward is minus the period's cost in $, order 0.1-1).
SCENARIO_ALGOS = ("ppo", "dqn", "bdq", "gated_dqn")
SCENARIO_REWARD_SCALE = 1.0
# per-episode terms of a scenario (ScenarioSim.stats.summary()) logged under
# env_runners/scenario/... and tracked by flat_metrics
SCENARIO_METRICS = ("cost_usd", "energy_kwh", "carbon_kg", "sla_lc", "sla_batch")


class TrainConfig(BaseModel):
    """One training run.

    ``hparams`` are the algorithm's typed hyperparameters (``cloudrl.algorithms``, e.g.
    ``PPOHparams``) that differ from cloudrl's defaults; an unknown key or a bad value is a
    validation error naming it (``hparams.lr``). With the defaults filled in they go to
    ``AlgorithmConfig.training(...)``.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    algo: Algo = "ppo"
    env: EnvConfig = Field(default_factory=EnvConfig)
    env_steps: int = Field(default=20_000, ge=1)
    num_env_runners: int = Field(default=0, ge=0, description="0 = sample in the driver")
    num_learners: int = Field(default=0, ge=0,
                              description="0 = learn in the driver; n = n remote learner actors")
    envs_per_runner: int = Field(default=8, ge=1, description="vectorized envs per runner")
    batched_env: bool = Field(
        default=True, description="env runners step the natively batched cluster env "
        "(envs.vector_env, RLlib gym_env_vectorize_mode='vector_entry_point'); False: "
        "gymnasium's SyncVectorEnv of the single env (same episodes, slower)")
    stacked_connectors: bool = Field(
        default=True, description="env runners on the cluster envs batch observations with "
        "one np.stack per key and hand actions back as batched arrays "
        "(cloudrl.connectors.stacked_batch) instead of RLlib's per-item default pipelines; "
        "same episodes")
    batched_runner: bool = Field(
        default=True, description="with the stacked connectors, env runners record the "
        "batched env's steps as arrays and build the episodes once per sample() call "
        "(cloudrl.env_runners.batched_runner) instead of RLlib's per-env bookkeeping; "
        "same episodes")
    num_gpus_per_learner: float = Field(default=0.0, ge=0,
                                        description="GPU for the (local) learner on a cluster")
    torch_threads: TorchThreads = Field(
        default_factory=TorchThreads, description="torch intra-op threads of the learner and "
        "of each env runner; auto = the CPUs Ray gives them (cloudrl.threads)")
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
    init_module_state: str | None = Field(
        default=None, description="start the RLModule from this saved state "
        "(RLModuleSpec load_state_path), e.g. the out dir of cloudrl align bc")
    scenario: str | None = Field(
        default=None, description="a named scenario (cloudrl scenarios list): train on its "
        "env (envs.scenario.env.MaskedScenarioEnv, its train seeds) instead of the cluster "
        f"env; algo one of {', '.join(SCENARIO_ALGOS)}; reward_scale defaults to "
        f"{SCENARIO_REWARD_SCALE} and torch_threads to 1 per process there")
    scenario_heuristic: dict[str, Any] = Field(
        default_factory=dict, description="on a scenario, the signal-aware heuristic's "
        "parameters (cloudrl train --heuristic-params): the rule gated_dqn picks presets of")
    scenario_sla_weight: float = Field(
        default=1.0, ge=0.0, le=100.0, description="on a scenario, a multiplier on its SLA "
        "penalties in the training reward only (cloudrl train --sla-weight): above 1 a "
        "violation costs the learner more than the scenario charges; the cost logged and "
        "evaluated stays the scenario's")

    @field_validator("hparams")
    @classmethod
    def _typed_hparams(cls, hparams: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        algo = info.data.get("algo")
        return checked_hparams(algo, hparams) if algo is not None else hparams

    @model_validator(mode="after")
    def _init_state_fits(self) -> TrainConfig:
        if self.init_module_state is not None:
            from cloudrl.algorithms.module_state import check_module_state

            self.init_module_state = check_module_state(self.init_module_state, self.algo,
                                                        self.hidden)
        return self

    @model_validator(mode="after")
    def _enough_env_runners(self) -> TrainConfig:
        need = spec_of(self.algo).min_env_runners
        if self.num_env_runners < need:
            raise ValueError(f"num_env_runners: {self.algo} samples on remote env runners "
                             f"(its actors); give at least {need}")
        return self

    @model_validator(mode="after")
    def _scenario_fits(self) -> TrainConfig:
        if self.scenario is not None:
            from envs.scenario.catalog import load_scenario

            load_scenario(self.scenario)  # an unknown name lists the valid ones
            if self.algo not in SCENARIO_ALGOS:
                raise ValueError(f"algo: {self.algo} does not train on a scenario; "
                                 f"expected one of {', '.join(SCENARIO_ALGOS)}")
            if self.algo == "gated_dqn":
                for key in ("heuristic", "presets", "decision_every"):
                    if key in self.hparams:
                        raise ValueError(
                            f"hparams.{key}: on a scenario the gated DQN picks one of the "
                            f"signal-aware rule's presets every decision period; give the "
                            f"rule's parameters with --heuristic-params")
        if self.scenario_heuristic:
            from cloudrl.algorithms.gated.scenario_presets import make_scenario_controller

            if self.scenario is None:
                raise ValueError("scenario_heuristic: goes with scenario")
            make_scenario_controller({"heuristic": self.scenario_heuristic})
        if self.scenario_sla_weight != 1.0 and self.scenario is None:
            raise ValueError("scenario_sla_weight: goes with scenario")
        return self

    def threads(self) -> TorchThreads:
        """``torch_threads``; on a scenario 1 per process unless given: its small MLP at
        batch 64 gains nothing from a second thread, and on a loaded 2-core machine a
        DQN iteration of 1,000 env steps took 27-29 s with the driver's 2 ("auto") against
        4.6-6.5 s with 1 (measured on scarcity_spikes)."""
        if self.scenario is not None and "torch_threads" not in self.model_fields_set:
            return TorchThreads(learner=1, env_runner=1)
        return self.torch_threads

    def interface(self) -> str:
        """The action interface the algorithm acts on (``flat`` or ``branching``; on a
        scenario the gated DQN's is ``gated``)."""
        if self.scenario is not None and self.algo == "gated_dqn":
            return "gated"
        return spec_of(self.algo).interface

    def training_kwargs(self) -> dict[str, Any]:
        """``AlgorithmConfig.training(**kwargs)``: the algorithm's defaults, then ``hparams``."""
        run = RunShape(env_steps=self.env_steps, num_env_runners=self.num_env_runners)
        return spec_of(self.algo).training_kwargs(self.hparams, run)

    def train_env_config(self) -> dict[str, Any]:
        """The env_config RLlib gets: the env config on the train seeds, plus the reward scale."""
        if self.scenario is not None:
            scale = self.reward_scale if "reward_scale" in self.model_fields_set \
                else SCENARIO_REWARD_SCALE
            env = {"scenario": self.scenario, "interface": self.interface(),
                   "seed_pool": list(TRAIN_SEEDS), "reward_scale": scale}
            if self.scenario_sla_weight != 1.0:  # absent at 1: earlier runs keep their key
                env["sla_weight"] = self.scenario_sla_weight
            if self.algo == "gated_dqn":
                from cloudrl.algorithms.gated.scenario_presets import (
                    DEFAULT_SCENARIO_PRESETS,
                    SCENARIO_CONTROLLER_PATH,
                )

                env.update(controller=SCENARIO_CONTROLLER_PATH, controller_config={
                    "heuristic": dict(self.scenario_heuristic),
                    "presets": [dict(p) for p in DEFAULT_SCENARIO_PRESETS]})
            return env
        env = self.env.model_copy(update={"seed_pool": TRAIN_SEEDS})
        return {**env.model_dump(mode="json"), "reward_scale": self.reward_scale}


def build_algo_config(cfg: TrainConfig, configure: Callable[[Any], None] | None = None):
    """The RLlib AlgorithmConfig of ``cfg`` (new API stack, masked module, train seeds).

    ``configure(config)``, when given, runs last (e.g. phase 3 of alignment adds its
    learner connector, learner class and callbacks:
    ``cloudrl.alignment.phase3.configure_phase3``)."""
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from cloudrl.callbacks import ClusterMetricsCallback

    register_rllib_envs()
    spec = spec_of(cfg.algo)
    env_id: Any = FLAT_ID if spec.interface == "flat" else BRANCHING_ID
    episode_metrics: dict[str, Any] = {"callbacks_class": ClusterMetricsCallback}
    if cfg.scenario is not None:
        from envs.scenario.env import MaskedScenarioEnv

        env_id = MaskedScenarioEnv
        episode_metrics = {"on_episode_end": scenario_episode_end}
    config = (
        spec.new_config()
        .api_stack(enable_rl_module_and_learner=True, enable_env_runner_and_connector_v2=True)
        .environment(env_id, env_config=cfg.train_env_config())
        .env_runners(num_env_runners=cfg.num_env_runners,
                     num_envs_per_env_runner=cfg.envs_per_runner)
        .learners(num_learners=cfg.num_learners, num_gpus_per_learner=cfg.num_gpus_per_learner)
        .training(**cfg.training_kwargs())
        .rl_module(rl_module_spec=RLModuleSpec(module_class=spec.module(), model_config={
            "encoder": {"hidden": cfg.hidden}, "head_hiddens": [cfg.hidden]},
            load_state_path=cfg.init_module_state))
        .callbacks(**episode_metrics, **thread_callbacks(cfg.threads()))
        .debugging(seed=cfg.run_seed)
        .reporting(metrics_num_episodes_for_smoothing=20)
    )
    if spec.configure is not None:
        spec.configure(config)
    if configure is not None:
        configure(config)
    if cfg.batched_env and config.env in (FLAT_ID, BRANCHING_ID) and not config.is_multi_agent:
        config.env_runners(gym_env_vectorize_mode="vector_entry_point")
    if config.env in (FLAT_ID, BRANCHING_ID):
        # Discrete/MultiDiscrete actions: RLlib's unsquash is the identity on them, but the
        # connector deep-copies every action batch (~9% of sampling at 32 envs); off.
        config.environment(normalize_actions=False)
        if cfg.stacked_connectors and not config.is_multi_agent:
            from cloudrl.connectors.stacked_batch import use_stacked_batch_connectors

            use_stacked_batch_connectors(config)
            if cfg.batched_runner and config.env_runner_cls is None:
                from cloudrl.env_runners.batched_runner import BatchedSingleAgentEnvRunner

                config.env_runners(env_runner_cls=BatchedSingleAgentEnvRunner)
    return config


def scenario_episode_end(*, episode: Any, metrics_logger: Any = None, **kwargs: Any) -> None:
    """RLlib ``on_episode_end`` on the scenario env: the episode's cost terms
    (``info["episode"]`` of its last step) under ``env_runners/scenario/...``."""
    if metrics_logger is None:
        return
    summary = (episode.get_infos(-1) or {}).get("episode")
    if not summary:
        return
    for key in SCENARIO_METRICS:
        metrics_logger.log_value(("scenario", key), float(summary[key]), reduce="mean",
                                 window=20)


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
    scenario = runners.get("scenario", {})
    for key in SCENARIO_METRICS:  # the scenario env's (its energy where the cluster's is not)
        if out.get(key) is None:
            out[key] = scenario.get(key)
    learner = result.get("learners", {}).get("default_policy", {})
    for key, sources in LEARNER_METRICS.items():
        out[key] = next((learner[s] for s in sources if s in learner), None)
    return {k: float(v) for k, v in out.items() if v is not None and math.isfinite(v)}


def write_meta(path: Path, cfg: TrainConfig) -> None:
    meta = {"algo": cfg.algo, "interface": cfg.interface(),
            "env": cfg.env.model_dump(mode="json"), "hidden": cfg.hidden,
            "env_steps": cfg.env_steps, "run_seed": cfg.run_seed}
    if cfg.scenario is not None:  # the observation is envs.scenario.env.masked_observation
        meta.update(scenario=cfg.scenario, env_config=cfg.train_env_config())
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
            f"num_env_runners{' or num_learners' if config.num_learners else ''}, or the "
            "CPUs per actor (env_runners num_cpus_per_env_runner, "
            "hparams num_cpus_per_replay_shard for apex_bdq)")


def checkpoint_path(cfg: TrainConfig) -> Path:
    """Where ``train`` writes (and, with ``resume``, reads) the checkpoint of ``cfg``."""
    if cfg.scenario is not None:
        return Path(cfg.checkpoint_dir or f"results/checkpoints/{cfg.algo}_{cfg.scenario}"
                    f"_s{cfg.run_seed}").resolve()
    wl = cfg.env.workload.kind
    return Path(cfg.checkpoint_dir or
                f"results/checkpoints/{cfg.algo}_{wl}_n{cfg.env.sim.fleet.n_servers}"
                f"_s{cfg.run_seed}").resolve()


def train(cfg: TrainConfig,
          on_iteration: Callable[[int, dict[str, float]], None] | None = None,
          configure: Callable[[Any], None] | None = None,
          ) -> tuple[Path, list[dict[str, float]]]:
    """Train to ``cfg.env_steps``; returns (checkpoint dir, per-iteration metrics).

    With ``checkpoint_every=k`` the run checkpoints every k iterations; with ``resume``
    it starts from the checkpoint at :func:`checkpoint_path` when there is one (weights,
    optimizer, replay state RLlib keeps, and the env-step counter), so a run whose driver
    died goes on where its last checkpoint left it. ``configure`` is
    :func:`build_algo_config`'s.
    """
    config = build_algo_config(cfg, configure)
    check_cluster_fits(config)
    algo = config.build_algo()
    out = checkpoint_path(cfg)
    history: list[dict[str, float]] = []
    start = time.perf_counter()
    try:
        if cfg.resume and is_checkpoint(out):
            algo.restore_from_path(str(out))
        from cloudrl.progress import progress_bar

        steps, it = 0, 0
        bar = progress_bar(cfg.env_steps, "env steps", unit="step")
        while steps < cfg.env_steps:
            result = algo.train()
            it += 1
            metrics = flat_metrics(result)
            metrics["wall_s"] = time.perf_counter() - start
            bar.update(min(int(metrics["env_steps"]), cfg.env_steps) - min(steps, cfg.env_steps))
            steps = int(metrics["env_steps"])
            history.append(metrics)
            if on_iteration:
                on_iteration(it, metrics)
            if cfg.checkpoint_every and it % cfg.checkpoint_every == 0 and steps < cfg.env_steps:
                algo.save_to_path(str(out))
                write_meta(out, cfg)
        bar.close()
        algo.save_to_path(str(out))
        write_meta(out, cfg)
    finally:
        algo.stop()
    return out, history


def run_tags(cfg: TrainConfig) -> dict[str, Any]:
    """MLflow tags of a training run (the sweep's trial tags, for one run)."""
    where = {"scenario": cfg.scenario} if cfg.scenario is not None else {
        "workload": cfg.env.workload.kind, "n_servers": cfg.env.sim.fleet.n_servers}
    return {"kind": "learned", "policy": cfg.algo, "algo": cfg.algo, "run_seed": cfg.run_seed,
            "interface": cfg.interface(), **where}


def train_logged(cfg: TrainConfig, tracking_uri: str | None = None,
                 experiment: str = "cloudrl-train",
                 on_iteration: Callable[[int, dict[str, float]], None] | None = None,
                 after: Callable[[Path], dict[str, float]] | None = None,
                 ) -> tuple[Path, list[dict[str, float]], str]:
    """:func:`train` with one MLflow run (``cloudrl.tracking``: the SQLite store by default).

    The run (named ``<algo>-<scenario or workload>-s<run seed>``, tags of :func:`run_tags`)
    gets the config as params, the metrics of every iteration at ``step = env_steps``, the
    checkpoint path as tag ``checkpoint`` and, when ``after(checkpoint)`` is given, the
    metrics it returns (an evaluation, say) at the last step. Returns (checkpoint dir,
    per-iteration metrics, run id); the run ends FAILED when training or ``after`` raises.
    """
    from cloudrl import tracking

    tags = run_tags(cfg)
    where = tags.get("scenario") or tags["workload"]
    client, run_id = tracking.open_run(tracking_uri, experiment,
                                       f"{cfg.algo}-{where}-s{cfg.run_seed}", tags)
    with tracking.finishing(client, run_id):
        tracking.log_params(client, run_id, {**cfg.model_dump(mode="json"),
                                             "env_config": cfg.train_env_config()})

        def logged(it: int, metrics: dict[str, float]) -> None:
            tracking.log_metrics(client, run_id, metrics, step=int(metrics["env_steps"]))
            if on_iteration is not None:
                on_iteration(it, metrics)

        path, history = train(cfg, on_iteration=logged, configure=None)
        client.set_tag(run_id, "checkpoint", str(path))
        if after is not None:
            step = int(history[-1]["env_steps"]) if history else 0
            tracking.log_metrics(client, run_id, after(path), step=step)
    return path, history, run_id
