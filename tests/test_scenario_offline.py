"""cloudrl scenarios offline: logged behaviour episodes, their RLlib offline format, a tiny
CQL-Lag train played through the scenario runner, and the command's argument errors."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from cloudrl import cli
from cloudrl.algorithms.distill.actions import RoundedController
from cloudrl.scenarios import offline_agent as OA
from envs.scenario.catalog import load_scenario
from envs.scenario.control import run_episode
from envs.scenario.sim import ScenarioSim


@pytest.fixture(scope="module")
def tiny():
    return load_scenario("tiny")


@pytest.fixture(scope="module")
def episodes(tiny):
    return OA.record(tiny, [0, 1])


def test_logged_transitions_reproduce_the_behaviour_cost(tiny, episodes):
    assert [ep.custom_data["policy"] for ep in episodes] == ["signal_aware"] * 2 + ["mpc"] * 2
    for ep in episodes:
        kind = ep.custom_data["policy"]
        seed = ep.custom_data["episode_seed"]
        played = run_episode(ScenarioSim(tiny), RoundedController(OA._controller(kind, {})),
                             seed).metrics
        assert -sum(ep.get_rewards()) == pytest.approx(played["cost_usd"], rel=1e-9)
        # the runner's *_rounded kind is the same policy (`scenarios evaluate` plays it)
        spec = run_episode(ScenarioSim(tiny), OA._controller(f"{kind}_rounded", {}), seed)
        assert spec.metrics["cost_usd"] == pytest.approx(played["cost_usd"], rel=1e-12)
        summary = OA.episode_summary(ep)
        for c in OA.CLASSES:
            logged = sum(ep.get_infos(t)[f"violations_{c}"] for t in range(1, len(ep) + 1))
            assert logged == summary[f"violations_{c}"] == played[f"violations_{c}"]
        sim = ScenarioSim(tiny)
        assert ep.is_terminated and len(ep) == -(-sim.n_ticks // sim.cfg.decision_ticks)
        assert all(0 <= a < 24 for a in ep.get_actions())


def test_budgets_and_costs(episodes):
    budgets = OA.class_budgets(episodes)
    table = OA.behaviour_table(episodes)
    for c in OA.CLASSES:
        assert budgets[c] == pytest.approx(max(row[f"sla_{c}"] for row in table.values()))
    OA.set_costs(episodes, budgets)
    for ep in episodes:
        s = OA.episode_summary(ep)
        total = sum(ep.get_infos(t)["cost"] for t in range(1, len(ep) + 1))
        expect = sum(s[f"violations_{c}"] / max(budgets[c] * max(s[f"jobs_{c}"], 1.0), 1e-3)
                     for c in OA.CLASSES)
        assert total == pytest.approx(expect)


def test_dataset_round_trips_through_the_offline_format(episodes, tmp_path):
    from cloudrl.data.episodes import episode_files
    from cloudrl.data.offline import read_dataset

    budgets = OA.class_budgets(episodes)
    out = OA.write_dataset(episodes, tmp_path / "data", budgets)
    assert len(episode_files(out)) == 2  # one file per behaviour
    back = read_dataset(out)
    key = {(e.custom_data["policy"], e.custom_data["episode_seed"]): e for e in episodes}
    assert len(back) == len(episodes)
    for ep in back:
        orig = key[(ep.custom_data["policy"], ep.custom_data["episode_seed"])]
        assert np.array_equal(ep.get_actions(), orig.get_actions())
        assert np.allclose(ep.get_rewards(), orig.get_rewards())
        obs, obs0 = ep.get_observations(), orig.get_observations()
        assert np.allclose([o["macro"] for o in obs], [o["macro"] for o in obs0])
        assert [ep.get_infos(t)["cost"] for t in range(1, len(ep) + 1)] == \
            [orig.get_infos(t)["cost"] for t in range(1, len(orig) + 1)]
    meta = json.loads((out / "dataset.json").read_text())
    assert meta["budgets"] == pytest.approx(budgets)


def test_tiny_train_and_the_agent_plays_through_the_runner(tiny, episodes, tmp_path):
    from cloudrl.scenarios.runner import ControllerSpec, run_controllers

    budgets = OA.class_budgets(episodes)
    data = OA.write_dataset(episodes, tmp_path / "data", budgets)
    ckpt, metrics = OA.train(tiny, data, tmp_path / "agent", budgets,
                             OA.TrainSettings(iterations=2, train_batch_size=128,
                                              minibatch_size=64, hidden=16))
    assert "lagrange" in metrics
    meta = json.loads((ckpt / "cloudrl.json").read_text())
    assert meta["algo"] == "cql_lag" and meta["scenario"] == "tiny"
    [rows] = run_controllers(tiny, [ControllerSpec("rllib", {"checkpoint": str(ckpt)})],
                             [1_000_000], workers=1)
    assert np.isfinite(rows[0]["cost_usd"]) and "sla_lc" in rows[0]
    ev = OA.evaluate(tiny, ckpt, budgets, [1_000_000], workers=1)
    assert set(ev.within) == {"signal_aware", "mpc", "cql_lag"}
    assert "cql_lag - mpc" in OA.format_table(ev)


@pytest.mark.parametrize("argv", [["--episodes", "0"], ["--n-seeds", "51"],
                                  ["--iterations", "0"], ["--budget-fraction", "0"],
                                  ["--data", "/no/such/dir"], ["--epochs", "0"],
                                  ["--noise", "0"], ["--noise", "1.5"], ["--steps", "0"],
                                  ["--expectile", "1.0"], ["--expectile", "0.4"],
                                  ["--beta", "-1"], ["--penalty", "-1", "0"],
                                  ["--budget-quantile", "0"], ["--budget-quantile", "1.5"],
                                  ["--budget-quantile", "0.95", "--data", "/no/such"],
                                  ["--support", "0"], ["--window-noise", "0"],
                                  ["--gamma", "1"], ["--policy-steps", "0"], ["--beta", "nan"],
                                  ["--window-noise", "0.5", "--data", "/no/such"],
                                  ["--critic", "paired", "--horizon", "0"],
                                  ["--horizon", "8"], ["--es-iterations", "0"],
                                  ["--model-steps", "0"], ["--disagreement-weight", "-1"],
                                  ["--held-out", "0"],
                                  ["--logged-states", "--unconstrained"],
                                  ["--learner", "model", "--cap-gate", "1.5"],
                                  ["--learner", "model", "--cap-gate", "nan"],
                                  ["--learner", "student", "--cap-gate", "0.05"],
                                  ["--learner", "model", "--episodes", "3", "--held-out", "3"]])
def test_bad_arguments_exit_2_with_one_line(argv, capsys):
    code = cli.main(["scenarios", "offline", "--scenario", "tiny", *argv])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("cloudrl: scenarios offline:")


def test_unknown_scenario_exits_2(capsys):
    assert cli.main(["scenarios", "offline", "--scenario", "no_such"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_command_runs_on_tiny(tmp_path, capsys):
    out = tmp_path / "run.json"
    code = cli.main(["scenarios", "offline", "--scenario", "tiny", "--episodes", "2",
                     "--n-seeds", "2", "--iterations", "3", "--out", str(tmp_path / "o"),
                     "--workers", "1", "--json", str(out)])
    assert code == 0
    doc = json.loads(out.read_text())
    assert set(doc["comparisons"]) == {"signal_aware", "mpc"}
    assert "cql_lag - signal_aware" in capsys.readouterr().out


def _row(cost: float, lc: float, batch: float) -> dict[str, float]:
    return {"cost_usd": cost, "sla_lc": lc, "sla_batch": batch}


def test_student_keeps_per_seed_the_cheapest_episode_within_every_budget():
    from cloudrl.scenarios.offline_student import select_episodes

    budgets = {"lc": 0.001, "batch": 0.01}
    rows = [_row(90.0, 0.0005, 0.005),  # seed 0: safe
            _row(80.0, 0.0020, 0.005),  # seed 0: cheaper, LC over budget
            _row(85.0, 0.0005, 0.009),  # seed 0: safe, cheapest safe
            _row(50.0, 0.0030, 0.020),  # seed 1: none safe; ratio 3 + 2
            _row(60.0, 0.0015, 0.012),  # seed 1: closest (1.5 + 1.2)
            _row(40.0, 0.0001, 0.001)]  # seed 2: the only one
    seeds = [0, 0, 0, 1, 1, 2]
    assert select_episodes(rows, seeds, budgets, "closest") == [2, 4, 5]
    assert select_episodes(rows, seeds, budgets, "drop") == [2, 5]


def test_student_learner_runs_on_tiny_and_its_checkpoint_plays(tmp_path, capsys):
    out = tmp_path / "run.json"
    code = cli.main(["scenarios", "offline", "--scenario", "tiny", "--episodes", "2",
                     "--n-seeds", "2", "--learner", "student", "--epochs", "2",
                     "--out", str(tmp_path / "o"), "--workers", "1", "--json", str(out)])
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["learner"] == "student"
    assert set(doc["within_budget"]) == {"signal_aware", "mpc", "student"}
    assert "student - mpc" in capsys.readouterr().out
    info = json.loads((tmp_path / "o" / "student_seed0" / "offline.json").read_text())
    assert len(info["kept"]) == 2  # one episode per train seed
    from cloudrl.data.offline import read_dataset

    lengths = {(ep.custom_data["policy"], ep.custom_data["episode_seed"]): len(ep)
               for ep in read_dataset(tmp_path / "o" / "data")}
    assert info["rows"] == sum(lengths[(k["policy"], k["seed"])] for k in info["kept"])
    assert (tmp_path / "o" / "student_seed0" / "policy.pt").exists()


def test_noisy_runs_log_the_behaviours_own_action_and_stay_out_of_the_budgets(tiny, episodes):
    noisy = OA.record(tiny, [0, 1], noise=(0.5,))
    assert len(noisy) == 8 and sum(OA.is_clean(ep) for ep in noisy) == 4
    clean = [ep for ep in noisy if OA.is_clean(ep)]
    # the clean runs are the behaviours' own episodes, unchanged by the noisy ones
    assert [OA.episode_summary(a)["cost_usd"] for a in clean] == \
        [OA.episode_summary(b)["cost_usd"] for b in episodes]
    assert OA.class_budgets(noisy) == OA.class_budgets(episodes)
    for ep in noisy:
        taken = np.asarray(ep.get_actions(slice(0, len(ep)))).reshape(-1)
        own = np.array([ep.get_infos(t + 1)["behaviour_action"] for t in range(len(ep))])
        differ = float(np.mean(taken != own))
        if OA.is_clean(ep):
            assert differ == 0.0
        else:  # about half the decisions random, a 24th of those the same action
            assert 0.3 < differ < 0.65
    again = OA.record(tiny, [0], behaviours=("mpc",), noise=(0.5,))[1]
    first = [ep for ep in noisy if ep.custom_data["policy"] == "mpc"
             and not OA.is_clean(ep) and ep.custom_data["episode_seed"] == 0][0]
    assert list(again.get_actions(slice(0, len(again)))) == \
        list(first.get_actions(slice(0, len(first))))  # seeded


def test_student_can_clone_one_behaviour_the_cheapest_within_budget():
    from cloudrl.scenarios.offline_student import StudentSettings, select_behaviour

    budgets = {"lc": 0.001, "batch": 0.01}
    rows = [_row(80.0, 0.002, 0.005), _row(82.0, 0.002, 0.005),  # "a": cheap, LC over
            _row(90.0, 0.0005, 0.005), _row(92.0, 0.0005, 0.005),  # "b": within
            _row(95.0, 0.0001, 0.001), _row(99.0, 0.0001, 0.001)]  # "c": within, dearer
    policies = ["a", "a", "b", "b", "c", "c"]
    assert select_behaviour(rows, policies, budgets) == [2, 3]
    # no behaviour within budget on average: the cheapest of all
    assert select_behaviour(rows[:2], policies[:2], budgets) == [0, 1]
    with pytest.raises(ValueError, match="select"):
        StudentSettings(select="best")


def test_iql_learner_runs_on_tiny_on_every_logged_decision(tmp_path, capsys):
    out = tmp_path / "run.json"
    code = cli.main(["scenarios", "offline", "--scenario", "tiny", "--episodes", "2",
                     "--noise", "0.5", "--n-seeds", "2", "--learner", "iql", "--steps", "50",
                     "--policy-steps", "7", "--gamma", "0.9",
                     "--out", str(tmp_path / "o"), "--workers", "1", "--json", str(out)])
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["learner"] == "iql"
    assert set(doc["within_budget"]) == {"signal_aware", "mpc", "iql"}
    assert "iql - mpc" in capsys.readouterr().out
    from cloudrl.data.offline import read_dataset

    eps = read_dataset(tmp_path / "o" / "data")
    info = json.loads((tmp_path / "o" / "iql_seed0" / "offline.json").read_text())
    # every decision of every logged episode, the noisy runs included
    assert info["rows"] == sum(len(ep) for ep in eps) and info["episodes"] == 8
    assert info["settings"]["policy_steps"] == 7 and info["settings"]["gamma"] == 0.9
    assert info["settings"]["critic_steps"] == 50
    from cloudrl.scenarios.offline_iql import transitions

    batch = transitions(eps)
    first = eps[0]
    assert batch.rewards[0] == pytest.approx(first.get_rewards(0))
    assert batch.dones.sum() == len(eps)  # one end per episode
    assert np.all(batch.next_obs[0] == np.asarray(first.get_observations(1)["macro"]))
    # the action taken (not the behaviour's own) is what the reward followed
    noisy = next(ep for ep in eps if not OA.is_clean(ep))
    taken = transitions([noisy]).actions
    from envs.scenario.env import READY_MARGINS

    logged = np.asarray(noisy.get_actions(slice(0, len(noisy))))
    assert np.all(taken[:, 0] * len(READY_MARGINS) + taken[:, 1] == logged)
    code = cli.main(["scenarios", "offline", "--scenario", "tiny", "--data",
                     str(tmp_path / "o" / "data"), "--learner", "iql", "--critic", "paired",
                     "--steps", "20", "--n-seeds", "1", "--out", str(tmp_path / "p"),
                     "--workers", "1"])
    assert code == 0
    paired = json.loads((tmp_path / "p" / "iql_seed0" / "offline.json").read_text())
    assert paired["settings"]["critic"] == "paired" and paired["paired_return_std"] > 0
    penalised = transitions([first], (10.0, 0.0)).rewards
    lc = np.array([first.get_infos(t + 1)["violations_lc"] for t in range(len(first))])
    assert np.allclose(penalised, transitions([first]).rewards - 10.0 * lc)


def test_override_is_recorded_and_a_dataset_is_reused_only_under_it(tmp_path, capsys):
    override = '{"executor": {"lc_reserve_cores": 1}}'
    code = cli.main(["scenarios", "offline", "--scenario", "tiny", "--episodes", "1",
                     "--n-seeds", "1", "--learner", "student", "--epochs", "1",
                     "--override", override, "--out", str(tmp_path / "o"), "--workers", "1",
                     "--json", str(tmp_path / "r.json")])
    assert code == 0
    data = tmp_path / "o" / "data"
    assert json.loads((data / "dataset.json").read_text())["override"] == json.loads(override)
    assert json.loads((tmp_path / "r.json").read_text())["override"] == json.loads(override)
    capsys.readouterr()
    # the same data without the override it was recorded under: one line, exit 2
    code = cli.main(["scenarios", "offline", "--scenario", "tiny", "--data", str(data),
                     "--learner", "student"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "lc_reserve_cores" in err


@pytest.mark.parametrize("override", ['{"executor": ', "[1]",
                                      '{"executor": {"lc_reserve_cores": -3}}'])
def test_bad_override_exits_2_with_one_line(override, capsys):
    code = cli.main(["scenarios", "offline", "--scenario", "tiny", "--override", override])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--override" in err


def test_budget_quantile_is_the_larger_behaviours_per_episode_quantile(tiny, tmp_path,
                                                                       capsys):
    eps = OA.record(tiny, [0, 1, 2])
    rates = {b: [OA.episode_summary(ep) for ep in eps if ep.custom_data["policy"] == b]
             for b in OA.BEHAVIOURS}
    for q in (0.5, 0.95, 1.0):
        got = OA.class_budgets(eps, q)
        for c in OA.CLASSES:
            assert got[c] == pytest.approx(max(np.quantile([s[f"sla_{c}"] for s in rows], q)
                                               for rows in rates.values()))
    assert OA.class_budgets(eps, 1.0)["batch"] >= OA.class_budgets(eps)["batch"]
    # reused data gets budgets of the asked quantile; "both" counts seeds within every class
    code = cli.main(["scenarios", "offline", "--scenario", "tiny", "--episodes", "2",
                     "--n-seeds", "2", "--learner", "student", "--epochs", "1",
                     "--out", str(tmp_path / "o"), "--workers", "1"])
    assert code == 0
    out = tmp_path / "q.json"
    code = cli.main(["scenarios", "offline", "--scenario", "tiny", "--data",
                     str(tmp_path / "o" / "data"), "--learner", "student", "--epochs", "1",
                     "--budget-quantile", "1.0", "--n-seeds", "2", "--out",
                     str(tmp_path / "q"), "--workers", "1", "--json", str(out)])
    text = capsys.readouterr().out
    assert code == 0 and "1 quantile" in text
    assert "tiny: 2 train episodes each" in text  # the data's count, not --episodes
    doc = json.loads(out.read_text())
    from cloudrl.data.offline import read_dataset

    assert doc["budgets"] == pytest.approx(OA.class_budgets(read_dataset(tmp_path / "o" /
                                                                         "data"), 1.0))
    for name, rows in doc["per_seed"].items():
        both = [all(m[f"sla_{c}"] <= doc["budgets"][c] + 1e-12 for c in OA.CLASSES)
                for m in rows]
        assert doc["within_budget"][name]["both"] == pytest.approx(np.mean(both))


def test_window_noise_shifts_whole_windows_and_logs_the_behaviours_own_action(tiny):
    from envs.scenario.env import READY_MARGINS

    [clean, shifted] = OA.record(tiny, [0], behaviours=("mpc",), window_noise=(1.0,))
    assert OA.is_clean(clean) and not OA.is_clean(shifted)
    assert shifted.custom_data["noise_kind"] == "window"
    n = len(shifted)
    taken = np.asarray(shifted.get_actions(slice(0, n)))
    own = np.array([shifted.get_infos(t + 1)["behaviour_action"] for t in range(n)])
    nr = len(READY_MARGINS)
    moved = [(a // nr - b // nr, a % nr - b % nr) for a, b in zip(taken, own, strict=True)]
    windows = [moved[k:k + OA.WINDOW_STEPS] for k in range(0, n, OA.WINDOW_STEPS)]
    # every window at level 1.0 is shifted (by a step drawn for the window, clipped at
    # the grid's edges, so a window at an edge may not move)
    assert sum(any(m != (0, 0) for m in w) for w in windows) >= 0.8 * len(windows)
    for w in windows:
        unclipped = {m for m in w if m != (0, 0)}
        assert all(abs(a) <= 2 and abs(b) <= 1 for a, b in unclipped)
    assert OA.shifted(0, 0, (-2, -1), 6, 4) == (0, 0)
    assert OA.shifted(5, 3, (2, 1), 6, 4) == (5, 3)
    assert OA.shifted(2, 1, (1, -1), 6, 4) == (3, 0)
    again = OA.record(tiny, [0], behaviours=("mpc",), window_noise=(1.0,))[1]
    assert np.array_equal(np.asarray(again.get_actions(slice(0, n))), taken)
    with pytest.raises(ValueError, match="noise kind"):
        OA.record_episode(tiny, OA._controller("mpc", {}), 0, "mpc", 0.5, "burst")


def test_validation_split_evaluates_on_validation_seeds(tmp_path, capsys):
    from cloudrl.protocol import validation_seeds

    out = tmp_path / "v.json"
    code = cli.main(["scenarios", "offline", "--scenario", "tiny", "--episodes", "1",
                     "--n-seeds", "2", "--split", "validation", "--learner", "student",
                     "--epochs", "1", "--out", str(tmp_path / "o"), "--workers", "1",
                     "--json", str(out)])
    assert code == 0 and "2 validation seeds" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["split"] == "validation" and doc["seeds"] == list(validation_seeds(2))


def test_paired_returns_are_returns_to_go_less_the_siblings_and_cancel_per_seed(tiny):
    from cloudrl.scenarios.offline_iql import paired_returns, transitions

    eps = OA.record(tiny, [0, 1], noise=(0.5,))  # four episodes per seed
    gamma = 0.9
    y = paired_returns(eps, gamma)
    assert len(y) == len(transitions(eps).rewards)
    lengths = [len(ep) for ep in eps]
    parts = np.split(y, np.cumsum(lengths)[:-1])
    g = []
    for ep in eps:
        r = transitions([ep]).rewards
        g.append(np.array([sum(gamma ** k * r[t + k] for k in range(len(r) - t))
                           for t in range(len(r))]))
    seeds = [ep.custom_data["episode_seed"] for ep in eps]
    for k, (seed, part) in enumerate(zip(seeds, parts, strict=True)):
        sib = [g[i] for i, s in enumerate(seeds) if s == seed and i != k]
        assert np.allclose(part, g[k] - np.mean(sib, axis=0))
    for seed in set(seeds):  # the seed's common part cancels: they sum to 0 at every step
        assert np.allclose(sum(p for p, s in zip(parts, seeds, strict=True) if s == seed), 0.0)
    with pytest.raises(ValueError, match="seed 0 has one logged episode"):
        paired_returns([eps[0]], gamma)
    # over a horizon: the next h decisions only, less the siblings' over the same h
    h = 5
    yh = np.split(paired_returns(eps, gamma, horizon=h), np.cumsum(lengths)[:-1])
    gh = []
    for ep in eps:
        r = transitions([ep]).rewards
        gh.append(np.array([sum(gamma ** k * r[t + k] for k in range(min(h, len(r) - t)))
                            for t in range(len(r))]))
    for k, (seed, part) in enumerate(zip(seeds, yh, strict=True)):
        sib = [gh[i] for i, s in enumerate(seeds) if s == seed and i != k]
        assert np.allclose(part, gh[k] - np.mean(sib, axis=0))
    assert not np.allclose(yh[0], parts[0])


def test_iql_training_is_a_function_of_the_run_seed(tiny, tmp_path):
    """Two trainings with one run seed give the same weights whatever the process did
    before (the policy module's initialisation included); another run seed differs."""
    import torch

    from cloudrl.algorithms.iql import IQLConfig
    from cloudrl.scenarios.offline_iql import train_iql_agent

    eps = OA.record(tiny, [0], noise=(0.5,))
    data = OA.write_dataset(eps, tmp_path / "data", OA.class_budgets(eps))
    budgets = OA.class_budgets(eps)

    def weights(seed: int, name: str) -> dict:
        torch.rand(7)  # the global generator elsewhere in the process
        cfg = IQLConfig(run_seed=seed, critic_steps=5, policy_steps=5, hiddens=(8,))
        ckpt, _ = train_iql_agent(tiny, data, tmp_path / name, budgets, cfg, log=lambda _: None)
        return torch.load(ckpt / "policy.pt")

    a, b, c = weights(0, "a"), weights(0, "b"), weights(1, "c")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"budgets": {"lc": "x"}}', ""])
