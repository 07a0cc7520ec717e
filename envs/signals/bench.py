"""Benchmark of the per-tick forecast: ``python -m envs.signals.bench``.

Prints the cost of one call of :func:`envs.signals.forecast` for a 24 h horizon at 5-min
ticks (288 ticks), with and without noise. Expect about 5-20 us per call on a laptop core.
"""

from __future__ import annotations

import time

from envs.signals.config import SignalConfig
from envs.signals.forecast import forecast
from envs.signals.make import make_signals


def main(n: int = 20000) -> dict[float, float]:
    """Microseconds per call, by forecast error."""
    cfg = SignalConfig()
    series = make_signals(cfg, 576 + 288, 300.0, 0)
    out = {}
    for error in (cfg.forecast_error, 0.0):
        forecast(series, 0, 288, error, 0)
        t0 = time.perf_counter()
        for i in range(n):
            forecast(series, i % 576, 288, error, 0)
        out[error] = (time.perf_counter() - t0) / n * 1e6
        print(f"forecast, 288 ticks, error {error:g}: {out[error]:.1f} us per call")
    return out


if __name__ == "__main__":
    main()
