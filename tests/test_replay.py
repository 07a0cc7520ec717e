"""Device-resident prioritized replay: ring order, priorities, weights, n-step, state."""

from __future__ import annotations

import io
import weakref
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from cloudrl.replay import DeviceReplayBuffer, PriorityTrees, ReplayConfig, non_blocking_copy

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
SPEC = {"x": ((2,), np.float32), "action_mask": ((3,), np.float32)}
CHI2_DF7_P001 = 24.32  # chi-square critical value, 7 degrees of freedom, p = 0.001


def rows(ids: list[float], **cols: list) -> dict:
    """Single-step rows whose obs encode the row id (next_obs = id + 0.5)."""
    ids_arr = np.asarray(ids, dtype=np.float32)
    n = len(ids)
    batch = {
        "obs": {"x": np.stack([ids_arr, -ids_arr], 1),
                "action_mask": np.ones((n, 3), np.float32)},
        "next_obs": {"x": np.stack([ids_arr + 0.5, -ids_arr], 1),
                     "action_mask": np.ones((n, 3), np.float32)},
        "action": np.arange(n, dtype=np.int64),
        "reward": ids_arr.copy(),
        "terminated": np.zeros(n, bool),
    }
    batch.update({k: np.asarray(v) for k, v in cols.items()})
    return batch


def buffer(device: str = "cpu", **kw: float) -> DeviceReplayBuffer:
    return DeviceReplayBuffer(ReplayConfig(device=device, **kw), SPEC)


def stored(buf: DeviceReplayBuffer, start: int, stop: int) -> dict:
    return buf.transitions(torch.arange(start, stop))


