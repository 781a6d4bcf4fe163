"""Prediction intervals of calibrated figures, from the leave-out residuals of kernel families.

``calibration.intervals`` stores with a fitted profile, per kernel family, the log residuals
ln(measured / predicted) of committed rows that the predicting fit never saw, in four sets
(``heldout``, ``leave_one_out``, ``cross_gpu``, ``current_kernels``), each kept as its median
and split-conformal bounds (``IntervalTable``). An op takes the residuals its case calls for
(``IntervalSource.residuals``); a sum of op times combines them with the ops of one family
fully correlated and families independent (``Spread``, ``bounds``), and the two sides of a
ratio are taken independent (``interval``). Ops without residuals count in a figure's
``uncovered`` share; a prediction with none at all carries no interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from ssvkit.perfmodel.predictor import RESIDENT_SUFFIX

COVERAGE = 0.9
SETS = ("heldout", "leave_one_out", "cross_gpu", "current_kernels")
POOLED = "*"  # the family key of a set's residuals of all families pooled
GAP = "datasheet_ceilings"  # the family axis entry of a transfer's datasheet-ceiling gap
HOST = "loop_host"  # the family axis entry of the decode loop's host time (``perfmodel.loop_host``)
TENSOR_KINDS = ("gemm", "attention")


def kernel_family(class_name: str) -> str:
    """The kernel family of an op class: its name before the first ``/``, without the
    L2-resident suffix (``sparse_verify/union/b1`` -> ``sparse_verify``, ``gemm@l2`` ->
    ``gemm``)."""
    return class_name.split("/")[0].removesuffix(RESIDENT_SUFFIX)


def conformal_rank_bounds(n: int, coverage: float) -> tuple[int, int] | None:
    """1-based ranks (low, high) of the order statistics bounding a split-conformal central
    ``coverage`` interval from ``n`` residuals: floor((n + 1) a) and ceil((n + 1)(1 - a)),
    a = (1 - coverage) / 2, which hold a new exchangeable residual with probability >=
    ``coverage``; None when ``n`` is too small (under 19 at 90%)."""
    a = (1.0 - coverage) / 2.0
    # (n + 1) a is often a whole number that floating point misses by an ulp (20 x 0.95)
    lo, hi = math.floor((n + 1) * a + 1e-9), math.ceil((n + 1) * (1.0 - a) - 1e-9)
    return (lo, hi) if lo >= 1 and hi <= n else None


@dataclass(frozen=True, slots=True)
class Residuals:
    """One family's log residuals ln(measured / predicted) in one set: count, median and the
    bounds of the central interval of the table's coverage."""

    source: str  # the set, e.g. "heldout", or "heldout, all families" when pooled
    n: int
    low: float
    median: float
    high: float

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"Residuals.n must be >= 1, got {self.n!r}")
        vals = (self.low, self.median, self.high)
        if not all(math.isfinite(v) for v in vals) or not self.low <= self.median <= self.high:
            raise ValueError(
                f"Residuals of {self.source!r}: need low <= median <= high, got {vals}"
            )

    @classmethod
    def of(cls, source: str, values, coverage: float = COVERAGE) -> Residuals | None:
        """The residuals of ``values`` (log ratios); None when too few for ``coverage``."""
        v = np.sort(np.asarray(values, dtype=float))
        ranks = conformal_rank_bounds(len(v), coverage)
        if ranks is None:
            return None
        low, high = float(v[ranks[0] - 1]), float(v[ranks[1] - 1])
        return cls(source, len(v), low, float(np.median(v)), high)

    def hull(self, other: Residuals) -> Residuals:
        """The hull of two residual sets: the outer bounds, ``other``'s median (the set of the
        wider case), the counts and sources joined."""
        return Residuals(
            f"{self.source} + {other.source}",
            self.n + other.n,
            min(self.low, other.low),
            other.median,
            max(self.high, other.high),
        )

    def to_json(self) -> dict:
        return {"n": self.n, "low": self.low, "median": self.median, "high": self.high}