def test_a_broken_dataset_json_is_one_line_exit_2(content, tmp_path, capsys):
    (tmp_path / "dataset.json").write_text(content)
    code = cli.main(["scenarios", "offline", "--scenario", "tiny", "--data", str(tmp_path),
                     "--learner", "student"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "dataset.json" in err


def test_model_learner_searches_the_clone_in_a_model_of_the_logs_on_tiny(tmp_path, capsys):
    out = tmp_path / "run.json"
    argv = ["scenarios", "offline", "--scenario", "tiny", "--episodes", "3", "--noise", "0.5",
            "--n-seeds", "2", "--learner", "model", "--select", "behaviour",
            "--model-steps", "40", "--es-iterations", "3", "--held-out", "1",
            "--out", str(tmp_path / "o"), "--workers", "1", "--json", str(out)]
    assert cli.main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["learner"] == "model" and set(doc["within_budget"]) == {"signal_aware", "mpc",
                                                                       "model"}
    assert "model - mpc" in capsys.readouterr().out
    run = tmp_path / "o" / "model_seed0"
    info = json.loads((run / "policy" / "offline.json").read_text())
    # the clone is the start, trained on the same logs; the last seed holds the search out
    assert (run / "start" / "policy.pt").exists() and info["held_out_seeds"] == [2]
    assert info["search_seeds"] == [0, 1] and info["settings"]["iterations"] == 3
    # the inputs: the columns the actions do not move (the env's first 22 and the clock)
    assert info["input_columns"] == [*range(22), 33]
    assert info["history"][0]["iteration"] == 0 and info["settings"]["constrained"]
    # the model predicts both classes' violations; only iterations within the clone's count
    assert all(len(h["held_extra"]) == 2 for h in info["history"])
    kept = min((h for h in info["history"] if h["feasible"]),
               key=lambda h: (h["held_objective"], h["iteration"]))
    assert info["kept_iteration"] == kept["iteration"]
    assert doc["last_metrics"]["held_out_kept"] <= doc["last_metrics"]["held_out_start"]
    # the same command writes the same policy
    first = (run / "policy" / "policy.pt").read_bytes()
    assert cli.main([*argv[:-2], "--json", str(tmp_path / "again.json")]) == 0
    import torch

    a = torch.load(run / "policy" / "policy.pt", weights_only=True)
    b = torch.load(io.BytesIO(first), weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_model_learner_with_the_release_cap_and_logged_states_on_tiny(tmp_path, capsys):
    """The capped search keeps the clone beside the policy: the checkpoint loads as a
    release-capped module whose anchor is the clone and whose release never passes it."""
    import torch

    from cloudrl.algorithms.distill.policy import load_checkpoint

    argv = ["scenarios", "offline", "--scenario", "tiny", "--episodes", "3", "--noise", "0.5",
            "--n-seeds", "2", "--learner", "model", "--select", "behaviour",
            "--model-steps", "40", "--es-iterations", "3", "--held-out", "1",
            "--release-cap", "--logged-states", "--out", str(tmp_path / "o"),
            "--workers", "1", "--json", str(tmp_path / "run.json")]
    assert cli.main(argv) == 0
    run = tmp_path / "o" / "model_seed0"
    info = json.loads((run / "policy" / "offline.json").read_text())
    assert info["settings"]["release_cap"] and info["settings"]["logged_states"]
    assert all(len(h["held_logged_extra"]) == 2 for h in info["history"])
    policy, spec = load_checkpoint(run / "policy")
    clone, _ = load_checkpoint(run / "start")
    assert spec["model_config"]["release_cap"] is True
    assert all(torch.equal(a, b) for a, b in zip(
        [*policy.anchor_trunk.parameters(), *policy.anchor_logits.parameters()],
        clone.parameters(), strict=True))
    obs = torch.randn(500, 34)
    assert (policy.greedy(obs)[:, 0] <= clone.greedy(obs)[:, 0]).all()


def test_model_learner_with_a_gated_release_cap_on_tiny(tmp_path, capsys):
    """--cap-gate: the gate is found in the logs and saved with the checkpoint; below its
    threshold the policy plays its own release, above it never more than the clone's."""
    import torch

    from cloudrl.algorithms.distill.policy import load_checkpoint
    from envs.scenario.env import OBS_NAMES

    argv = ["scenarios", "offline", "--scenario", "tiny", "--episodes", "3", "--noise", "0.5",
            "--n-seeds", "2", "--learner", "model", "--select", "behaviour",
            "--model-steps", "40", "--es-iterations", "3", "--held-out", "1",
            "--cap-gate", "0.5", "--out", str(tmp_path / "o"), "--workers", "1",
            "--json", str(tmp_path / "run.json")]
    assert cli.main(argv) == 0
    assert "release cap gate:" in capsys.readouterr().out
    run = tmp_path / "o" / "model_seed0"
    info = json.loads((run / "policy" / "offline.json").read_text())
    assert info["settings"]["release_cap"] and info["settings"]["cap_gate"] == 0.5
    policy, spec = load_checkpoint(run / "policy")
    clone, _ = load_checkpoint(run / "start")
    gate = info["cap_gate"]  # on these logs: frac_active, freeing most states
    assert gate is not None and policy.cap_gate == (gate["column"], gate["above"])
    assert 0 < gate["free_share"] <= 1 and gate["violation_share"] <= 0.5
    assert spec["model_config"]["cap_gate"] == {"column": gate["column"],
                                                "name": OBS_NAMES[gate["column"]],
                                                "above": gate["above"]}
    obs = torch.randn(2000, 34)
    a, c = policy.greedy(obs), clone.greedy(obs)
    above = obs[:, gate["column"]] > gate["above"]
    assert (a[above, 0] <= c[above, 0]).all()
    own = super(type(policy), policy).greedy(obs)
    assert torch.equal(a[~above, 0], own[~above, 0])


def brute_placement(sim):
    """The placement state from the simulator's arrays, server by server."""
    from envs.scenario.config import LATENCY_CRITICAL
    from envs.scenario.sim import ACTIVE

    big = max(sim.cores)
    free = [c - u for c, u, s in zip(sim.cores, sim.used, sim.state, strict=True)
            if s == ACTIVE]
    waiting = [sim._cores[j] for j in sim.run_queue if sim._cls[j] == LATENCY_CRITICAL]
    return [max(free, default=0.0) / big, sum(f >= big - 1e-9 for f in free) / len(sim.cores),
            max(waiting, default=0.0) / big]


def test_every_logged_step_carries_the_placement_state_the_policy_does_not_see(tiny,
                                                                              episodes):
    from cloudrl.scenarios.offline_model import logged_arrays, placement_rows
    from envs.scenario.env import OBS_NAMES

    for ep in episodes:
        rows = placement_rows(ep, len(ep))
        assert rows.shape == (len(ep) + 1, 3) and (rows >= 0).all() and (rows <= 1).all()
    plain, placed = logged_arrays(episodes), logged_arrays(episodes, placement=True)
    assert plain["obs"].shape[1] == len(OBS_NAMES) and placed["obs"].shape[1] == len(OBS_NAMES) + 3
    assert np.array_equal(placed["obs"][:, :len(OBS_NAMES)], plain["obs"])
    assert placed["obs"][:, len(OBS_NAMES):].std(0).max() > 0  # it moves along the day
    for ep in episodes:  # data written before the state was logged
        for t in range(len(ep) + 1):
            for k in [k for k in ep.get_infos(t) if k.startswith("place_")]:
                del ep.get_infos(t)[k]
    with pytest.raises(ValueError, match="record it anew"):
        logged_arrays(episodes, placement=True)


def test_the_placement_state_is_the_simulators_server_by_server(tiny):
    from envs.scenario.env import ScenarioEnv

    env = ScenarioEnv({"config": tiny})
    env.reset(seed=3)
    rng = np.random.default_rng(0)
    seen, done = 0, False
    while not done:
        assert env.sim.placement().tolist() == pytest.approx(brute_placement(env.sim))
        seen += env.sim.placement()[0] > 0
        done = env.step(env.action_space.sample() if rng.random() < 0.5 else [5, 0])[2]
    assert seen > 0


def test_model_learner_models_the_placement_state_on_tiny(tmp_path):
    argv = ["scenarios", "offline", "--scenario", "tiny", "--episodes", "3", "--noise", "0.5",
            "--n-seeds", "2", "--learner", "model", "--select", "behaviour",
            "--model-steps", "40", "--es-iterations", "3", "--held-out", "1", "--placement",
            "--out", str(tmp_path / "o"), "--workers", "1", "--json", str(tmp_path / "r.json")]
    assert cli.main(argv) == 0
    info = json.loads((tmp_path / "o" / "model_seed0" / "policy" / "offline.json").read_text())
    assert info["settings"]["placement"]
    # the placement columns follow the 34 observation columns and are modelled, not inputs
    assert info["input_columns"] == [*range(22), 33]