def counts(buf: DeviceReplayBuffer, draws: int, seed: int = 0, batch: int = 1000) -> np.ndarray:
    gen = torch.Generator(device=buf.device).manual_seed(seed)
    out = np.zeros(buf.config.capacity)
    for _ in range(draws // batch):
        idx = buf.sample(batch, generator=gen)["indices"].cpu().numpy()
        out += np.bincount(idx, minlength=buf.config.capacity)
    return out


def chi2(observed: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * observed.sum()
    return float(((observed - expected) ** 2 / expected).sum())


def test_ring_buffer_evicts_oldest_first() -> None:
    buf = buffer(capacity=4)
    for i in range(6):
        buf.add(rows([float(i)]))
    state = buf.state_dict()
    assert len(buf) == 4
    assert state["reward"][:4].tolist() == [4.0, 5.0, 2.0, 3.0]
    assert stored(buf, 0, 4)["obs"]["x"][:, 0].tolist() == [4.0, 5.0, 2.0, 3.0]
    assert int(state["ptr"]) == 2
    buf.add(rows([6.0, 7.0, 8.0]))  # one batch wraps around the end
    assert stored(buf, 0, 4)["rewards"].tolist() == [8.0, 5.0, 6.0, 7.0]


@pytest.mark.parametrize("device", DEVICES)
def test_sampling_frequencies_follow_priorities(device: str) -> None:
    buf = buffer(device, capacity=8, alpha=1.0, eps=0.0)
    buf.add(rows([float(i) for i in range(8)]))
    td = torch.arange(1.0, 9.0, device=device)
    buf.update_priorities(torch.arange(8, device=device), td)
    probs = np.arange(1.0, 9.0) / 36.0
    observed = counts(buf, 20_000)
    assert chi2(observed, probs) < CHI2_DF7_P001
    # The test has power: a uniform sampler (and uniform expectations) are rejected.
    assert chi2(observed, np.full(8, 1 / 8)) > 100 * CHI2_DF7_P001
    uniform = np.bincount(np.random.default_rng(0).integers(0, 8, 20_000), minlength=8)
    assert chi2(uniform.astype(float), probs) > 10 * CHI2_DF7_P001


def test_priority_update_changes_frequencies() -> None:
    buf = buffer(capacity=8, alpha=0.5, eps=1e-6)
    buf.add(rows([float(i) for i in range(8)]))
    before = counts(buf, 8_000)
    assert chi2(before, np.full(8, 1 / 8)) < CHI2_DF7_P001  # new rows share max priority
    buf.update_priorities(torch.tensor([0, 1]), torch.tensor([48.0, 0.0]))
    prio = np.array([(48 + 1e-6) ** 0.5, 1e-6 ** 0.5] + [1.0] * 6)
    after = counts(buf, 20_000, seed=1)
    assert chi2(after, prio / prio.sum()) < CHI2_DF7_P001
    assert after[0] / 20_000 > 3 * before[0] / 8_000 and after[1] < 20
    # new transitions get the current max priority, sqrt(48 + eps)
    buf.add(rows([9.0]))
    assert buf.priorities()[0].item() == pytest.approx(prio[0])


def test_importance_weights_match_formula() -> None:
    buf = buffer(capacity=4, alpha=0.7, beta=0.4, eps=0.01)
    buf.add(rows([0.0, 1.0, 2.0]))
    td = torch.tensor([0.5, 2.0, 0.1])
    buf.update_priorities(torch.arange(3), td)
    gen = torch.Generator().manual_seed(3)
    for beta in (0.4, 1.0):
        buf.set_beta(beta)
        out = buf.sample(64, generator=gen)
        p = (td.double().numpy() + 0.01) ** 0.7
        prob, n = p / p.sum(), 3
        w = (n * prob) ** -beta / ((n * prob.min()) ** -beta)
        np.testing.assert_allclose(out["weights"].numpy(), w[out["indices"].numpy()], rtol=1e-6)
        assert set(out["indices"].tolist()) <= {0, 1, 2}


@pytest.mark.parametrize("device", DEVICES)
def test_n_step_with_episode_end_and_two_interleaved_streams(device: str) -> None:
    buf = buffer(device, capacity=16, n_step=3, gamma=0.5, num_streams=2)
    # stream 0: a0..a5 (ids 0..5) terminated at a2 and a5; stream 1: b0..b3 (10..13),
    # truncated at b3. Rewards equal the ids; the rows interleave across calls.
    buf.add(rows([0, 10, 1, 11, 2], stream_id=[0, 1, 0, 1, 0],
                 terminated=[0, 0, 0, 0, 1]))
    state = buf.state_dict()
    assert len(buf) == 3  # a0, a1, a2 complete (episode end at a2); b0, b1 pending
    assert state["reward"][:3].tolist() == [0 + 0.5 * 1 + 0.25 * 2, 1 + 0.5 * 2, 2.0]
    assert state["discount"][:3].tolist() == [0.125, 0.25, 0.5]
    assert state["done"][:3].tolist() == [1.0, 1.0, 1.0]
    assert stored(buf, 0, 3)["next_obs"]["x"][:, 0].tolist() == [2.5, 2.5, 2.5]
    buf.add(rows([12, 3, 13, 4], stream_id=[1, 0, 1, 0], terminated=[0, 0, 0, 0],
                 truncated=[0, 0, 1, 0]))
    state = buf.state_dict()
    assert len(buf) == 7  # b0..b3 complete (truncation at b3); a3, a4 pending
    assert stored(buf, 3, 7)["obs"]["x"][:, 0].tolist() == [10, 11, 12, 13]
    assert state["reward"][3:7].tolist() == [
        10 + 0.5 * 11 + 0.25 * 12, 11 + 0.5 * 12 + 0.25 * 13, 12 + 0.5 * 13, 13.0]
    assert state["discount"][3:7].tolist() == [0.125, 0.125, 0.25, 0.5]
    assert state["done"][3:7].tolist() == [0.0] * 4  # truncation bootstraps
    assert stored(buf, 3, 7)["next_obs"]["x"][:, 0].tolist() == [12.5, 13.5, 13.5, 13.5]
    buf.add(rows([5], stream_id=[0], terminated=[1]))
    state = buf.state_dict()
    assert len(buf) == 10
    assert stored(buf, 7, 10)["obs"]["x"][:, 0].tolist() == [3, 4, 5]
    assert state["reward"][7:10].tolist() == [3 + 0.5 * 4 + 0.25 * 5, 4 + 0.5 * 5, 5.0]
    assert state["discount"][7:10].tolist() == [0.125, 0.25, 0.5]
    assert state["done"][7:10].tolist() == [1.0] * 3
    assert stored(buf, 7, 10)["next_obs"]["x"][:, 0].tolist() == [5.5] * 3
    assert state["action"][:10].tolist() == [0, 2, 4, 1, 3, 0, 2, 1, 3, 0]


def test_n_step_single_stream_window_slides() -> None:
    buf = buffer(capacity=16, n_step=2, gamma=0.9)
    buf.add(rows([1, 2, 3]))
    state = buf.state_dict()
    assert len(buf) == 2
    np.testing.assert_allclose(state["reward"][:2].numpy(), [1 + 0.9 * 2, 2 + 0.9 * 3])
    np.testing.assert_allclose(state["discount"][:2].numpy(), [0.81, 0.81])
    assert stored(buf, 0, 2)["next_obs"]["x"][:, 0].tolist() == [2.5, 3.5]


@pytest.mark.parametrize("device", DEVICES)
def test_dict_obs_mask_and_branching_actions_round_trip(device: str) -> None:
    space = spaces.Dict({
        "macro": spaces.Box(-1, 1, (5,), np.float32),
        "servers": spaces.Box(-1, 1, (4, 3), np.float32),
        "action_mask": spaces.Box(0, 1, (7,), np.float32),
        "counts": spaces.Box(0, 9, (2,), np.int64),  # a second dtype group
    })
    buf = DeviceReplayBuffer(ReplayConfig(capacity=32, device=device), space,
                             action_shape=(3,), action_dtype=np.int64)
    rng = np.random.default_rng(0)
    n = 20
    obs = {k: rng.standard_normal((n, *s.shape)).astype(np.float32)
           for k, s in space.spaces.items()}
    obs["action_mask"] = (rng.random((n, 7)) < 0.5).astype(np.float32)
    obs["counts"] = rng.integers(0, 9, (n, 2))
    nxt = {k: v + 1 for k, v in obs.items()}
    actions = rng.integers(0, 5, (n, 3))
    buf.add({"obs": obs, "next_obs": nxt, "action": actions,
             "reward": rng.random(n), "terminated": rng.random(n) < 0.2})
    out = buf.sample(64, generator=torch.Generator(device=device).manual_seed(0))
    idx = out["indices"].cpu().numpy()
    for k in obs:
        assert out["obs"][k].dtype == (torch.int64 if k == "counts" else torch.float32)
        np.testing.assert_array_equal(out["obs"][k].cpu().numpy(), obs[k][idx])
        np.testing.assert_array_equal(out["next_obs"][k].cpu().numpy(), nxt[k][idx])
    np.testing.assert_array_equal(out["actions"].cpu().numpy(), actions[idx])
    for value in [*out["obs"].values(), *out["next_obs"].values()] + [
            v for k, v in out.items() if isinstance(v, torch.Tensor)]:
        assert value.device.type == torch.device(device).type
    for value in buf.state_dict().values():
        for tensor in value.values() if isinstance(value, dict) else [value]:
            if isinstance(tensor, dict):
                assert all(t.device.type == torch.device(device).type for t in tensor.values())
            elif isinstance(tensor, torch.Tensor):
                assert tensor.device.type == torch.device(device).type


@pytest.mark.parametrize("device", DEVICES)
def test_state_dict_round_trip_gives_identical_samples(device: str) -> None:
    kw = {"capacity": 8, "n_step": 2, "num_streams": 2, "gamma": 0.9}
    src = buffer(device, **kw)
    src.add(rows([float(i) for i in range(11)], stream_id=[i % 2 for i in range(11)]))
    src.update_priorities(torch.tensor([1, 4], device=device), torch.tensor([3.0, 0.2]))
    src.set_beta(0.7)
    blob = io.BytesIO()
    torch.save(src.state_dict(), blob)
    blob.seek(0)
    dst = buffer(device, **kw)
    dst.load_state_dict(torch.load(blob))
    assert len(dst) == len(src) == 8 and dst.beta == 0.7
    for buf in (src, dst):  # pending windows were restored too
        buf.add(rows([11.0, 12.0], stream_id=[1, 0], terminated=[1, 1]))
    samples = [b.sample(256, generator=torch.Generator(device=device).manual_seed(5))
               for b in (src, dst)]
    for key in ("actions", "rewards", "dones", "discounts", "weights", "indices"):
        assert torch.equal(samples[0][key], samples[1][key])
    assert torch.equal(samples[0]["next_obs"]["x"], samples[1]["next_obs"]["x"])


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([2, 3, 32]), st.integers(1, 40).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.lists(st.tuples(st.integers(0, n - 1),
                                            st.just(0.0) | st.floats(1e-3, 1e3)),
                                  min_size=1, max_size=10),
                         min_size=1, max_size=6))))