@dataclass(frozen=True, slots=True)
class IntervalTable:
    """A profile's residuals: per set, per kernel family (``kernel_family``; ``POOLED``: all
    families), the log residuals ln(measured / predicted) of committed rows that the
    predicting fit never saw, as ``calibration.intervals`` stores them with the fit:

    - ``heldout``: the interpolation split's held-out rows, the profile's own fits;
    - ``leave_one_out``: the leave-one-head-geometry-, group-size- and context-out sets of
      ``calibration.transfer_sets``, each row predicted by a refit without its value;
    - ``cross_gpu``: another measured GPU's rows (``cross_gpus``), the profile's fits on that
      GPU's measured ceilings;
    - ``current_kernels``: the profile GPU's own rows of kernels that changed after its fit rows
      were timed (its ``unfitted/`` folder less the rows the fit read, as
      ``calibration.intervals.residual_rows`` gathers them), the profile's fits; only the
      families of such rows.

    A family with too few rows for the coverage's ranks is absent; the set's residuals of all
    families pooled stand in for it in ``heldout`` and ``leave_one_out`` (``get`` with
    ``pooled``), not in ``cross_gpu``, whose rows mix kernels that changed between the GPUs'
    measurements, so one family's says nothing of another's."""

    coverage: float
    sets: dict[str, dict[str, Residuals]]
    cross_gpus: tuple[str, ...] = ()  # the GPUs whose rows the cross_gpu set predicts

    def __post_init__(self) -> None:
        if not 0.0 < self.coverage < 1.0:
            raise ValueError(f"IntervalTable.coverage must be in (0, 1), got {self.coverage!r}")
        bad = sorted(set(self.sets) - set(SETS))
        if bad:
            raise ValueError(f"IntervalTable.sets: unknown set {bad[0]!r} (choose from {SETS})")

    def get(self, name: str, family: str, pooled: bool) -> Residuals | None:
        """The family's residuals in set ``name``, else (``pooled``) the set's pooled ones."""
        s = self.sets.get(name, {})
        return s.get(family) or (s.get(POOLED) if pooled else None)

    @classmethod
    def from_json(cls, d: dict) -> IntervalTable:
        sets = {}
        for name, fams in d["sets"].items():
            sets[name] = {
                f: Residuals(
                    name if f != POOLED else f"{name}, all families",
                    int(r["n"]),
                    float(r["low"]),
                    float(r["median"]),
                    float(r["high"]),
                )
                for f, r in fams.items()
            }
        return cls(float(d["coverage"]), sets, tuple(d.get("cross_gpus", ())))

    def families(self) -> tuple[str, ...]:
        return tuple(sorted({f for s in self.sets.values() for f in s if f != POOLED}))


