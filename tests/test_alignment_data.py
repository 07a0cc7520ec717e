"""Alignment data: the pair dataset contract, demonstrations, the teacher, operator pairs."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloudrl.alignment.teacher import Criterion, Teacher, TeacherConfig
from cloudrl.data.episodes import read_episodes
from cloudrl.data.pairs import (
    PAIR_SCHEMA,
    PairDataError,
    Segment,
    pair_files,
    pair_row,
    read_pairs,
    write_pairs,
)
from cloudrl.data.segments import (
    DefaultStats,
    EpisodeData,
    cut_segment,
    overload_count,
    placement_slowdowns,
    segment_stats,
    spread,
)
from cloudrl.policy import make_env
from cloudrl.recording import record_episodes
from envs.observation import JOB_COLS, SERVER_COLS, J, S

# ----------------------------------------------------------------------------- pair schema

T, N, K, M, FS, FJ, A = 4, 3, 2, 5, 6, 7, 2


def _segment(rng: np.random.Generator, seed: int = 0, start: int = 0, obs: int = T + 1,
             **stats) -> Segment:
    """T steps with ``obs`` observations: T+1 (a transition segment) or T (a state one)."""
    return Segment(
        macro=rng.normal(size=(obs, M)).astype(np.float32),
        servers=rng.normal(size=(obs, N, FS)).astype(np.float32),
        jobs=rng.normal(size=(obs, K, FJ)).astype(np.float32),
        actions=rng.integers(0, 4, size=(T, A)),
        episode_seed=seed, start=start, policy="ffd", stats=stats)


def _rows(n: int, seed: int = 0, obs: int = T + 1) -> list[dict]:
    rng = np.random.default_rng(seed)
    labels = [1.0, 0.0, 0.5]
    return [pair_row(f"p{i}", "teacher", labels[i % 3],
                     _segment(rng, i, 2 * i, obs, overload=1.0),
                     _segment(rng, i + 100, 3 * i, obs)) for i in range(n)]


def test_pair_round_trip_keeps_values_and_shapes(tmp_path):
    """Transition segments: T actions and T+1 observations per side survive the round trip."""
    rows = _rows(5)
    assert rows[0]["segment_length"] == T and rows[0]["obs_steps"] == T + 1
    paths = write_pairs(rows, tmp_path / "pairs", rows_per_file=2)
    assert len(paths) == 3 and pair_files(tmp_path / "pairs") == sorted(paths)
    data = read_pairs(tmp_path / "pairs")
    assert len(data) == 5
    np.testing.assert_array_equal(data.label, [1.0, 0.0, 0.5, 1.0, 0.0])
    assert data.obs["a"]["servers"].shape == (5, T + 1, N, FS)
    assert data.obs["a"]["macro"].shape == (5, T + 1, M)
    assert data.obs["b"]["actions"].shape == (5, T, A)
    assert data.obs["a"]["macro"].dtype == np.float32
    np.testing.assert_array_equal(data.obs["b"]["jobs"][3],
                                  rows[3]["b_jobs"].reshape(T + 1, K, FJ))
    np.testing.assert_array_equal(data.obs["a"]["actions"][4],
                                  rows[4]["a_actions"].reshape(T, A))
    assert data.meta["pair_id"].tolist() == [f"p{i}" for i in range(5)]
    assert data.meta["b_episode_seed"].tolist() == [100, 101, 102, 103, 104]
    assert data.meta["a_overload"].tolist() == [1.0] * 5
    assert np.isnan(data.meta["b_overload"]).all()   # unknown statistics are NaN
    assert data.shape == {"segment_length": T, "obs_steps": T + 1, "n_servers": N, "k_slots": K,
                          "macro_dim": M, "server_dim": FS, "job_dim": FJ, "action_dim": A}
    assert data.transitions
    # the post-step observations are the last T of the T+1
    np.testing.assert_array_equal(data.post_step_obs("b")["servers"],
                                  data.obs["b"]["servers"][:, 1:])
    assert pq.read_schema(paths[0]).remove_metadata().equals(PAIR_SCHEMA)


def test_state_segments_and_files_from_before_obs_steps_still_read(tmp_path):
    """T observations per side (state segments) are valid; a file written before the
    obs_steps column existed reads as such, with the same arrays."""
    rows = _rows(3, obs=T)
    write_pairs(rows, tmp_path / "new")
    data = read_pairs(tmp_path / "new")
    assert data.shape["obs_steps"] == T and not data.transitions
    assert data.obs["a"]["macro"].shape == (3, T, M)
    np.testing.assert_array_equal(data.post_step_obs("a")["macro"], data.obs["a"]["macro"])
    old_schema = pa.schema([f for f in PAIR_SCHEMA if f.name != "obs_steps"])
    old_rows = [{k: v for k, v in r.items() if k != "obs_steps"} for r in rows]
    (tmp_path / "old").mkdir()
    pq.write_table(pa.Table.from_pylist(old_rows, schema=old_schema),
                   tmp_path / "old" / "pairs-old.parquet")
    old = read_pairs(tmp_path / "old")
    assert old.shape == data.shape
    for side in ("a", "b"):
        for part in ("macro", "servers", "jobs", "actions"):
            np.testing.assert_array_equal(old.obs[side][part], data.obs[side][part])


def test_pair_dataset_reads_with_ray_data(tmp_path, ray_session):
    from cloudrl.data.pairs import pairs_dataset

    write_pairs(_rows(4), tmp_path, rows_per_file=3)
    ds = pairs_dataset(tmp_path)
    assert ds.count() == 4
    rows = sorted(ds.take_all(), key=lambda r: r["pair_id"])
    assert [r["label"] for r in rows] == [1.0, 0.0, 0.5, 1.0]
    assert len(rows[0]["a_servers"]) == (T + 1) * N * FS


def _write_raw(tmp_path, rows, name="bad.parquet"):
    table = pa.Table.from_pylist(rows, schema=PAIR_SCHEMA)
    path = tmp_path / name
    pq.write_table(table, path)
    return path


@pytest.mark.parametrize(("row", "column", "value", "message"), [
    (2, "label", 0.7, "is not 0, 0.5 or 1"),
    (1, "label", math.nan, "is not 0, 0.5 or 1"),
    (3, "source", "robot", "is not one of"),
    (0, "a_servers", "short", "expected obs_steps x n_servers x server_dim = 90"),
    (1, "b_actions", "short", "expected segment_length x action_dim = 8"),
    (2, "obs_steps", 6, "6 observations for 4 steps (expected T+1"),
    (2, "b_macro", "nan", "non-finite value"),
    (1, "a_actions", "negative", "negative action"),
    (3, "segment_length", 0, "0 < 1"),
    (2, "b_energy_kwh", math.inf, "use NaN for unknown"),
    (1, "pair_id", "p0", "duplicate of row 0"),
])
def test_malformed_row_names_file_row_and_field(tmp_path, row, column, value, message):
    rows = _rows(4)
    if value == "short":
        rows[row][column] = rows[row][column][:-1]
    elif value == "nan":
        rows[row][column] = rows[row][column].copy()
        rows[row][column][7] = np.nan
    elif value == "negative":
        rows[row][column] = rows[row][column].copy()
        rows[row][column][-1] = -1
    else:
        rows[row][column] = value
    path = _write_raw(tmp_path, rows)
    with pytest.raises(PairDataError) as err:
        read_pairs(tmp_path)
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(f"{path}: row {row}: field {column}: ")
    assert message in text
    # the writer refuses the same rows before anything is written
    with pytest.raises(PairDataError, match=f"row {row}: field {column}"):
        write_pairs(rows, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_soft_labels_only_when_allowed(tmp_path):
    rows = _rows(3)
    rows[1]["label"] = 0.8
    write_pairs(rows, tmp_path, soft_labels=True)
    assert read_pairs(tmp_path, soft_labels=True).label[1] == 0.8
    with pytest.raises(PairDataError, match="row 1: field label"):
        read_pairs(tmp_path)
    rows[1]["label"] = 1.2
    with pytest.raises(PairDataError, match=r"1.2 is not a probability in \[0, 1\]"):
        write_pairs(rows, tmp_path / "x", soft_labels=True)


def test_missing_column_and_mixed_shapes_are_errors(tmp_path):
    table = pa.Table.from_pylist(_rows(2), schema=PAIR_SCHEMA).drop_columns(["b_jobs"])
    pq.write_table(table, tmp_path / "a.parquet")
    with pytest.raises(PairDataError, match=r"a.parquet: schema: field b_jobs: missing column"):
        read_pairs(tmp_path)
    (tmp_path / "a.parquet").unlink()
    write_pairs(_rows(2), tmp_path, prefix="first")
    other = Segment(macro=np.zeros((T + 1, M)), servers=np.zeros((T + 1, N, FS)),
                    jobs=np.zeros((T + 1, K, FJ)), actions=np.zeros((T + 1, A), dtype=int))
    write_pairs([pair_row("q", "operator", 0.5, other, other)], tmp_path, prefix="second")
    with pytest.raises(PairDataError, match=r"second-.*: row 0: field segment_length: 5 differs"):
        read_pairs(tmp_path)
    for f in tmp_path.glob("second-*"):
        f.unlink()
    # state and transition segments do not mix in one dataset
    third = _rows(2, seed=1, obs=T)
    for r in third:
        r["pair_id"] = "state-" + r["pair_id"]
    write_pairs(third, tmp_path, prefix="third")
    with pytest.raises(PairDataError, match=r"third-.*: row 0: field obs_steps: 4 differs"):
        read_pairs(tmp_path)
    # two sides of one row must have the same number of observations
    rng = np.random.default_rng(0)
    with pytest.raises(PairDataError, match=r"row 0: field b_macro: 20 values, expected "
                                            r"obs_steps x macro_dim = 25"):
        write_pairs([pair_row("r", "teacher", 1.0, _segment(rng), _segment(rng, obs=T))],
                    tmp_path / "mixed")


def test_empty_directory_is_an_error(tmp_path):
    with pytest.raises(PairDataError, match="no .parquet files"):
        read_pairs(tmp_path)


@settings(max_examples=25, deadline=None)
@given(labels=st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=1, max_size=6),
       t=st.integers(1, 5))
def test_round_trip_property(tmp_path_factory, labels, t):
    rng = np.random.default_rng(len(labels) * 10 + t)
    rows = []
    for i, label in enumerate(labels):
        segs = [Segment(macro=rng.normal(size=(t, 2)), servers=rng.normal(size=(t, 3, 1)),
                        jobs=rng.normal(size=(t, 1, 2)), actions=rng.integers(0, 9, size=t))
                for _ in range(2)]
        rows.append(pair_row(f"id{i}", "operator", label, *segs))
    out = tmp_path_factory.mktemp("prop")
    write_pairs(rows, out)
    data = read_pairs(out)
    np.testing.assert_array_equal(data.label, labels)
    assert data.obs["a"]["actions"].shape == (len(labels), t, 1)
    for i, row in enumerate(rows):
        np.testing.assert_array_equal(data.obs["b"]["servers"][i].ravel(), row["b_servers"])


# ----------------------------------------------------------------------------- teacher




def _stats(v=0.0, o=0.0, f=0.5, e=1.0) -> dict:
    return {"sla_violations": v, "overload": o, "slowdown_spread": f, "energy_kwh": e}


def test_teacher_violations_decide_first_whatever_the_rest():
    teacher = Teacher()
    better_elsewhere = _stats(v=1, o=0, f=0.0, e=0.1)
    worse_elsewhere = _stats(v=0, o=9, f=3.0, e=9.0)
    assert teacher.compare(worse_elsewhere, better_elsewhere) == (1.0, "sla_violations")
    assert teacher.compare(better_elsewhere, worse_elsewhere) == (0.0, "sla_violations")
    # both above the bound 0: fewer violations wins
    assert teacher.compare(_stats(v=3), _stats(v=2)) == (0.0, "sla_violations")


def test_each_criterion_decides_when_the_earlier_ones_tie():
    teacher = Teacher()
    assert teacher.compare(_stats(v=2, o=1), _stats(v=2, o=4)) == (1.0, "overload")
    assert teacher.compare(_stats(o=0, f=0.9), _stats(o=0, f=0.2)) == (0.0, "slowdown_spread")
    # spreads within the 0.05 tolerance tie, energy decides
    assert teacher.compare(_stats(f=0.50, e=2.0), _stats(f=0.54, e=1.0)) == (0.0, "energy_kwh")
    assert teacher.compare(_stats(f=0.50, e=1.0), _stats(f=0.56, e=2.0)) == (1.0, "slowdown_spread")
    # energy within 1% ties: everything ties -> 0.5
    assert teacher.compare(_stats(e=1.000), _stats(e=1.009)) == (0.5, None)
    assert teacher.compare(_stats(e=1.000), _stats(e=1.02)) == (1.0, "energy_kwh")
    assert teacher.label(_stats(), _stats()) == 0.5


def test_bounds_tolerances_nan_and_order_are_configurable():
    cfg = TeacherConfig(sla_violations=Criterion(bound=2.0), overload=Criterion(tolerance=1.0))
    teacher = Teacher(cfg)
    # both within the violation bound: tie there, overload decides
    assert teacher.compare(_stats(v=0, o=5), _stats(v=2, o=0)) == (0.0, "overload")
    # one inside, one outside the bound
    assert teacher.compare(_stats(v=2, o=5), _stats(v=3, o=0)) == (1.0, "sla_violations")
    # overload differences up to 1 tie
    assert teacher.compare(_stats(o=2, f=0.0), _stats(o=3, f=1.0)) == (1.0, "slowdown_spread")
    # an unknown statistic is skipped
    assert teacher.compare(_stats(v=math.nan, e=1.0), _stats(v=5, e=2.0)) == (1.0, "energy_kwh")
    energy_first = Teacher(TeacherConfig(order=("energy_kwh", "sla_violations")))
    assert energy_first.compare(_stats(v=5, e=1.0), _stats(v=0, e=2.0)) == (1.0, "energy_kwh")
    with pytest.raises(ValueError, match="repeat"):
        TeacherConfig(order=("overload", "overload"))
    with pytest.raises(ValueError, match="label_noise"):
        TeacherConfig(label_noise=0.7)


def test_label_noise_flips_decided_labels_at_the_configured_rate():
    cfg = TeacherConfig(label_noise=0.2)
    a, b = _stats(v=0), _stats(v=1)
    teacher = Teacher(cfg, seed=7)
    labels = np.array([teacher.label(a, b) for _ in range(20_000)])
    assert set(np.unique(labels)) == {0.0, 1.0}
    flip_rate = float(np.mean(labels == 0.0))
    assert abs(flip_rate - 0.2) < 0.012, flip_rate   # 4 sigma at n=20000
    assert all(teacher.label(_stats(), _stats()) == 0.5 for _ in range(200))  # ties stay
    again = Teacher(cfg, seed=7)
    assert [again.label(a, b) for _ in range(50)] == labels[:50].tolist()
    assert all(Teacher(TeacherConfig(), seed=1).label(a, b) == 1.0 for _ in range(100))


def test_segment_statistics_default_to_the_teachers_settings():
    """Without a config the statistics use the teacher's defaults (the feedback export
    and the offline cost count overload as the teacher does)."""
    teacher = TeacherConfig()
    assert DefaultStats().overload_threshold == teacher.overload_threshold
    assert DefaultStats().fairness == teacher.fairness
    strict = TeacherConfig(overload_threshold=0.5, fairness="std")
    servers = np.zeros((3, 2, len(SERVER_COLS) + 1), dtype=np.float32)
    servers[..., S["mem_cap"]] = 1.0
    servers[..., S["mem_free"]] = 1.0
    servers[1:, 0, S["cpu_util"]] = 0.7  # over 0.5, under 0.9
    ep = EpisodeData(macro=np.zeros((3, 4), np.float32), servers=servers,
                     jobs=np.zeros((3, 2, len(JOB_COLS)), np.float32),
                     mask=np.ones((3, 7), np.float32), actions=np.full((2, 1), 6),
                     violations=np.zeros(2), energy_kwh=np.ones(2))
    assert segment_stats(ep, 0, 2)["overload"] == 0.0
    assert segment_stats(ep, 0, 2, strict)["overload"] == 2.0
    assert cut_segment(ep, 0, 2).stats == segment_stats(ep, 0, 2, DefaultStats())


def test_segment_statistics_on_hand_made_arrays():
    n, k, t = 3, 2, 4
    fs, fj = len(SERVER_COLS) + 1, len(JOB_COLS)
    servers = np.zeros((t + 1, n, fs), dtype=np.float32)
    servers[..., S["mem_cap"]] = 1.0
    servers[..., S["mem_free"]] = 1.0
    servers[1, 0, S["cpu_util"]] = 0.95          # overloaded by CPU
    servers[2, 1, S["mem_free"]] = 0.05          # overloaded by memory (0.95 used)
    servers[3, 2, S["cpu_util"]] = 0.90          # exactly at the threshold: not over
    servers[0, 0, S["cpu_util"]] = 1.0           # before the segment's first action
    assert overload_count(servers[1:], 0.9) == 2
    jobs = np.zeros((t + 1, k, fj), dtype=np.float32)
    jobs[:, :, J["present"]] = 1.0
    jobs[:, :, J["duration"]] = 0.10
    jobs[0, 1, J["age"]] = 0.10   # slot 1 at step 0: slowdown 2
    jobs[2, 0, J["age"]] = 0.30   # slot 0 at step 2: slowdown 4
    mask = np.ones((t + 1, k * n + n + 1), dtype=np.float32)
    mask[3, 0 * n + 1] = 0.0      # step 3's placement is masked: nothing starts
    wait = k * n + n
    actions = np.array([[1 * n + 2], [wait], [0 * n + 0], [0 * n + 1]])
    np.testing.assert_allclose(placement_slowdowns(jobs[:t], mask[:t], actions, n), [2.0, 4.0])
    # branching: slot 0 -> server 1, slot 1 -> defer (n)
    bmask = np.ones((t, k * (n + 1) + 3 + 2), dtype=np.float32)
    bactions = np.array([[1, n, 1, 0], [n, n, 1, 0], [2, 0, 1, 0], [n, n, 1, 0]])
    np.testing.assert_allclose(placement_slowdowns(jobs[:t], bmask, bactions, n),
                               [1.0, 4.0, 1.0])
    assert spread(np.array([1.0, 1.0, 1.0, 5.0]), "std") == pytest.approx(np.std([1, 1, 1, 5]))
    assert spread(np.linspace(1, 2, 11)) == pytest.approx(0.8)
    assert spread(np.array([3.0])) == 0.0
    ep = EpisodeData(macro=np.zeros((t + 1, 2), np.float32), servers=servers, jobs=jobs,
                     mask=mask, actions=actions, violations=np.array([0, 2, 1, 0.0]),
                     energy_kwh=np.array([0.5, 0.25, 0.25, 1.0]), episode_seed=3,
                     policy="hand")
    stats = segment_stats(ep, 0, t, TeacherConfig())
    assert stats == {"sla_violations": 3.0, "overload": 2.0, "slowdown_spread":
                     pytest.approx(1.6), "energy_kwh": 2.0}
    seg = cut_segment(ep, 1, 2, TeacherConfig())
    assert seg.start == 1 and seg.length == 2 and seg.episode_seed == 3
    assert seg.stats["sla_violations"] == 3.0 and seg.stats["energy_kwh"] == 0.5
    assert seg.stats["overload"] == 1.0   # obs 2..3: the memory-overloaded server
    # a transition segment: the observation before its first action, then one per step
    assert seg.obs_steps == 3
    np.testing.assert_array_equal(seg.servers, ep.servers[1:4])
    np.testing.assert_array_equal(seg.jobs, ep.jobs[1:4])
    np.testing.assert_array_equal(seg.actions, ep.actions[1:3])
    with pytest.raises(ValueError, match="outside the episode"):
        cut_segment(ep, 2, 3, TeacherConfig())


# ----------------------------------------------------------------------------- recording


SMALL_ENV = {"n_servers": 5, "sim": {"episode_length": 50}}

@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    out = tmp_path_factory.mktemp("demos")
    summaries = [record_episodes(policy, out, env_config=SMALL_ENV, episodes=2)
                 for policy in ("power_aware", "round_robin")]
    return out, summaries


def test_recorded_episodes_keep_observations_actions_and_infos(demos):
    out, summaries = demos
    assert [s.seeds for s in summaries] == [[0, 1], [0, 1]]   # the first train seeds
    episodes = read_episodes(out)
    assert len(episodes) == 4
    by_key = {(e.custom_data["policy"], e.custom_data["episode_seed"]): e for e in episodes}
    ep = by_key[("power_aware", 1)]
    assert len(ep) == 50 and ep.is_truncated and not ep.is_numpy
    # replay the same policy on the same seed: the same observations, actions and infos
    from cloudrl.heuristics import make_heuristic

    env, policy = make_env(SMALL_ENV, "flat"), make_heuristic("power_aware")
    policy.reset()
    obs, _ = env.reset(seed=1)
    total_violations = 0
    for t in range(50):
        np.testing.assert_array_equal(ep.get_observations(t)["servers"], obs["servers"])
        action = policy.act(obs)
        assert ep.get_actions(t) == action
        obs, reward, _, _, info = env.step(action)
        assert ep.get_rewards(t) == reward
        assert ep.get_infos(t + 1)["energy_kwh"] == info["energy_kwh"]
        total_violations += info["violations"]
    assert sum(ep.get_infos(t)["violations"] for t in range(1, 51)) == total_violations
    assert ep.get_return() == pytest.approx(summaries[0].returns[1])


def test_recording_refuses_test_seeds_and_unknown_policies(tmp_path):
    with pytest.raises(ValueError, match="not a train seed"):
        record_episodes("ffd", tmp_path, env_config=SMALL_ENV, seeds=[1_000_000])
    with pytest.raises(ValueError, match="neither a heuristic"):
        record_episodes("nosuch", tmp_path, env_config=SMALL_ENV)


def test_rllib_offline_reader_reads_recorded_episodes(demos, ray_session):
    """RLlib's own reader path: OfflineData (ray.data.read_parquet) -> OfflinePreLearner,
    which unpacks the episodes (msgpack + msgpack_numpy) and runs the learner connector."""
    from ray.rllib.algorithms.bc import BCConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.rllib.offline.offline_data import OfflineData
    from ray.rllib.offline.offline_prelearner import OfflinePreLearner

    from models.masked_ppo import MaskedPPOTorchRLModule

    out, _ = demos
    env = make_env(SMALL_ENV, "flat")
    spaces = (env.observation_space, env.action_space)
    cfg = (BCConfig().environment(observation_space=spaces[0], action_space=spaces[1])
           .offline_data(input_=[str(out)], input_read_episodes=True)
           .training(train_batch_size_per_learner=64)
           .rl_module(rl_module_spec=RLModuleSpec(module_class=MaskedPPOTorchRLModule)))
    data = OfflineData(cfg)
    assert data.data.count() == 4
    items = data.data.take_batch(4)
    module_spec = cfg.get_multi_rl_module_spec(spaces={"default_policy": spaces})
    batch = OfflinePreLearner(config=cfg, spaces=spaces, module_spec=module_spec)(items)
    obs_servers = batch["default_policy/obs/servers"].numpy()
    actions = batch["default_policy/actions"].numpy()
    assert obs_servers.shape == (64, 5, env.observation_space["servers"].shape[1])
    # every sampled (observation, action) is a recorded step
    recorded = {}
    for ep in read_episodes(out):
        for t in range(len(ep)):
            recorded.setdefault(ep.get_observations(t)["servers"].tobytes(), set()).add(
                int(ep.get_actions(t)))
    for servers, action in zip(obs_servers, actions, strict=True):
        assert int(action) in recorded[servers.astype(np.float32).tobytes()]


# ----------------------------------------------------------------------------- operator pairs


def _trajectory(env_config, seed: int, steps: int, policy_name: str = "power_aware"):
    """An inline trajectory body (states as the service receives them) and the env's obs."""
    from cloudrl.heuristics import make_heuristic
    from serve_apps.state import state_of

    env, policy = make_env(env_config, "flat"), make_heuristic(policy_name)
    obs, _ = env.reset(seed=seed)
    policy.reset()
    body, observations, actions = [], [], []
    for _ in range(steps):
        action = int(policy.act(obs))
        body.append({"state": state_of(env.sim), "action": action})
        observations.append(obs)
        actions.append(action)
        obs, *_ = env.step(action)
    return {"steps": body}, observations, actions