def test_trees_track_sum_and_min_of_leaves(fanout: int, case: tuple[int, list]) -> None:
    n, updates = case
    trees = PriorityTrees(n, torch.device("cpu"), fanout=fanout)
    leaves = np.zeros(n)
    for update in updates:
        idx = dict(update)  # one value per index in a batch (duplicates: one wins)
        trees.set(torch.tensor(list(idx)), torch.tensor(list(idx.values()), dtype=torch.float64))
        for i, v in idx.items():
            leaves[i] = v
        assert trees.total.item() == pytest.approx(leaves.sum(), rel=1e-9, abs=1e-9)
        positive = leaves[leaves > 0]
        expected_min = positive.min() if positive.size else float("inf")
        assert trees.minimum.item() == expected_min
        # descending with each leaf's prefix mass (midpoint) lands on that leaf
        nonzero = np.flatnonzero(leaves > 0)
        mid = torch.tensor(np.cumsum(leaves)[nonzero] - leaves[nonzero] / 2)
        assert trees.find(mid).tolist() == nonzero.tolist()


def on_device(batch: dict, device: str) -> dict:
    return {k: ({kk: torch.as_tensor(vv, device=device) for kk, vv in v.items()}
                if isinstance(v, dict) else torch.as_tensor(v, device=device))
            for k, v in batch.items()}