@dataclass(frozen=True, slots=True)
class IntervalSource:
    """What a calibrated prediction's intervals are made of: the profile's residual table,
    whether the profile is priced on another GPU than it was fitted on, and, for a transfer onto
    datasheet ceilings, the source GPU's datasheet-over-measured ceiling ratios minus one, by
    which such a transfer widens the upper side (``gap``: copy bandwidth; for tensor-core ops
    the larger of it and the GEMM rate's). A transfer across architectures, the bare roofline
    and ops without a fitted class (the all-reduce among them) have no residuals: their figures
    carry no interval, or count in the figure's ``uncovered`` share."""

    table: IntervalTable
    transferred: bool = False
    gap_bytes: float = 0.0  # copy bandwidth: datasheet / measured - 1 of the source GPU
    gap_flops: float = 0.0  # bf16 GEMM rate: the same

    def __post_init__(self) -> None:
        for name in ("gap_bytes", "gap_flops"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0.0):
                raise ValueError(f"IntervalSource.{name} must be finite and >= 0, got {v!r}")

    @property
    def axis(self) -> dict[str, int]:
        """Column of each family (and of the loop's host time and the datasheet gap) in a
        ``Spread``."""
        names = (*self.table.families(), POOLED, HOST, GAP)
        return {n: i for i, n in enumerate(names)}

    def residuals(self, family: str, extrapolated: bool) -> Residuals:
        """The residuals of an op of ``family``: ``heldout``, its hull with ``leave_one_out``
        where the call is outside its class's measured range (``extrapolated``), for a
        transferred profile its hull with ``cross_gpu`` where the family has it, and its hull
        with ``current_kernels`` where the family has it: the profile's fit rows of that family
        time earlier kernels than the code runs, so the figure's centre takes the current
        kernels' median (hulled last, its median is the one kept) and its bounds span both
        sets; ``ValueError`` when the table has no heldout residuals at all."""
        r = self.table.get("heldout", family, pooled=True)
        if r is None:
            raise ValueError(f"the profile's interval table has no heldout residuals for {family}")
        if self.transferred:
            x = self.table.get("cross_gpu", family, pooled=False)
            r = r if x is None else r.hull(x)
        if extrapolated:
            x = self.table.get("leave_one_out", family, pooled=True)
            r = r if x is None else r.hull(x)
        x = self.table.get("current_kernels", family, pooled=False)
        return r if x is None else r.hull(x)

    def gap(self, kind: str) -> float:
        return max(self.gap_bytes, self.gap_flops) if kind in TENSOR_KINDS else self.gap_bytes


@dataclass(slots=True)
class Spread:
    """The error model of a sum of op times over n points, in seconds. With d = measured /
    predicted - 1, a sum of op times T = sum S_k measures sum S_k (1 + d_k): ``seconds``
    predicted;
    ``median_s`` = sum S_k (1 + d_k(median)); ``high_s`` / ``low_s`` [families, n] = per family
    sum S_k (d_k(p) - d_k(median)) at the interval's upper / lower level; ``uncovered_s`` the
    seconds of ops without residuals."""

    seconds: np.ndarray
    median_s: np.ndarray
    high_s: np.ndarray
    low_s: np.ndarray
    uncovered_s: np.ndarray

    @classmethod
    def zeros(cls, n: int, num_families: int) -> Spread:
        z = np.zeros(n)
        return cls(z.copy(), z.copy(), np.zeros((num_families, n)), np.zeros((num_families, n)), z)

    def __add__(self, other: Spread) -> Spread:
        """The spread of the ops of both (disjoint op sets)."""
        return Spread(
            self.seconds + other.seconds,
            self.median_s + other.median_s,
            self.high_s + other.high_s,
            self.low_s + other.low_s,
            self.uncovered_s + other.uncovered_s,
        )

    def add_apart(self, seconds) -> None:
        """Add a term fitted apart from the kernel families without residuals of its own (the
        draft step's host time, ``perfmodel.draft_host``): in the figure at its value, with no
        width and not among the ops without residuals."""
        s = np.asarray(seconds, dtype=float)
        self.seconds += s
        self.median_s += s

    def add_op(
        self,
        seconds,
        column: int | None = None,
        inside: Residuals | None = None,
        outside: Residuals | None = None,
        mask=None,
        gap: float = 0.0,
    ) -> None:
        """Add one op's ``seconds`` [n], of the family at ``column``, with residuals ``inside``
        (``outside`` where ``mask``: its extrapolated points); without residuals (``inside``
        None) the op counts as uncovered. ``gap``: the datasheet-ceiling term's relative upward
        width (``IntervalSource.gap``), in the last column."""
        s = np.asarray(seconds, dtype=float)
        self.seconds += s
        if inside is None:
            self.median_s += s
            self.uncovered_s += s
            return
        d_low, d_med, d_high = _deltas(inside)
        if outside is not None:
            d_low, d_med, d_high = (
                np.where(mask, b, a)
                for a, b in zip((d_low, d_med, d_high), _deltas(outside), strict=True)
            )
        self.median_s += s * (1.0 + d_med)
        self.high_s[column] += s * (d_high - d_med)
        self.low_s[column] += s * (d_low - d_med)
        if gap:
            self.high_s[-1] += s * (1.0 + d_med) * gap


