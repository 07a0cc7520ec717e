"""The hindsight MPC: the forecast MPC planning on the *true* future signals.

It re-plans every decision exactly like :class:`cloudrl.mpc.forecast_mpc.ForecastMPC`, but
its view holds the realised price, carbon and solar of the next hours instead of their
forecasts (the load stays forecast: arrivals are still unknown). It is clairvoyant, so it
is never a baseline an operator could run; it is a *privileged teacher*: a policy that sees
only forecasts can imitate it and so learn, from data, how forecast errors tend to resolve
(which forecast spikes materialise), which the forecast MPC, planning on point forecasts,
cannot. Being stateless between decisions, it can label any state a student visits.
"""

from __future__ import annotations

from dataclasses import replace

from cloudrl.mpc.forecast_mpc import ForecastMPC
from envs.scenario.control import PlanView, plan_view
from envs.scenario.sim import ScenarioSim
from envs.signals.forecast import forecast


def hindsight_view(sim: ScenarioSim) -> PlanView:
    """The online view of ``sim`` with its signal forecasts replaced by the truth."""
    v = plan_view(sim)
    price, carbon, solar = forecast(sim.signals, sim.t, len(v.price_fc), 0.0, sim.seed)
    return replace(v, price_fc=price, carbon_fc=carbon, solar_fc_kw=solar)


class HindsightMPC(ForecastMPC):
    """:class:`ForecastMPC` on the true future signals; see the module docstring."""

    name = "hindsight_mpc"
    clairvoyant = True

    def decide(self, sim: ScenarioSim) -> tuple[float, float]:
        return self.decide_view(hindsight_view(sim))