aten = torch.ops.aten
# Python data turned into a tensor (torch.tensor(...), ``t[i] = 0.0`` on the host path)
LIFTS = {aten.lift_fresh.default, aten.lift_fresh_copy.default}
# ops that make a 0-d tensor from a Python scalar; harmless feeding torch.where, but a
# write of one into a CUDA tensor (``t[i] = False``) is a host-to-device copy
SCALARS = LIFTS | {aten.scalar_tensor.default}
WRITES = {aten.copy_.default, aten.fill_.Tensor, aten.index_put_.default,
          aten.masked_fill_.Tensor, aten.index_fill_.int_Tensor}


class HostRoundTrips(TorchDispatchMode):
    """Records the aten ops that sync a CUDA stream with the host or write a host scalar.

    ``_local_scalar_dense`` is ``.item()``/``bool()``/``int()`` of a tensor: on CUDA the
    host waits for the device. A lifted Python value, or a write whose source is a 0-d
    tensor freshly made from a Python scalar, is a host-to-device copy on CUDA.
    """

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []
        self._fresh: dict[int, weakref.ref] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is aten._local_scalar_dense.default:
            self.found.append("a tensor value read back to the host (item/bool/int)")
        elif func in LIFTS:
            self.found.append(f"Python data lifted into a tensor ({func})")
        elif func in WRITES:
            for src in (*args[1:], *kwargs.values()):
                ref = self._fresh.get(id(src))
                if ref is not None and ref() is src:
                    self.found.append(f"a Python scalar written into a tensor ({func})")
        out = func(*args, **kwargs)
        if func in SCALARS and isinstance(out, torch.Tensor):
            self._fresh[id(out)] = weakref.ref(out)
        return out


def test_host_round_trip_recorder_catches_what_it_must() -> None:
    """Positive controls: each kind of host round trip is reported, device-side fills are not."""
    pend = torch.zeros(5, dtype=torch.bool)
    for sync, expected in ((lambda: pend[-1].item(), "read back"),
                           (lambda: bool(pend.any()), "read back"),
                           (lambda: pend.__setitem__(-1, False), "Python"),
                           (lambda: torch.tensor(3.0) + 1, "lifted")):
        with HostRoundTrips() as rec:
            sync()
        assert rec.found and expected in rec.found[0]
    with HostRoundTrips() as rec:
        pend[-1:].zero_()
        pend.narrow(0, 0, 2).fill_(True)
        torch.where(pend, torch.ones(5), 0.0)
    assert rec.found == []