def _deltas(r: Residuals) -> tuple[float, float, float]:
    """d = measured / predicted - 1 at the lower bound, median and upper bound."""
    return math.expm1(r.low), math.expm1(r.median), math.expm1(r.high)


@dataclass(slots=True)
class LogBounds:
    """A time figure's interval in log form, per point: ``centre`` = ln(centre / predicted),
    ``up2`` and ``down2`` the squared log widths above and below the centre (``Spread.bounds``);
    what ``interval`` combines."""

    centre: np.ndarray
    up2: np.ndarray
    down2: np.ndarray

    def take(self, idx) -> LogBounds:
        return LogBounds(self.centre[idx], self.up2[idx], self.down2[idx])


def bounds(sp: Spread) -> LogBounds:
    """``sp``'s interval in log form: per family, the log deviation of the figure with that
    family alone at its upper and at its lower level (the others at their medians), squared and
    summed over families.

    The ops of one family are taken fully correlated (one fit: at a quantile level all of them
    sit at that level), so the family's deviation at level p is exactly
    sum_{k in f} S_k (d_k(p) - d_k(median)), the widest the residuals allow; families are taken
    independent, combined in quadrature, the medians shifting the centre (exact for one family
    and for Gaussian log errors; narrower than the families' deviations summed). The
    datasheet-ceiling gap is one more family, upward only."""
    base = np.where(sp.median_s > 0, sp.median_s, 1.0)
    hi = np.log1p(sp.high_s / base)
    lo = np.log1p(np.maximum(sp.low_s / base, -1.0 + 1e-12))
    up = np.maximum(np.maximum(hi, lo), 0.0)
    down = np.minimum(np.minimum(hi, lo), 0.0)
    on = sp.seconds > 0
    centre = np.log(np.where(on, sp.median_s / np.where(on, sp.seconds, 1.0), 1.0))
    return LogBounds(centre, np.sum(up * up, axis=0), np.sum(down * down, axis=0))


def interval(
    value, over: LogBounds | None = None, under: LogBounds | None = None, same=None
) -> np.ndarray:
    """[n, 2] bounds of a figure ``value`` [n] proportional to a time with bounds ``over`` and
    inversely to one with bounds ``under`` (a time: ``over``; tokens/s: ``under`` its round,
    acceptance an input that adds no width; a speedup: ``over`` the anchor's round, ``under``
    the strategy's).

    Centre: ``value x centre(over) / centre(under)``. Width: the two sides' squared log widths
    add, their errors taken independent: for sides whose errors are non-negatively correlated,
    which they are when they share families, that bounds the ratio's spread instead of
    crediting a cancellation the residuals do not measure. Points where ``same`` is true (a
    strategy over itself: both sides one prediction) get a zero-width interval."""
    value = np.asarray(value, dtype=float)
    up2 = down2 = centre = 0.0
    if over is not None:
        up2, down2, centre = over.up2, over.down2, over.centre
    if under is not None:
        up2, down2, centre = up2 + under.down2, down2 + under.up2, centre - under.centre
    if same is not None:
        up2, down2, centre = (np.where(same, 0.0, x) for x in (up2, down2, centre))
    mid = value * np.exp(centre)
    return np.stack([mid * np.exp(-np.sqrt(down2)), mid * np.exp(np.sqrt(up2))], axis=-1)


def uncovered_share(*spreads: Spread | None) -> np.ndarray | float:
    """The largest share of seconds without residuals among ``spreads``' figures."""
    shares = [
        np.where(sp.seconds > 0, sp.uncovered_s / np.where(sp.seconds > 0, sp.seconds, 1.0), 0.0)
        for sp in spreads
        if sp is not None
    ]
    return np.maximum.reduce(shares) if shares else 0.0
