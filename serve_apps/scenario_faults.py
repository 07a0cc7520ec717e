"""Fault-injection scenario controllers for shield drills and tests.

``python:serve_apps.scenario_faults:by_price`` is the signal-aware rule that misbehaves
when told to by the request's ``price_now`` (so one deployment covers every fault):

* ``RAISE_PRICE``: raises ``RuntimeError``;
* ``NAN_PRICE``: returns NaN controls;
* ``SLOW_PRICE``: sleeps ``SLOW_SECONDS`` (beyond a short ``decide_timeout_s``);
* ``WILD_PRICE``: returns controls far outside their ranges (``release_util`` 50,
  ``ready_cores`` -3 and 10x the fleet): the shield clamps them;
* any other price: the signal-aware rule's answer.

``python:serve_apps.scenario_faults:raising`` raises on every state.
``python:serve_apps.scenario_faults:echo`` decides nothing (every server ready, release
up to the whole fleet): the benchmark's reference row, the service's own cost around a
controller that takes no time.
"""

from __future__ import annotations

import time

from cloudrl.heuristics.signal_aware import SignalAwareDeferral
from envs.scenario.control import PlanView
from envs.scenario.sim import ScenarioSim

RAISE_PRICE, NAN_PRICE, SLOW_PRICE, WILD_PRICE = 6661.0, 6662.0, 6663.0, 6664.0
SLOW_SECONDS = 3.0


class ByPrice(SignalAwareDeferral):
    name = "faults_by_price"

    def decide_view(self, v: PlanView) -> tuple[float, float]:
        if v.price_now == RAISE_PRICE:
            raise RuntimeError("injected controller failure")
        if v.price_now == NAN_PRICE:
            return float("nan"), float("nan")
        if v.price_now == SLOW_PRICE:
            time.sleep(SLOW_SECONDS)
        if v.price_now == WILD_PRICE:
            return 50.0, -3.0 if v.t % 2 else 10.0 * v.fleet_cores
        return super().decide_view(v)


class Raising:
    name = "faults_raising"
    clairvoyant = False

    def reset(self, sim: ScenarioSim) -> None:
        pass

    def decide_view(self, v: PlanView) -> tuple[float, float]:
        raise RuntimeError("injected controller failure")


class Echo:
    name = "echo"
    clairvoyant = False

    def reset(self, sim: ScenarioSim) -> None:
        pass

    def decide_view(self, v: PlanView) -> tuple[float, float]:
        return 1.0, v.fleet_cores


def by_price() -> ByPrice:
    return ByPrice()


def raising() -> Raising:
    return Raising()


def echo() -> Echo:
    return Echo()
