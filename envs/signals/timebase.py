"""The ticks' calendar (midpoints, hour of day, weekday) and the unit-variance noise paths
the generators share: a stationary AR(1) (an Ornstein-Uhlenbeck process sampled at the
ticks) and a smooth AR (two cascaded AR(1) filters, autocorrelation ``(1 + k/tau) e^{-k/tau}``
in the continuous limit). Times are naive local times (no time zone), like the data.

Cost: a clock computes each of its per-tick arrays once and keeps it (read-only), so the
price and carbon generators share them; the AR paths' decay of the initial value
(``phi ** arange(n)``) is kept per ``(phi, n)`` (an env's episodes all have the same), and
both AR filters run in one compiled pass (:func:`_ar_filter`, the operations of
``scipy.signal.lfilter``'s first-order filter, so the paths are the same bit for bit).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numba
import numpy as np

SECONDS_PER_DAY = 86400
WEEKEND_RAMP_HOURS = 6.0


@dataclass(frozen=True)
class TickClock:
    """``n_ticks`` ticks of ``tick_seconds`` starting at ``start`` (datetime64[s], local)."""

    start: np.datetime64
    tick_seconds: float
    n_ticks: int

    def _kept(self, key, build) -> np.ndarray:
        """The array ``build()`` made on the first call for ``key``, read-only, kept."""
        memo = self.__dict__.setdefault("_memo", {})
        arr = memo.get(key)
        if arr is None:
            arr = build()
            arr.setflags(write=False)
            memo[key] = arr
        return arr

    def seconds_since_start(self) -> np.ndarray:
        """Each tick's midpoint, in seconds after ``start`` (read-only)."""
        return _seconds_since_start(float(self.tick_seconds), int(self.n_ticks))

    def seconds_of_epoch(self) -> np.ndarray:
        """Each tick's midpoint in seconds since 1970-01-01 00:00 (local), a Thursday."""
        def build() -> np.ndarray:
            t0 = float(self.start.astype("datetime64[s]").astype(np.int64))
            return t0 + self.seconds_since_start()

        return self._kept("epoch", build)

    def hour_of_day(self) -> np.ndarray:
        """Fractional hour of day (0..24) of every tick's midpoint."""
        return self._kept("hour", lambda: self._calendar()[0])

    def _calendar(self) -> tuple[np.ndarray, np.ndarray]:
        """(hour of day, weekend weight at the default ramp), made in one compiled pass."""
        def build() -> np.ndarray:
            out = np.empty((2, self.n_ticks))
            _calendar_kernel(self.seconds_of_epoch(), WEEKEND_RAMP_HOURS, out)
            return out

        return self._kept("calendar", build)

    def day_index(self) -> np.ndarray:
        """Days since 1970-01-01 of every tick's midpoint."""
        return self._kept("day", lambda: np.floor_divide(
            self.seconds_of_epoch(), SECONDS_PER_DAY).astype(np.int64))

    def weekday(self) -> np.ndarray:
        """Day of week of every tick's midpoint, 0 = Monday .. 6 = Sunday."""
        return (self.day_index() + 3) % 7

    def is_weekend(self) -> np.ndarray:
        return self.weekday() >= 5

    def weekend_weight(self, ramp_hours: float = WEEKEND_RAMP_HOURS) -> np.ndarray:
        """How much of the weekend each tick is in: 0 on weekdays, 1 on Saturday and Sunday,
        ramping linearly over ``ramp_hours`` centred on midnight Friday/Saturday and
        Sunday/Monday (grids do not switch at the stroke of midnight). Its weekly mean is
        exactly 2/7."""
        if ramp_hours == WEEKEND_RAMP_HOURS:
            return self._kept("weekend", lambda: self._calendar()[1])

        def build() -> np.ndarray:
            how = np.mod(self.seconds_of_epoch() + 3 * SECONDS_PER_DAY,
                         7 * SECONDS_PER_DAY) / 3600.0

            def step(x: np.ndarray) -> np.ndarray:
                return np.clip((x + ramp_hours / 2.0) / ramp_hours, 0.0, 1.0)

            return step(how - 120.0) - step(how - 168.0) + 1.0 - step(how)

        return self._kept(("weekend", float(ramp_hours)), build)


