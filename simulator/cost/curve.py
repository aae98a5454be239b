"""PiecewiseLinear: a measured curve (step seconds by tokens, all-reduce seconds by bytes), as a profile holds it.

GPU step times do not follow one smooth law in the number of tokens: GEMM efficiency climbs with the rows
of the matrix (small-M tiles, wave quantisation over the SMs), then turns linear once compute-bound; a
collective's time is flat up to tens of kilobytes, then bandwidth-bound. A profile fitted to published
measurements keeps such a term as knots and the simulator interpolates between them. Beyond the last knot
the curve continues along its last segment (compute- and bandwidth-bound terms are linear there); before
the first knot it holds the first value.

Device-free and stdlib only: the cost model reads it on the hot path.
"""

from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from simulator.cost.interpolation import interpolate


class PiecewiseLinear(BaseModel):
    """Knots ``(x[i], y[i])`` joined by straight lines; linear past the last knot, flat before the first."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    x: tuple[float, ...] = Field(min_length=1)
    """Knot positions, strictly increasing and >= 0 (tokens, sequences or bytes: the field's docstring says)."""
    y: tuple[float, ...] = Field(min_length=1)
    """Values at the knots, seconds, each >= 0."""

    @model_validator(mode="after")
    def _check_knots(self) -> Self:
        if len(self.x) != len(self.y):
            raise ValueError(f"x and y must have the same length, got {len(self.x)} and {len(self.y)}")
        if any(v < 0 for v in self.x) or any(b <= a for a, b in zip(self.x, self.x[1:], strict=False)):
            raise ValueError("x must be >= 0 and strictly increasing")
        if any(not v >= 0 for v in self.y):
            raise ValueError("y must be finite and >= 0")
        if len(self.x) > 1 and self.y[-1] < self.y[-2]:
            raise ValueError("the last segment must not fall: the curve continues along it")
        return self

    def at(self, value: float) -> float:
        """The curve at ``value``: interpolated between knots, extrapolated along the last segment."""
        return interpolate(list(self.x), list(self.y), value)

    @property
    def last_slope(self) -> float:
        """Slope of the last segment (0 for a single knot): what the curve adds per unit past its end."""
        if len(self.x) < 2:
            return 0.0
        return (self.y[-1] - self.y[-2]) / (self.x[-1] - self.x[-2])