def _post_equivalent(db, body: dict) -> None:
    """What POST /v1/feedback does with a body: validate, dump, store (serve_apps.app)."""
    from cloudrl.feedback import FeedbackStore
    from serve_apps.schemas import FeedbackRequest

    request = FeedbackRequest.model_validate(body)
    store = FeedbackStore(db)
    store.add_pairs([p.model_dump(mode="json", exclude_none=True) for p in request.pairs],
                    policy_version="v1")
    store.close()


def test_feedback_store_pairs_round_trip_into_the_pair_dataset(tmp_path, capsys):
    from cloudrl.cli import main
    from cloudrl.feedback import export_pairs

    seg_t = 6
    traj_a, obs_a, act_a = _trajectory(SMALL_ENV, 0, 8)            # longer: first 6 kept
    traj_b, obs_b, act_b = _trajectory(SMALL_ENV, 1, 4, "ffd")      # shorter: padded
    # (transition segments: 6 steps, 7 states; A's first 7 states, B's 4 edge-padded)
    traj_c, obs_c, _ = _trajectory(SMALL_ENV, 2, 6, "round_robin")
    other_fleet, _, _ = _trajectory({"n_servers": 7}, 3, 3)
    db = tmp_path / "state.db"
    _post_equivalent(db, {"pairs": [
        {"a": {"trajectory": traj_a}, "b": {"trajectory": traj_b}, "preferred": "a"},
        {"a": {"trajectory": traj_b}, "b": {"trajectory": traj_c}, "preferred": "equal"},
        {"a": {"trajectory_id": "episode-9"}, "b": {"trajectory": traj_a}, "preferred": "a"},
        {"a": {"trajectory": traj_c}, "b": {"trajectory": traj_a}, "preferred": "b"},
        {"a": {"trajectory": other_fleet}, "b": {"trajectory": traj_a}, "preferred": "a"},
    ]})
    result = export_pairs(db, tmp_path / "pairs", env_config=SMALL_ENV, segment_length=seg_t)
    assert result.written == 3
    assert result.skipped == {"trajectory_id": 1, "mismatch": 1}
    assert "servers: 7 servers given" in result.first_skip["mismatch"]
    data = read_pairs(tmp_path / "pairs")
    assert data.shape["segment_length"] == seg_t and data.shape["n_servers"] == 5
    assert data.shape["obs_steps"] == seg_t + 1
    assert set(data.meta["source"]) == {"operator"}

    def row_of(obs_list) -> list[int]:
        first = obs_list[0]["macro"]
        return [i for i in range(len(data)) if np.allclose(data.obs["a"]["macro"][i, 0], first,
                                                           atol=1e-6)]

    # "a" preferred -> 1.0, with A's first 6 steps on side a, B edge-padded on side b
    (i,) = [i for i in row_of(obs_a) if np.allclose(data.obs["b"]["macro"][i, 0],
                                                    obs_b[0]["macro"], atol=1e-6)]
    assert data.label[i] == 1.0
    for t in range(seg_t + 1):
        np.testing.assert_allclose(data.obs["a"]["servers"][i, t], obs_a[t]["servers"],
                                   atol=1e-5)
        np.testing.assert_allclose(data.obs["a"]["macro"][i, t], obs_a[t]["macro"], atol=1e-5)
        np.testing.assert_allclose(data.obs["b"]["jobs"][i, t], obs_b[min(t, 3)]["jobs"],
                                   atol=1e-5)
    assert data.obs["a"]["actions"][i, :, 0].tolist() == act_a[:seg_t]
    assert data.obs["b"]["actions"][i, :, 0].tolist() == act_b + [act_b[-1]] * 2
    assert np.isnan(data.meta["a_sla_violations"][i]) and np.isnan(data.meta["a_energy_kwh"][i])
    assert data.meta["a_overload"][i] >= 0 and data.meta["a_policy"][i] == "v1"
    # "b" preferred (C vs A) is stored as A preferred to C -> 1.0 with A on side a
    (j,) = [j for j in row_of(obs_a) if j != i]
    np.testing.assert_allclose(data.obs["b"]["macro"][j, 0], obs_c[0]["macro"], atol=1e-6)
    assert data.label[j] == 1.0
    # "equal" -> 0.5
    (k,) = [k for k in range(len(data)) if k not in (i, j)]
    assert data.label[k] == 0.5
    # the CLI does the same, and counts what it skipped
    assert main(["align", "operator-pairs", "--db", str(db), "--out", str(tmp_path / "cli"),
                 "--n-servers", "5", "--episode-length", "50", "--segment-length", "6"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["pairs"] == 3 and printed["skipped"] == {"trajectory_id": 1, "mismatch": 1}
    assert printed["labels"] == {"0.5": 1, "1.0": 2}
    # exporting twice gives the same pair ids (content-addressed)
    assert sorted(read_pairs(tmp_path / "cli").meta["pair_id"]) == sorted(data.meta["pair_id"])
    # and `cloudrl feedback export --format pairs` is the same command
    assert main(["feedback", "export", "--format", "pairs", "--db", str(db), "--out",
                 str(tmp_path / "fb"), "--n-servers", "5", "--segment-length", "6"]) == 0
    assert json.loads(capsys.readouterr().out)["pairs"] == 3
    np.testing.assert_array_equal(read_pairs(tmp_path / "fb").obs["a"]["jobs"],
                                  read_pairs(tmp_path / "cli").obs["a"]["jobs"])


# ----------------------------------------------------------------------------- CLI end to end


def test_cli_record_then_pairs_end_to_end(tmp_path, capsys):
    from cloudrl.cli import main

    demos, pairs = tmp_path / "demos", tmp_path / "pairs"
    assert main(["align", "record", "--policy", "power_aware", "--policy", "round_robin",
                 "--episodes", "2", "--n-servers", "5", "--episode-length", "50",
                 "--out", str(demos)]) == 0
    recorded = json.loads(capsys.readouterr().out)["recorded"]
    assert [(r["policy"], r["episodes"], r["env_steps"]) for r in recorded] == [
        ("power_aware", 2, 100), ("round_robin", 2, 100)]
    assert main(["align", "pairs", "--episodes", str(demos), "--n-pairs", "60",
                 "--segment-length", "10", "--seed", "3", "--out", str(pairs)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["pairs"] == 60 and sum(summary["labels"].values()) == 60
    data = read_pairs(pairs)
    assert len(data) == 60 and data.shape["segment_length"] == 10
    assert data.obs["a"]["servers"].shape == (60, 11, 5, len(SERVER_COLS) + 3)
    assert data.obs["a"]["actions"].shape == (60, 10, 1) and data.transitions
    # labels are the teacher's on the stored statistics (no noise by default)
    teacher = Teacher(TeacherConfig())
    stats = [{k: data.meta[f"{s}_{k}"] for k in ("sla_violations", "overload",
                                                   "slowdown_spread", "energy_kwh")}
             for s in ("a", "b")]
    expected = [teacher.compare({k: v[i] for k, v in stats[0].items()},
                                {k: v[i] for k, v in stats[1].items()})[0]
                for i in range(60)]
    np.testing.assert_array_equal(data.label, expected)
    assert set(data.meta["a_policy"]) <= {"power_aware", "round_robin"}
    assert set(data.meta["a_episode_seed"]) <= {0, 1}
    # the stored statistics are the segments' own: recompute one from the episodes
    from cloudrl.data.segments import load_episode_data

    eps = {(e.policy, e.episode_seed): e for e in load_episode_data(demos)}
    ep = eps[(data.meta["b_policy"][0], int(data.meta["b_episode_seed"][0]))]
    start = int(data.meta["b_start"][0])
    np.testing.assert_array_equal(data.obs["b"]["macro"][0], ep.macro[start:start + 11])
    np.testing.assert_array_equal(data.obs["b"]["actions"][0], ep.actions[start:start + 10])
    assert segment_stats(ep, start, 10, TeacherConfig())["energy_kwh"] == pytest.approx(
        data.meta["b_energy_kwh"][0])
    # same seed, same dataset
    assert main(["align", "pairs", "--episodes", str(demos), "--n-pairs", "60",
                 "--segment-length", "10", "--seed", "3", "--out", str(tmp_path / "again")]) == 0
    np.testing.assert_array_equal(read_pairs(tmp_path / "again").label, data.label)


@pytest.mark.parametrize(("argv", "message"), [
    (["align", "record", "--policy", "nosuch", "--out", "{tmp}/d"],
     "record.policies: nosuch: policy 'nosuch' is neither a heuristic"),
    (["align", "pairs", "--episodes", "{tmp}/missing", "--out", "{tmp}/p"],
     "no such file or directory"),
    (["align", "pairs", "--episodes", "{demos}", "--segment-length", "51", "--out", "{tmp}/p"],
     "segment_length 51 is longer than every episode"),
    (["align", "pairs", "--config", "{tmp}/bad.yaml", "--episodes", "{demos}"],
     "teacher.label_noise"),
    (["align", "operator-pairs", "--db", "{tmp}/none.db", "--out", "{tmp}/o"],
     "does not exist"),
    (["align", "record", "--episodes", "0"], "0 is not >= 1"),
])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, demos, capsys, argv, message):
    from cloudrl.cli import main

    (tmp_path / "bad.yaml").write_text("teacher:\n  label_noise: 0.9\n")
    args = [a.format(tmp=tmp_path, demos=demos[0]) for a in argv]
    try:
        code = main(args)
    except SystemExit as e:  # argparse's own usage errors
        code = e.code
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert "\n" not in err and message in err, err


@pytest.mark.slow  # ~20 s: trains a tiny PPO checkpoint first
def test_records_a_trained_checkpoint_on_its_own_env(tmp_path, ray_session):
    from cloudrl.checkpoint_policy import CheckpointPolicy
    from cloudrl.cli import main

    ckpt = tmp_path / "ppo"
    tiny = {"train_batch_size_per_learner": 64, "minibatch_size": 32, "num_epochs": 1}
    assert main(["train", "--algo", "ppo", "--n-servers", "5", "--episode-length", "50",
                 "--env-steps", "64", "--hparams", json.dumps(tiny), "--out", str(ckpt)]) == 0
    summary = record_episodes(str(ckpt), tmp_path / "demos", episodes=1, seeds=[4])
    assert summary.policy.startswith("ppo:") and summary.seeds == [4]
    (ep,) = read_episodes(tmp_path / "demos")
    assert len(ep) == 50 and ep.custom_data["policy"] == summary.policy
    # the checkpoint's own (sampling, reseeded) policy replays the same actions
    policy, env = CheckpointPolicy(ckpt), make_env({"n_servers": 5,
                                                    "sim": {"episode_length": 50}}, "flat")
    policy.reset()
    obs, _ = env.reset(seed=4)
    for t in range(50):
        action = policy.act(obs)
        assert ep.get_actions(t) == action and ep.get_observations(t)["action_mask"][action] > 0
        obs, *_ = env.step(action)