@numba.njit(cache=True, inline="always")
def _np_mod(a, b):  # pragma: no cover (compiled)
    """``numpy.mod`` of two floats (its ``npy_divmod``: fmod, then the divisor's sign)."""
    mod = np.fmod(a, b)
    if mod != 0.0:
        if (b < 0.0) != (mod < 0.0):
            mod += b
    else:
        mod = math.copysign(0.0, b)
    return mod


_TWO_53 = 9007199254740992.0


@numba.njit(cache=True, inline="always")
def _mod_pos(a, b):  # pragma: no cover (compiled)
    """``numpy.mod(a, b)`` for ``b > 0`` and ``0 < a < 2**53`` (the caller checks), without
    ``fmod`` (slow for a large ``a / b``): ``k = floor(a / b)`` is the quotient or one too
    many (the rounded quotient never falls below an integer the exact one reaches),
    ``k * b`` is an integer below 2**53 and ``a - k * b`` is then exact (Sterbenz), so the
    result is the exact remainder, as ``fmod`` gives (and never a negative zero)."""
    k = math.floor(a / b)
    r = a - k * b
    if r < 0.0:
        r = a - (k - 1.0) * b
    return r


@numba.njit(cache=True, inline="always")
def _clip01(x):  # pragma: no cover (compiled)
    """``numpy.clip(x, 0.0, 1.0)`` of a float that is not NaN."""
    x = x if x > 0.0 else 0.0
    return x if x < 1.0 else 1.0


@numba.njit(cache=True, inline="always")
def _weekend(how, half, ramp_hours):  # pragma: no cover (compiled)
    w = _clip01(((how - 120.0) + half) / ramp_hours) - _clip01(((how - 168.0) + half)
                                                               / ramp_hours)
    return (w + 1.0) - _clip01((how + half) / ramp_hours)


@numba.njit(cache=True)
def _calendar_kernel(epoch, ramp_hours, out):  # pragma: no cover (compiled)
    """``out[0]``: hour of day, ``out[1]``: weekend weight of each midpoint in ``epoch``
    (seconds), with :class:`TickClock`'s numpy operations, element by element (the
    remainders by :func:`_mod_pos` when every time is in its range, else ``numpy.mod``'s)."""
    half = ramp_hours / 2.0
    n = epoch.shape[0]
    fast = True
    for i in range(n):
        x = epoch[i]
        if not (x > 0.0 and x + 259200.0 < _TWO_53):
            fast = False
    if fast:
        for i in range(n):
            x = epoch[i]
            out[0, i] = _mod_pos(x, 86400.0) / 3600.0
            out[1, i] = _weekend(_mod_pos(x + 259200.0, 604800.0) / 3600.0, half, ramp_hours)
    else:
        for i in range(n):
            x = epoch[i]
            out[0, i] = _np_mod(x, 86400.0) / 3600.0
            out[1, i] = _weekend(_np_mod(x + 259200.0, 604800.0) / 3600.0, half, ramp_hours)


@numba.njit(cache=True)
def interp_into(x, xp, fp, slopes, out):  # pragma: no cover (compiled)
    """``out[:] = numpy.interp(x, xp, fp)``, in numpy's operations (``compiled_base.c``: the
    bracket ``xp[j] <= x < xp[j+1]``, ``slopes[j] * (x - xp[j]) + fp[j]`` with ``slopes[j] =
    (fp[j+1] - fp[j]) / (xp[j+1] - xp[j])``, ``fp[j]`` where ``x == xp[j]``, the end values
    outside), so the values are the same bit for bit. ``xp`` increasing, at least two
    points; ``slopes`` from :func:`interp_slopes`. The bracket starts from the previous
    value's (the hours of successive ticks are close) and moves by comparisons (exact for
    any ``xp`` and any order of ``x``)."""
    n = xp.shape[0]
    lo = xp[0]
    hi = xp[n - 1]
    j = 0
    for i in range(x.shape[0]):
        v = x[i]
        if v != v:
            out[i] = v
            continue
        if v < lo:
            out[i] = fp[0]
            continue
        if v >= hi:
            out[i] = fp[n - 1]
            continue
        while j > 0 and xp[j] > v:
            j -= 1
        while j < n - 2 and xp[j + 1] <= v:
            j += 1
        if xp[j] == v:
            out[i] = fp[j]
            continue
        r = slopes[j] * (v - xp[j]) + fp[j]
        if r != r:  # numpy's retry from the other end
            r = slopes[j] * (v - xp[j + 1]) + fp[j + 1]
            if r != r and fp[j] == fp[j + 1]:
                r = fp[j]
        out[i] = r


