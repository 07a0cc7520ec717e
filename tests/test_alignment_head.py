"""The preference-alignment head: models/alignment_head.py on BDQ and masked PPO, and its
learner side (cloudrl/algorithms/alignment_head.py) in BDQTorchLearner and
MaskedPPOTorchLearner."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.evaluation.postprocessing import Postprocessing
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics import LEARNER_RESULTS

from cloudrl.algorithms.alignment_head import (
    BT_LOSS_KEY,
    PAIR_ACCURACY_KEY,
    PairSampler,
    load_sampler,
    preference_loss,
)
from cloudrl.algorithms.bdq import BDQConfig
from cloudrl.algorithms.masked_ppo import MaskedPPOConfig, MaskedPPOTorchLearner
from cloudrl.data.pairs import PairArrays, PairDataError, Segment, pair_row, write_pairs
from envs.cluster_env import ClusterBranchingEnv, ClusterSchedulingEnv
from models.alignment_head import alignment_head_hiddens
from models.bdq import BDQTorchRLModule
from models.masked_ppo import MaskedPPOTorchRLModule

ENV_CONFIG = {"n_servers": 5, "sim": {"episode_length": 50}, "seed_pool": [0, 1, 2]}
ENCODER = {"hidden": 32, "macro_hiddens": [32], "row_hiddens": [16]}
BDQ_MODEL = {"encoder": ENCODER, "trunk_hiddens": [32], "head_hiddens": [16]}
PPO_MODEL = {"encoder": ENCODER, "head_hiddens": [16]}
T = 4  # segment length


@pytest.fixture(scope="module")
def branching() -> ClusterBranchingEnv:
    return ClusterBranchingEnv(ENV_CONFIG)


@pytest.fixture(scope="module")
def flat() -> ClusterSchedulingEnv:
    return ClusterSchedulingEnv(ENV_CONFIG)


def synthetic_rows(space: Any, n: int, seed: int, n_servers: int | None = None
                   ) -> list[dict[str, Any]]:
    """Pairs of random segments; A is preferred iff its summed macro[0] is larger."""
    rng = np.random.default_rng(seed)
    servers_shape = space["servers"].shape
    if n_servers is not None:
        servers_shape = (n_servers, servers_shape[1])

    def segment() -> Segment:
        return Segment(macro=rng.normal(size=(T, *space["macro"].shape)).astype(np.float32),
                       servers=rng.normal(size=(T, *servers_shape)).astype(np.float32),
                       jobs=rng.normal(size=(T, *space["jobs"].shape)).astype(np.float32),
                       actions=np.zeros((T, 1), dtype=np.int64))

    rows = []
    for i in range(n):
        a, b = segment(), segment()
        label = 1.0 if a.macro[:, 0].sum() > b.macro[:, 0].sum() else 0.0
        rows.append(pair_row(f"s{seed}-{i}", "teacher", label, a, b))
    return rows


@pytest.fixture(scope="module")
def pairs_dir(tmp_path_factory: pytest.TempPathFactory, branching: ClusterBranchingEnv) -> str:
    out = tmp_path_factory.mktemp("pairs")
    write_pairs(synthetic_rows(branching.observation_space, 64, seed=1), out)
    return str(out)


def bdq_module(env: Any, **model_config: Any) -> BDQTorchRLModule:
    return BDQTorchRLModule(observation_space=env.observation_space,
                            action_space=env.action_space,
                            model_config={**BDQ_MODEL, **model_config})


def random_obs(space: Any, batch: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    obs = {k: torch.randn((batch, *space[k].shape), generator=gen)
           for k in ("macro", "servers", "jobs")}
    obs["action_mask"] = torch.ones(batch, space["action_mask"].shape[0])
    return obs


# -- module ---------------------------------------------------------------------------------


def test_head_config_parsing_and_errors_name_the_key() -> None:
    assert alignment_head_hiddens({}) is None
    assert alignment_head_hiddens({"alignment_head": None}) is None
    assert alignment_head_hiddens({"alignment_head": True}) == (64,)
    assert alignment_head_hiddens({"alignment_head": {"hidden": 8}}) == (8,)
    assert alignment_head_hiddens({"alignment_head": {"hiddens": [8, 4]}}) == (8, 4)
    for bad in ({"hidden": 0}, {"width": 8}, 64, {"hidden": 8, "hiddens": [8]}):
        with pytest.raises(ValueError, match="alignment_head"):
            alignment_head_hiddens({"alignment_head": bad})


@pytest.mark.parametrize("kind", ["bdq", "ppo"])
def test_no_head_no_parameters_and_the_head_changes_no_other_initialisation(
        kind: str, branching: ClusterBranchingEnv, flat: ClusterSchedulingEnv) -> None:
    def build(**extra: Any) -> torch.nn.Module:
        torch.manual_seed(0)
        if kind == "bdq":
            module = bdq_module(branching, **extra)
        else:
            module = MaskedPPOTorchRLModule(observation_space=flat.observation_space,
                                            action_space=flat.action_space,
                                            model_config={**PPO_MODEL, **extra})
        return module, torch.get_rng_state()

    plain, rng_plain = build()
    with_head, rng_head = build(alignment_head={"hidden": 8})
    assert plain.alignment_head is None
    assert not any("alignment" in k for k in plain.state_dict())
    extra = set(with_head.state_dict()) - set(plain.state_dict())
    assert extra and all(k.startswith("alignment_head.") for k in extra)
    for key, value in plain.state_dict().items():
        assert torch.equal(value, with_head.state_dict()[key]), key
    assert torch.equal(rng_plain, rng_head)  # building the head drew nothing from the RNG
    # A checkpoint without a head loads into a module without one, strictly.
    plain.load_state_dict({k: v.clone() for k, v in plain.state_dict().items()}, strict=True)
    # Learner-only: the inference-only state the env runners get has no head.
    state = with_head.get_state(inference_only=True)
    assert not any(k.startswith("alignment_head") for k in state)


def test_trunk_grad_scale_scales_the_trunk_gradient_of_the_bt_loss_exactly(
        branching: ClusterBranchingEnv, pairs_dir: str) -> None:
    sampler = load_sampler(pairs_dir, "cpu", seed=0,
                           obs_space=branching.observation_space)
    obs, label = sampler.sample(16)
    grads = {}
    for scale in (1.0, 0.5, 0.0):
        torch.manual_seed(0)
        module = bdq_module(branching, alignment_head=True)
        loss, _ = preference_loss(module, obs, label, trunk_grad_scale=scale)
        loss.backward()
        grads[scale] = {
            "trunk": [torch.zeros_like(p) if p.grad is None else p.grad
                      for p in module.trunk.parameters()],
            "head": [p.grad for p in module.alignment_head.parameters()]}
    one, half, zero = grads[1.0], grads[0.5], grads[0.0]
    assert any(float(g.abs().max()) > 0 for g in one["trunk"])
    for g1, gh, g0 in zip(one["trunk"], half["trunk"], zero["trunk"], strict=True):
        assert torch.equal(gh, 0.5 * g1)  # a power of two: exact in floating point
        assert not bool(g0.any())  # scale 0: the trunk gets no BT gradient
    for scaled in (half, zero):  # the head itself always gets its full gradient
        for g, g1 in zip(scaled["head"], one["head"], strict=True):
            assert torch.equal(g, g1)


def test_the_head_learns_to_rank_held_out_synthetic_pairs(
        branching: ClusterBranchingEnv, tmp_path: Path) -> None:
    space = branching.observation_space
    write_pairs(synthetic_rows(space, 256, seed=2), tmp_path / "train")
    write_pairs(synthetic_rows(space, 128, seed=3), tmp_path / "test")
    train = load_sampler(tmp_path / "train", "cpu", seed=0, obs_space=space)
    test = load_sampler(tmp_path / "test", "cpu", seed=0, obs_space=space)
    torch.manual_seed(0)
    module = bdq_module(branching, alignment_head=True)
    with torch.no_grad():
        _, before = preference_loss(module, test.obs, test.label)
    optim = torch.optim.Adam(module.parameters(), lr=3e-3)
    for _ in range(150):
        obs, label = train.sample(32)
        loss, _ = preference_loss(module, obs, label)
        optim.zero_grad()
        loss.backward()
        optim.step()
    with torch.no_grad():
        held_out_loss, accuracy = preference_loss(module, test.obs, test.label)
    assert float(accuracy) >= 0.85, (float(before), float(accuracy))
    assert float(held_out_loss) < math.log(2)  # better than the coin's BT loss


@pytest.mark.parametrize("obs_steps", [T + 1, T])
def test_the_sampler_keeps_the_t_post_step_states_of_either_segment_layout(obs_steps: int) -> None:
    # Step i of side s of pair p holds 100*p + 10*s + i in every observation entry; a
    # transition segment (T+1 observations) starts with the state before its first action.
    n_pairs, dims = 3, {"macro": (2,), "servers": (5, 3), "jobs": (4, 2)}
    first = obs_steps - T  # index of the first post-step state

    def side(s: int) -> dict[str, np.ndarray]:
        value = (100 * np.arange(n_pairs)[:, None] + 10 * s + np.arange(obs_steps)[None, :])
        out = {part: np.broadcast_to(value.reshape(n_pairs, obs_steps, *[1] * len(d)),
                                     (n_pairs, obs_steps, *d)).astype(np.float32)
               for part, d in dims.items()}
        return {**out, "actions": np.zeros((n_pairs, T, 1), dtype=np.int64)}

    shape = {"segment_length": T, "obs_steps": obs_steps, "n_servers": 5, "k_slots": 4,
             "macro_dim": 2, "server_dim": 3, "job_dim": 2, "action_dim": 1}
    pairs = PairArrays(label=np.array([1.0, 0.0, 0.5]), obs={"a": side(0), "b": side(1)},
                       meta={}, shape=shape)
    sampler = PairSampler(pairs, "cpu", seed=0)
    for part, d in dims.items():
        assert tuple(sampler.obs[part].shape) == (n_pairs, 2, T, *d)
    want = (100 * np.arange(n_pairs)[:, None, None] + 10 * np.arange(2)[None, :, None]
            + np.arange(first, first + T)[None, None, :])
    np.testing.assert_array_equal(sampler.obs["macro"][..., 0].numpy(), want)
    np.testing.assert_array_equal(sampler.obs["servers"][..., 4, 2].numpy(), want)


# -- the safety benchmark's teacher and verdict (experiments/benchmarks/bench_alignment_head.py)


def test_the_energy_teacher_lets_energy_decide_inside_the_overload_bound() -> None:
    from cloudrl.alignment.teacher import Teacher
    from experiments.benchmarks.bench_alignment_head import teacher_config

    energy = teacher_config("energy", n_servers=15, segment=20, overload_bound=0.2)
    assert energy.overload.bound == pytest.approx(60.0)  # 20% of 15 * 20 server-steps
    assert energy.model_dump(exclude={"overload"}) == teacher_config(
        "lex", 15, 20, 0.2).model_dump(exclude={"overload"})  # nothing else changed
    # A consolidates: more overload, less energy; B spreads the load.
    a = {"sla_violations": 0.0, "overload": 50.0, "slowdown_spread": 0.0, "energy_kwh": 0.8}
    b = {"sla_violations": 0.0, "overload": 30.0, "slowdown_spread": 0.0, "energy_kwh": 1.0}
    assert Teacher(teacher_config("lex", 15, 20, 0.2)).compare(a, b) == (0.0, "overload")
    assert Teacher(energy).compare(a, b) == (1.0, "energy_kwh")
    over = {**a, "overload": 61.0}  # outside the bound: overload decides again
    assert Teacher(energy).compare(over, b) == (0.0, "overload")
    violating = {**b, "sla_violations": 1.0}  # the SLA bound still comes first
    assert Teacher(energy).compare(over, violating) == (1.0, "sla_violations")
    with pytest.raises(ValueError, match="overload_bound"):
        teacher_config("energy", 15, 20, 1.5)
    with pytest.raises(ValueError, match="lex or energy"):
        teacher_config("energy_first", 15, 20, 0.2)


def test_paired_differences_and_the_goal_verdict_by_hand() -> None:
    from experiments.benchmarks.bench_alignment_head import goal_verdict, paired_differences

    arm = {0: [{"x": 1.0}, {"x": 3.0}], 1: [{"x": 5.0}]}
    base = {0: [{"x": 0.0}, {"x": 1.0}], 1: [{"x": 2.0}], 2: [{"x": 9.0}]}
    assert paired_differences(arm, base, "x") == [1.0, 2.0, 3.0]  # run seed 2: no partner
    with pytest.raises(ValueError, match="run seed 1"):
        paired_differences(arm, {1: [{"x": 0.0}, {"x": 0.0}]}, "x")
    diffs = {"sla_violations": (-2.0, 1.0), "overload": (-1.0, 0.5),
             "slowdown_spread": (-0.5, 0.1), "energy_kwh": (0.1, 0.2)}
    # energy: upper bound 0.3 <= 1% of 40 kWh = 0.4
    assert goal_verdict(diffs, 40.0, 0.01) == {
        "sla_violations": True, "overload": True, "slowdown_spread": True,
        "energy_kwh": True, "met": True}
    assert goal_verdict({**diffs, "energy_kwh": (0.3, 0.2)}, 40.0, 0.01)["met"] is False
    verdict = goal_verdict({**diffs, "overload": (-1.0, 1.0)}, 40.0, 0.01)
    assert verdict["overload"] is False and verdict["met"] is False  # upper bound 0: not fewer


def test_matched_pairs_compare_two_policies_on_the_same_workload_and_start(
        tmp_path: Path) -> None:
    from cloudrl.alignment.teacher import Teacher
    from cloudrl.data.pairs import read_pairs
    from cloudrl.data.segments import load_episode_data
    from experiments.benchmarks.bench_alignment_head import (
        make_matched_pairs,
        record_demos,
        teacher_config,
    )

    record_demos(tmp_path / "demos", ENV_CONFIG, ["power_aware", "round_robin", "ffd"], 2,
                 same_seeds=True)
    episodes = load_episode_data(tmp_path / "demos")
    assert sorted(e.episode_seed for e in episodes) == [0, 0, 0, 1, 1, 1]
    cfg = teacher_config("energy", 5, T, 0.2)
    made = make_matched_pairs(episodes, 40, T, 0, tmp_path / "pairs", cfg)
    assert sum(made["labels"].values()) == 40
    pairs = read_pairs(tmp_path / "pairs")
    meta = pairs.meta
    assert len(pairs) == 40 and len(set(meta["pair_id"])) == 40
    np.testing.assert_array_equal(meta["a_episode_seed"], meta["b_episode_seed"])
    np.testing.assert_array_equal(meta["a_start"], meta["b_start"])
    assert all(a != b for a, b in zip(meta["a_policy"], meta["b_policy"], strict=True))
    teacher = Teacher(cfg)
    for i in range(len(pairs)):  # no label noise: each label is the teacher's ranking
        stats = [{k: float(meta[f"{s}_{k}"][i]) for k in ("sla_violations", "overload",
                                                          "slowdown_spread", "energy_kwh")}
                 for s in ("a", "b")]
        assert pairs.label[i] == teacher.compare(*stats)[0]
    with pytest.raises(ValueError, match="matched pairs"):  # one policy: nothing to match
        make_matched_pairs([e for e in episodes if e.policy == "ffd"], 1, T, 0,
                           tmp_path / "none", cfg)


# -- learners ---------------------------------------------------------------------------------


def bdq_learner(env: Any, head: bool = False, **training: Any) -> Any:
    model = {**BDQ_MODEL, **({"alignment_head": True} if head else {})}
    config = (BDQConfig()
              .environment(observation_space=env.observation_space,
                           action_space=env.action_space)
              .training(lr=1e-3, **training).rl_module(model_config=model).debugging(seed=3))
    return config.build_learner(spaces={DEFAULT_MODULE_ID: (env.observation_space,
                                                            env.action_space)})


def ppo_learner(env: Any, head: bool = False, **training: Any) -> Any:
    model = {**PPO_MODEL, **({"alignment_head": True} if head else {})}
    config = (MaskedPPOConfig()
              .environment(observation_space=env.observation_space,
                           action_space=env.action_space)
              .training(lr=1e-3, **training)
              .rl_module(rl_module_spec=RLModuleSpec(module_class=MaskedPPOTorchRLModule,
                                                     model_config=model))
              .debugging(seed=3))
    return config.build_learner(spaces={DEFAULT_MODULE_ID: (env.observation_space,
                                                            env.action_space)})


def bdq_batch(env: Any, seed: int, n: int = 16) -> MultiAgentBatch:
    gen = torch.Generator().manual_seed(seed)
    space = env.observation_space
    columns = {Columns.OBS: random_obs(space, n, gen), Columns.NEXT_OBS: random_obs(space, n, gen),
               Columns.ACTIONS: torch.zeros(n, len(env.branch_sizes), dtype=torch.int64),
               Columns.REWARDS: torch.randn(n, generator=gen),
               Columns.TERMINATEDS: torch.zeros(n, dtype=torch.bool),
               "n_step": torch.ones(n, dtype=torch.int64), "weights": torch.ones(n)}
    return MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(columns)}, env_steps=n)


def ppo_batch(env: Any, seed: int, n: int = 16) -> MultiAgentBatch:
    gen = torch.Generator().manual_seed(seed)
    columns = {Columns.OBS: random_obs(env.observation_space, n, gen),
               Columns.ACTIONS: torch.randint(0, env.action_space.n, (n,), generator=gen),
               Columns.ACTION_LOGP: torch.full((n,), -4.0),
               Columns.ACTION_DIST_INPUTS: torch.zeros(n, env.action_space.n),
               Postprocessing.ADVANTAGES: torch.randn(n, generator=gen),
               Postprocessing.VALUE_TARGETS: torch.randn(n, generator=gen)}
    return MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(columns)}, env_steps=n)


def run_updates(learners: list[Any], batch_fn: Any, k: int = 3, **kwargs: Any) -> list[dict]:
    results = []
    for i in range(k):
        for learner in learners:
            results.append(learner.update(batch=batch_fn(seed=i), timesteps={
                "num_env_steps_sampled_lifetime": 100 * (i + 1)}, **kwargs))
    return results


@pytest.mark.parametrize("kind", ["bdq", "ppo"])
def test_weight_zero_gives_bit_identical_updates_and_weight_above_zero_moves_the_trunk(
        kind: str, branching: ClusterBranchingEnv, flat: ClusterSchedulingEnv,
        pairs_dir: str) -> None:
    if kind == "bdq":
        env, make, batch_fn, extra = branching, bdq_learner, bdq_batch, {}
    else:
        env, make, batch_fn, extra = flat, ppo_learner, ppo_batch, {
            "num_epochs": 1, "minibatch_size": 16}
    plain = make(env)
    zero = make(env, head=True, alignment_pairs=pairs_dir, alignment_weight=0.0)
    aligned = make(env, alignment_pairs=pairs_dir, alignment_weight=0.5, alignment_batch=8)
    if kind == "ppo":
        assert isinstance(plain, MaskedPPOTorchLearner)
    modules = [learner.module[DEFAULT_MODULE_ID] for learner in (plain, zero, aligned)]
    initial = {k: v.clone() for k, v in modules[0].state_dict().items()}
    head_initial = {k: v.clone() for k, v in modules[1].alignment_head.state_dict().items()}
    assert modules[0].alignment_head is None and modules[2].alignment_head is not None
    results = run_updates([plain, zero, aligned], lambda seed: batch_fn(env, seed), **extra)
    states = [m.state_dict() for m in modules]
    shared = initial.keys()
    assert any(not torch.equal(initial[k], states[0][k]) for k in shared)  # it did learn
    for key in shared:  # weight 0: the shared modules are bit-identical to plain
        assert torch.equal(states[0][key], states[1][key]), key
    for key, value in head_initial.items():  # and its head never moved
        assert torch.equal(modules[1].alignment_head.state_dict()[key], value)
    trunk = "trunk." if kind == "bdq" else "encoder."
    assert any(not torch.equal(states[0][k], states[2][k]) for k in shared
               if k.startswith(trunk))  # weight > 0 shapes the shared representation
    stats_zero, stats_aligned = results[-2][DEFAULT_MODULE_ID], results[-1][DEFAULT_MODULE_ID]
    assert BT_LOSS_KEY not in stats_zero
    assert math.isfinite(float(stats_aligned[BT_LOSS_KEY]))
    assert 0.0 <= float(stats_aligned[PAIR_ACCURACY_KEY]) <= 1.0


def test_config_validation_names_the_setting(pairs_dir: str, branching: ClusterBranchingEnv,
                                             tmp_path: Path) -> None:
    from cloudrl.training import TrainConfig

    with pytest.raises(ValueError, match="alignment_pairs"):
        BDQConfig().training(alignment_weight=0.5).validate()
    with pytest.raises(ValueError, match="alignment_pairs: .*no such file"):
        BDQConfig().training(alignment_weight=0.5,
                             alignment_pairs=str(tmp_path / "missing")).validate()
    with pytest.raises(ValueError, match="alignment_trunk_grad_scale"):
        MaskedPPOConfig().training(alignment_trunk_grad_scale=-1.0).validate()
    with pytest.raises(ValidationError, match="alignment_weight"):
        TrainConfig(algo="bdq", hparams={"alignment_weight": -0.1})
    assert "alignment_head" not in BDQConfig().training(
        alignment_pairs=pairs_dir, alignment_weight=0.0).model_config
    assert BDQConfig().training(alignment_pairs=pairs_dir,
                                alignment_weight=0.1).model_config["alignment_head"] is True
    write_pairs(synthetic_rows(branching.observation_space, 4, seed=4, n_servers=7),
                tmp_path / "n7")
    with pytest.raises(PairDataError, match="field n_servers: the pairs have 7"):
        load_sampler(tmp_path / "n7", "cpu", 0, branching.observation_space)


# -- RLlib end to end -------------------------------------------------------------------------


@pytest.mark.usefixtures("ray_session")
def test_rllib_bdq_with_the_head_trains_and_reports_the_metrics(pairs_dir: str) -> None:
    from cloudrl.training import TrainConfig, build_algo_config

    cfg = TrainConfig(algo="bdq", env=ENV_CONFIG, env_steps=256, envs_per_runner=1,
                      hidden=16, hparams={
                          "alignment_pairs": pairs_dir, "alignment_weight": 0.5,
                          "alignment_batch": 8, "alignment_trunk_grad_scale": 0.5,
                          "train_batch_size_per_learner": 16,
                          "num_steps_sampled_before_learning_starts": 32})
    config = build_algo_config(cfg)
    config.env_runners(rollout_fragment_length=16).reporting(
        min_sample_timesteps_per_iteration=64)
    algo = config.build_algo()
    try:
        for _ in range(3):
            result = algo.train()
        stats = result[LEARNER_RESULTS][DEFAULT_MODULE_ID]
        assert math.isfinite(float(stats["qf_loss"]))
        assert math.isfinite(float(stats[BT_LOSS_KEY])) and float(stats[BT_LOSS_KEY]) > 0
        assert 0.0 <= float(stats[PAIR_ACCURACY_KEY]) <= 1.0
        assert algo.learner_group._learner.module[DEFAULT_MODULE_ID].alignment_head is not None
    finally:
        algo.stop()
