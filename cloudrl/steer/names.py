"""The names of the hidden utilities and the operator's utility spec (``A`` or drift
``A>B@f``), parsed without loading any utility (the loop and the learner read these)."""

from __future__ import annotations

UTILITY_NAMES = ("lc_window", "hour_carbon", "toggle_cap", "class_fairness", "smooth_controls")


def utilities_of(text: str) -> tuple[str, str | None, float]:
    """``A`` -> (A, None, 1.0); ``A>B@f`` -> (A, B, f): B from fraction f of the labels on."""
    first, _, rest = text.partition(">")
    second, at = None, 1.0
    if rest:
        second, _, frac = rest.partition("@")
        try:
            at = float(frac) if frac else 0.5
        except ValueError:
            raise ValueError(f"utility {text!r}: {frac!r} is not a fraction") from None
        if not 0.0 < at < 1.0:
            raise ValueError(f"utility {text!r}: switch point {at} is not in (0, 1)")
    for name in (first, second):
        if name is not None and name not in UTILITY_NAMES:
            raise ValueError(f"utility {name!r}: valid: {', '.join(UTILITY_NAMES)}")
    return first, second, at
