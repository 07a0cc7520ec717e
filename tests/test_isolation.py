"""Tests leave nothing behind for the next test: no patched ``print`` (Ray's tqdm patch).

The two ``print`` tests run in file order: the first patches ``builtins.print`` the way a
leaked patch would (a print that writes to a stream closed after the test), the second
prints. Before the ``conftest`` fixture restored ``print`` after every test, the second
failed with "I/O operation on closed file", as the rollout-controller test did after
tests that had started Ray's tqdm progress bars.
"""

from __future__ import annotations

import builtins
import io

import pytest

_LEAKED: list[io.StringIO] = []


def test_a_test_may_patch_print_and_close_its_stream() -> None:
    stream = io.StringIO()

    def leaky_print(*args, **kwargs) -> None:
        kwargs.setdefault("file", stream)
        builtins.__dict__["_real_print"](*args, **kwargs)

    builtins.__dict__["_real_print"] = builtins.print
    builtins.print = leaky_print
    stream.close()
    _LEAKED.append(stream)
    with pytest.raises(ValueError, match="closed file"):
        print("inside the patching test")


def test_the_next_test_prints_with_the_real_print(capsys) -> None:
    assert _LEAKED and _LEAKED[0].closed  # the test above ran first and left its patch
    print("after a leaked patch")
    assert capsys.readouterr().out == "after a leaked patch\n"
    builtins.__dict__.pop("_real_print", None)


def test_rays_tqdm_does_not_patch_print() -> None:
    """Ray's tqdm manager (made when a worker's log line or a Ray Data progress bar reaches
    the driver) leaves ``print`` alone: the conftest sets ``RAY_TQDM_PATCH_PRINT=0``."""
    from ray.experimental import tqdm_ray

    before = builtins.print
    tqdm_ray.instance()
    assert builtins.print is before


class _SettledService:
    """A decision service whose canary ``v2`` has already been promoted."""

    def call(self, method: str, path: str, body=None):
        return {"history": [{"id": 1, "version": "v2", "at": 0.0, "event": "promoted",
                             "reason": "20 canary decisions"}],
                "controller": {"signals": {"v2": {"decisions": 20}}}}


def test_rollout_prints_to_the_stdout_of_the_call_not_of_the_import(capsys) -> None:
    """``cloudrl loop rollout`` imported while an earlier test's capture was ``sys.stdout``
    (building the CLI parser imports it) prints to the current stdout once that capture is
    closed: the rollout-controller test failed with "I/O operation on closed file" after
    any CLI test that ran under ``capsys``."""
    import importlib
    import io
    import sys

    import cloudrl.loop.rollout as rollout

    earlier, current = io.StringIO(), sys.stdout
    sys.stdout = earlier
    try:
        rollout = importlib.reload(rollout)
    finally:
        sys.stdout = current
    earlier.close()
    decision = rollout.wait_for_decision(_SettledService(), "v2", 0, timeout_s=5, poll_s=0.01)
    assert decision["event"] == "promoted" and decision["signals"] == {"decisions": 20}
    assert "v2 promoted: 20 canary decisions" in capsys.readouterr().out
