"""Each site's committed checkpoint re-measures live.

``checkpoints/sites/<site>/site.json`` holds the test windows and the per-window costs the
checkpoint scored in ``cloudrl sites train`` (the numbers behind ``learned_cost`` in
``docs/results/sites.json``). Replaying the checkpoint on some of those windows, with the
same window, seed and forecasts, gives the same cost terms to 1e-6 relative; the stored
rows average to the published ``learned_cost``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cloudrl.scenarios.runner import ControllerSpec
from cloudrl.sites.headroom import _window_item
from cloudrl.sites.registry import get_site
from cloudrl.sites.splits import Window

ROOT = Path(__file__).resolve().parents[1]
SITES = ("de_lu", "caiso")
TERMS = ("cost_usd", "energy_usd", "carbon_usd", "sla_lc_usd", "sla_batch_usd")


@pytest.fixture(autouse=True, scope="module")
def _cache(tmp_path_factory):
    """The split slices and the carbon model go to a temporary cache, shared by the module."""
    mp = pytest.MonkeyPatch()
    mp.setenv("CLOUDRL_CACHE_DIR", str(tmp_path_factory.mktemp("site_cache")))
    yield
    mp.undo()


def _published(site: str) -> tuple[Path, dict]:
    ckpt = ROOT / "checkpoints" / "sites" / site
    return ckpt, json.loads((ckpt / "site.json").read_text())


def _replay(site: str, positions: list[int]) -> None:
    ckpt, pub = _published(site)
    spec = ControllerSpec("learned", {"checkpoint": str(ckpt)}, "learned")
    for i in positions:
        w = Window(**pub["windows"][i])
        got = _window_item((get_site(site), pub["split"], w, spec, "gbt"))
        want = pub["learned_per_window"][i]
        for t in TERMS:
            assert got[t] == pytest.approx(want[t], rel=1e-6, abs=1e-9), (site, w, t)


@pytest.mark.parametrize("site", SITES)
def test_published_rows_are_the_results_learned_cost(site):
    _, pub = _published(site)
    rows = json.loads((ROOT / "docs" / "results" / "sites.json").read_text())["rows"]
    row = next(r for r in rows if (r["site"], r["split"]) == (site, pub["split"]))
    costs = [m["cost_usd"] for m in pub["learned_per_window"]]
    assert len(costs) == row["n_test_windows"] == len(pub["windows"])
    assert np.mean(costs) == pytest.approx(row["learned_cost"], rel=1e-9)
    assert [w["start_date"] for w in pub["windows"]] == sorted(w["start_date"]
                                                              for w in pub["windows"])


@pytest.mark.slow  # the split slices and the carbon model are built cold: minutes here
def test_a_committed_site_checkpoint_replays_one_window_live():
    _replay("de_lu", [23])


@pytest.mark.slow
@pytest.mark.parametrize("site", SITES)
def test_each_committed_site_checkpoint_replays_its_test_windows_live(site):
    _, pub = _published(site)
    n = len(pub["windows"])
    _replay(site, sorted({0, n // 3, (2 * n) // 3, n - 1}))
