"""How a step's cost grows with the context it attends over, fitted from finished steps.

A pass of a model attends over every position the sequence holds, so the
seconds of a target step with k drafts, and of a drafter's draft, grow with
the context: in a long chat a figure timed a few turns back, or at another
width, is too low for the step being decided now. `ContextSlope` fits, from
the steps seen, the seconds each position of context adds to a step of
width k, as a line in k (`a + b * k`, the attention of k + 1 fed positions
over the context): each width's own level is set apart (a step of k drafts
costs what it costs at its own width, whatever the line says), so that only
how one width's cost moved with the context counts. Every figure fades
(`DECAY`), so the fit follows the machine across a chat.

`step_estimates` moves each measured cost from the context it was measured
at to the context of the step being decided. This module chooses nothing
and knows nothing about drafters or models: widths, positions and seconds.
"""

from __future__ import annotations

__all__ = ["ContextSlope"]

_SCALE = 1000.0
"""Positions are counted in thousands inside the sums (better conditioned)."""


class ContextSlope:
    """Seconds per position of context that a step of width k costs, fitted online.

    For every width k it keeps faded sums of its steps' positions and seconds;
    the slope is the least-squares fit of each width's seconds, less its own
    mean, on its positions, less their mean, with the slope a line in k. Where
    the steps seen span too little context to tell (`MIN_SPREAD` positions,
    root mean square about their width's mean), the slope is 0: costs are
    then taken where they were measured, as without this fit.
    """

    DECAY = 0.99
    """How slowly the evidence fades (about a hundred steps: across turns)."""
    MIN_SPREAD = 32.0
    """Positions of spread (root mean square about each width's mean) below
    which the steps seen say nothing of the slope."""

    def __init__(self, decay: float = DECAY) -> None:
        self.decay = decay
        self._sums: dict[int, list[float]] = {}
        """Width -> faded [weight, sum n, sum t, sum n*n, sum n*t], n in thousands."""
        self._line: tuple[float, float] | None = None
        """The fitted slope per thousand positions, `a + b * k`, until the next step."""

    def observe(self, width: int, positions: int, seconds: float) -> None:
        """A step of `width` drafts over `positions` of context took `seconds`."""
        if positions <= 0:
            return  # not known
        self._line = None
        for sums in self._sums.values():
            for index in range(5):
                sums[index] *= self.decay
        n = positions / _SCALE
        sums = self._sums.setdefault(width, [0.0] * 5)
        for index, value in enumerate((1.0, n, seconds, n * n, n * seconds)):
            sums[index] += value

    def slope(self, width: int) -> float:
        """Seconds one more position of context adds to a step of `width` (>= 0)."""
        if self._line is None:
            self._line = self._fit()
        a, b = self._line
        return max(a + b * width, 0.0) / _SCALE

    def _fit(self) -> tuple[float, float]:
        """The slope per thousand positions as `(a, b)`: `a + b * k`."""
        a11 = a12 = a22 = b1 = b2 = weight = spread = 0.0
        for k, (w, sn, st, snn, snt) in self._sums.items():
            if w <= 0:
                continue
            cnn = snn - sn * sn / w  # spread of positions about this width's mean
            cnt = snt - sn * st / w
            if cnn <= 0:
                continue
            weight += w
            spread += cnn
            a11 += cnn
            a12 += cnn * k
            a22 += cnn * k * k
            b1 += cnt
            b2 += cnt * k
        if weight <= 0 or spread / weight < (self.MIN_SPREAD / _SCALE) ** 2:
            return 0.0, 0.0
        det = a11 * a22 - a12 * a12
        if det <= 1e-9 * max(a11 * a22, 1e-30):  # one width only: no line in k
            return b1 / a11, 0.0
        return (b1 * a22 - b2 * a12) / det, (a11 * b2 - a12 * b1) / det