@numba.njit(cache=True)
def mod24_into(h, out):  # pragma: no cover (compiled)
    """``out[:] = numpy.mod(h, 24.0)``: ``h`` itself where every value is in (0, 24)
    (``fmod`` returns it unchanged there), else :func:`_np_mod` per value. (The check is
    its own pass: with ``fmod`` in the loop's other branch the compiler evaluates it for
    every value.)"""
    inside = True
    for i in range(h.shape[0]):
        if not (h[i] > 0.0 and h[i] < 24.0):
            inside = False
    if inside:
        for i in range(h.shape[0]):
            out[i] = h[i]
    else:
        for i in range(h.shape[0]):
            out[i] = _np_mod(h[i], 24.0)


def interp_slopes(xp: np.ndarray, fp: np.ndarray) -> np.ndarray:
    """The segment slopes :func:`interp_into` reads, as numpy's interp computes them."""
    xp = np.asarray(xp, dtype=np.float64)
    fp = np.asarray(fp, dtype=np.float64)
    return (fp[1:] - fp[:-1]) / (xp[1:] - xp[:-1])


@functools.lru_cache(maxsize=16)
def _seconds_since_start(tick_seconds: float, n: int) -> np.ndarray:
    out = (np.arange(n, dtype=np.float64) + 0.5) * tick_seconds
    out.setflags(write=False)
    return out


@functools.lru_cache(maxsize=32)
def _decay(phi: float, n: int) -> np.ndarray:
    """``phi ** arange(n)`` (read-only), kept per ``(phi, n)``."""
    out = phi ** np.arange(n)
    out.setflags(write=False)
    return out


@numba.njit(cache=True)
def _ar_filter(x, b0, phi, x0, decay, out):  # pragma: no cover (compiled)
    """``out = lfilter([b0], [1, -phi], x) + x0 * decay``, in ``scipy.signal.lfilter``'s
    operations and order (direct form II transposed, the unused ``b1 = 0`` included), so
    the result is the same bit for bit."""
    a1 = -phi
    z = 0.0
    for k in range(x.shape[0]):
        y = z + b0 * x[k]
        z = x[k] * 0.0 - y * a1
        out[k] = y + x0 * decay[k]


def ar1(rng: np.random.Generator, n: int, phi: float) -> np.ndarray:
    """Stationary AR(1) with unit variance: ``x_t = phi x_{t-1} + sqrt(1 - phi^2) e_t``."""
    e = rng.standard_normal(n)
    if n == 0:
        return e
    scale = np.sqrt(max(1.0 - phi * phi, 0.0))
    x0 = e[0]
    e[0] = 0.0
    out = np.empty(n)
    _ar_filter(e, float(scale), float(phi), float(x0), _decay(float(phi), n), out)
    return out


def smooth_ar(rng: np.random.Generator, n: int, phi: float) -> np.ndarray:
    """Unit-variance stationary output of two cascaded AR(1) filters with the same ``phi``."""
    y = ar1(rng, n, phi)
    if n == 0:
        return y
    # z_t = phi z_{t-1} + c y_t has Var(z) = c^2 (1 + phi^2) / (1 - phi^2)^2 and
    # Cov(z, y) = c / (1 - phi^2); choose c for unit variance and start z stationary.
    c = (1.0 - phi * phi) / np.sqrt(1.0 + phi * phi)
    rho = 1.0 / np.sqrt(1.0 + phi * phi)
    z0 = rho * y[0] + np.sqrt(max(1.0 - rho * rho, 0.0)) * rng.standard_normal()
    drive = c * y
    drive[0] = 0.0
    out = np.empty(n)
    _ar_filter(drive, 1.0, float(phi), float(z0), _decay(float(phi), n), out)
    return out
