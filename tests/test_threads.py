"""Torch threads follow the CPUs Ray gives each process (cloudrl.threads)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from pydantic import ValidationError

from cloudrl.threads import TorchThreads, driver_threads, thread_callbacks
from cloudrl.training import TrainConfig, build_algo_config

SMALL = {"env": {"sim": {"fleet": {"n_servers": 5}}}, "envs_per_runner": 1}


@pytest.fixture
def keep_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_bad_thread_counts_name_the_field() -> None:
    for bad in (0, -1, "many", 1.5):
        with pytest.raises(ValidationError, match="torch_threads.learner"):
            TrainConfig(torch_threads={"learner": bad})
    with pytest.raises(ValidationError, match="torch_threads.gpu"):
        TrainConfig(torch_threads={"gpu": 1})
    assert TrainConfig(torch_threads={"env_runner": 3}).torch_threads.env_runner == 3
    assert TrainConfig().torch_threads.learner == "auto"


@pytest.mark.parametrize(("runners", "main_cpus", "want"), [
    (0, None, 2),   # sampling in the driver on 2 CPUs: the driver keeps both (torch's default)
    (1, None, 1),   # one runner holds a CPU: the learner gets the other one
    (2, None, 1),   # no spare CPU: RLlib's main-process bundle (1)
    (2, 2, 2),      # num_cpus_for_main_process raises it
])
@pytest.mark.parametrize("algo", ["ppo", "apex_bdq"])
def test_driver_threads_match_ray_resources(ray_session, algo, runners, main_cpus, want) -> None:
    if algo == "apex_bdq" and runners == 0:
        runners, want = 1, 1  # Ape-X needs a remote runner
    hparams = {"num_cpus_per_replay_shard": 0} if algo == "apex_bdq" else {}
    config = build_algo_config(TrainConfig(algo=algo, num_env_runners=runners,
                                           hparams=hparams, **SMALL))
    if main_cpus is not None:
        config.resources(num_cpus_for_main_process=main_cpus)
    assert driver_threads(config) == want


def _runner_threads(algo) -> list[int]:
    return algo.env_runner_group.foreach_env_runner(
        lambda _runner: torch.get_num_threads(), local_env_runner=False)


def test_remote_env_runner_and_driver_threads_follow_config(ray_session, keep_threads) -> None:
    """The runner gets the override, the driver-side learner the one CPU the runner leaves;
    then each hook again, in its process: auto on the runner is its 1 CPU, an override on
    the driver wins."""
    torch.set_num_threads(3)  # neither what Ray gives nor an override below
    cfg = TrainConfig(algo="ppo", num_env_runners=1, torch_threads={"env_runner": 2}, **SMALL)
    algo = build_algo_config(cfg).build_algo()
    try:
        assert _runner_threads(algo) == [2]
        assert torch.get_num_threads() == 1
        auto_runner = thread_callbacks(TorchThreads())["on_environment_created"]
        assert algo.env_runner_group.foreach_env_runner(
            lambda r: auto_runner(env_runner=r) or torch.get_num_threads(),
            local_env_runner=False) == [1]
        thread_callbacks(TorchThreads(learner=2))["on_algorithm_init"](algorithm=algo)
        assert torch.get_num_threads() == 2
    finally:
        algo.stop()


@pytest.mark.slow
def test_apex_learner_and_remote_learners_get_their_cpus(ray_session, keep_threads) -> None:
    """Ape-X's driver-side learner and its runner; PPO's remote learner actor."""
    torch.set_num_threads(3)
    cfg = TrainConfig(algo="apex_bdq", num_env_runners=1,
                      hparams={"num_cpus_per_replay_shard": 0}, **SMALL)
    algo = build_algo_config(cfg).build_algo()
    try:
        assert (_runner_threads(algo), torch.get_num_threads()) == ([1], 1)
    finally:
        algo.stop()
    cfg = TrainConfig(algo="ppo", num_learners=1, torch_threads={"learner": 2}, **SMALL)
    algo = build_algo_config(cfg).build_algo()
    try:
        results = algo.learner_group.foreach_learner(lambda _l: torch.get_num_threads())
        assert [r.get() for r in results] == [2]
        assert torch.get_num_threads() == 2
    finally:
        algo.stop()