def test_add_sample_update_never_round_trip_through_the_host() -> None:
    """The CPU stand-in for the CUDA no-sync test below (which needs a GPU)."""
    buf = buffer(capacity=64, n_step=3, num_streams=2)
    batches = [on_device(rows([float(i) for i in range(j, j + 8)],
                              stream_id=[i % 2 for i in range(8)],
                              terminated=[i == 5 for i in range(8)]), "cpu") for j in (0, 8)]
    gen, dropped = torch.Generator().manual_seed(0), torch.tensor([1])
    with HostRoundTrips() as rec:
        for batch in batches:  # the second call completes rows held over from the first
            buf.add(batch)
        out = buf.sample(32, generator=gen)
        buf.update_priorities(out["indices"], out["rewards"])
        buf.discard_pending(dropped)
        buf.insert({k: v for k, v in out.items() if k not in ("weights", "indices")},
                   td_abs=out["rewards"])
    assert rec.found == []
    # first call: stream 0 stores rows 0, 2 (holds 4, 6), stream 1 stores 1, 3, 5 (episode
    # end; holds 7); second call: 4, 6, 8, 10 and 7, 9, 11, 13; then the 32 inserted
    assert len(buf) == 5 + 8 + 32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_add_sample_update_do_not_sync_with_host() -> None:
    buf = buffer("cuda", capacity=64, n_step=3, num_streams=2)
    batch = on_device(rows([float(i) for i in range(16)],
                           stream_id=[i % 2 for i in range(16)]), "cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        # positive controls: the mode does raise on a sync, scalar writes included
        with pytest.raises(RuntimeError, match="synchroniz"):
            bool(buf.state_dict()["size"] == 0)
        with pytest.raises(RuntimeError, match="synchroniz"):
            buf.state_dict()["pending"]["valid"][-1] = False
        buf.add(batch)
        buf.add(batch)  # pending rows from the first call complete here
        out = buf.sample(32, generator=gen)
        buf.update_priorities(out["indices"], out["rewards"])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(buf) == 12 + 16


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("n_step", [1, 3])
def test_cpu_buffer_fed_cuda_tensors_stores_exactly_the_data(n_step: int) -> None:
    buf = buffer("cpu", capacity=64, n_step=n_step)
    data = rows([float(i) for i in range(40)], terminated=[i % 7 == 6 for i in range(40)])
    buf.add(on_device(data, "cuda"))
    ref = buffer("cpu", capacity=64, n_step=n_step)
    ref.add(data)
    got, want = stored(buf, 0, len(ref)), stored(ref, 0, len(ref))
    assert len(buf) == len(ref) > 0
    for key in ("actions", "rewards", "dones", "discounts"):
        assert torch.equal(got[key], want[key]), key
    for part in ("obs", "next_obs"):
        for key in got[part]:
            assert torch.equal(got[part][key], want[part][key]), (part, key)


@pytest.mark.parametrize("as_tensor", [False, True])
def test_stream_ids_outside_the_range_are_rejected_before_anything_is_stored(
        as_tensor: bool) -> None:
    buf = buffer(capacity=8, n_step=2, num_streams=2)
    for bad in ([0, 2], [-1, 0]):
        batch = rows([0.0, 1.0], stream_id=bad)
        batch["stream_id"] = torch.tensor(bad) if as_tensor else bad  # a list
        with pytest.raises(ValueError, match=r"stream_id outside \[0, 2\)"):
            buf.add(batch)
    assert len(buf) == 0 and not buf.state_dict()["pending"]["valid"].any()


CUDA, CPU = torch.device("cuda"), torch.device("cpu")


@pytest.mark.parametrize(("src", "dst", "pinned", "expected"), [
    (CPU, CPU, False, False),
    (CUDA, CPU, False, False),  # to the host: a non-blocking copy lands after it is read
    (torch.device("mps"), CPU, False, False),
    (CPU, CUDA, False, True),  # pageable: CUDA stages it before returning
    (CPU, torch.device("mps"), False, False),  # pageable to MPS: not safe
    (CPU, torch.device("xpu"), False, False),
    (CPU, CUDA, True, True),  # pinned host memory
    (CUDA, CUDA, False, True),
    (torch.device("cuda", 1), torch.device("cuda", 0), False, True),
    (CPU, torch.device("xpu"), True, True),
    (CPU, torch.device("mps"), True, True),
    (torch.device("xpu"), CUDA, False, False),
    (CPU, torch.device("meta"), True, False),
])
def test_non_blocking_only_to_an_accelerator_from_pinned_memory_or_its_own_kind(
        src: torch.device, dst: torch.device, pinned: bool, expected: bool) -> None:
    assert non_blocking_copy(src, dst, pinned) is expected


class CopyFlags(TorchDispatchMode):
    """Records the ``non_blocking`` flag of every copy into a host tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.to_host: list[bool] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is aten._to_copy.default and kwargs.get("device", args[0].device).type == "cpu":
            self.to_host.append(bool(kwargs.get("non_blocking", False)))
        elif func is aten.copy_.default and args[0].device.type == "cpu":
            self.to_host.append(bool(args[2] if len(args) > 2 else
                                     kwargs.get("non_blocking", False)))
        return func(*args, **kwargs)


@settings(max_examples=25, deadline=None)
@given(n_step=st.sampled_from([1, 2, 3]), n=st.integers(1, 30), seed=st.integers(0, 2**16),
       dtype=st.sampled_from([torch.float64, torch.float32, torch.int32]))
def test_cpu_buffer_fed_tensors_stores_the_data_fed_with_blocking_copies(
        n_step: int, n: int, seed: int, dtype: torch.dtype) -> None:
    """Every transition the buffer stores equals the one built from the rows fed to it."""
    rng = np.random.default_rng(seed)
    ends = rng.random(n) < 0.2
    ids = rng.integers(-50, 50, n).astype(np.float32)
    data = on_device(rows(list(ids), terminated=ends), "cpu")
    data["reward"] = data["reward"].to(dtype)  # a dtype change: a real copy, not a no-op
    data["obs"]["x"] = data["obs"]["x"].to(dtype)
    data["action"] = data["action"].to(torch.int32)
    buf = buffer(capacity=64, n_step=n_step, gamma=0.5)
    with CopyFlags() as flags:
        stored_now = int(buf.add(data))
    assert flags.to_host and not any(flags.to_host)
    out = stored(buf, 0, stored_now)
    # rows whose window is complete: n_step rows, or an episode end within them
    firsts = [t for t in range(n) if t + n_step <= n or ends[t:t + n_step].any()]
    assert stored_now == len(firsts)
    for slot, t in enumerate(firsts):
        k = next(j for j in range(1, n_step + 1) if j == n_step or ends[t + j - 1])
        assert out["obs"]["x"][slot, 0].item() == ids[t]
        assert out["actions"][slot].item() == t
        assert out["rewards"][slot].item() == pytest.approx(
            sum(0.5 ** i * float(ids[t + i]) for i in range(k)))
        assert out["next_obs"]["x"][slot, 0].item() == ids[t + k - 1] + 0.5
        assert out["dones"][slot].item() == float(ends[t + k - 1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n_step", [1, 2])
def test_streams_are_stored_in_arrival_order_from_torch_inputs(device: str, n_step: int) -> None:
    buf = buffer(device, capacity=16, n_step=n_step, num_streams=3, gamma=0.5)
    batch = rows([0, 10, 20, 1, 11, 21], stream_id=[0, 1, 2, 0, 1, 2],
                 terminated=[0, 0, 0, 1, 1, 1])
    batch = {k: ({kk: torch.as_tensor(vv, device=device) for kk, vv in v.items()}
                 if isinstance(v, dict) else torch.as_tensor(v, device=device))
             for k, v in batch.items()}
    buf.add(batch)
    out = stored(buf, 0, 6)
    assert len(buf) == 6
    assert out["obs"]["x"][:, 0].tolist() == [0, 10, 20, 1, 11, 21]
    if n_step == 1:
        assert out["rewards"].tolist() == [0, 10, 20, 1, 11, 21]
        assert out["discounts"].tolist() == [0.5] * 6
    else:
        assert out["rewards"].tolist() == [0.5, 15.5, 30.5, 1, 11, 21]
        assert out["discounts"].tolist() == [0.25, 0.25, 0.25, 0.5, 0.5, 0.5]
        assert out["next_obs"]["x"][:, 0].tolist() == [1.5, 11.5, 21.5, 1.5, 11.5, 21.5]
    expected_dones = [0.0, 0.0, 0.0, 1.0, 1.0, 1.0] if n_step == 1 else [1.0] * 6
    assert out["dones"].tolist() == expected_dones


def test_add_reports_stored_count_and_slots_and_discard_pending_drops_a_stream() -> None:
    buf = buffer(capacity=8, n_step=3, gamma=0.5, num_streams=2)
    assert buf.next_slot == 0
    assert int(buf.add(rows([0, 1, 10, 11], stream_id=[0, 0, 1, 1]))) == 0  # all pending
    buf.discard_pending([0])  # stream 0's episode will never continue
    start = buf.next_slot
    stored_now = int(buf.add(rows([2, 12], stream_id=[0, 1])))
    assert stored_now == 1 and buf.next_slot == start + 1  # only stream 1's window 10..12
    assert stored(buf, start, start + 1)["obs"]["x"][:, 0].tolist() == [10]
    # Stream 0 starts afresh at row 2: its first window needs 3 of its own rows.
    assert int(buf.add(rows([3, 4], stream_id=[0, 0]))) == 1
    assert stored(buf, 1, 2)["obs"]["x"][:, 0].tolist() == [2]
    # A call larger than the ring reports every stored transition; next_slot wraps.
    one_step = buffer(capacity=4)
    assert int(one_step.add(rows(list(range(10))))) == 10 and one_step.next_slot == 10 % 4
