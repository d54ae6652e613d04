"""Taper schedules and the exact integer width solver (pure Python; no torch).

A taper assigns layer l of L a multiplier r_l of a baseline size B (the MLP width of the uniform
model, or any other per-layer integer quantity: heads, memory widths, CMS level widths). The
solver turns the multipliers into integers that are multiples of `multiple_of` and whose sum is
exactly L * B, so a tapered model holds exactly the parameters and FLOPs of its baseline
(PAPER.md §1-2):

1. w_l = round(r_l * B / m) * m for every layer (m = multiple_of);
2. the first and last layers stay pinned at their rounded values;
3. the remaining difference L*B - sum(w) is removed one step of m at a time from the interior
   layers whose rounding error points the same way (largest remainder first), never breaking the
   monotone order of a monotone schedule and never dropping a width to <= 0.

Specification strings (CLI `--taper`): `uniform`, `cosine[:START:END]`, `linear[:START:END]`,
`sigmoid[:START:END[:K]]`, `groups:R1,R2,...`, `custom:V1,V2,...` (multipliers if any value has a
decimal point, widths if all are integers).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Any

from taperlm.domains import setting
from taperlm.errors import TaperError

SCHEDULES = ("uniform", "cosine", "linear", "sigmoid", "groups", "custom")
DEFAULT_START = 1.5
DEFAULT_END = 0.5
DEFAULT_STEEPNESS = 10.0
DEFAULT_MULTIPLE_OF = 16
# How far the multipliers' mean may stray from 1 before the solver tries to repair it (uneven group
# sizes in shallow models give e.g. 1.125); beyond this the schedule itself breaks the budget.
MAX_MEAN_DEVIATION = 0.25


def _check_positive(values: list[float], if_empty: str, what: str) -> None:
    """TaperError `if_empty` for no values, or naming the values that are not finite and > 0."""
    if not values:
        raise TaperError(if_empty)
    bad = [v for v in values if not math.isfinite(v) or v <= 0]
    if bad:
        raise TaperError(f"{what} must be > 0, got {bad}")


@dataclass
class TaperSpec:
    """How per-layer sizes are derived from a baseline size.

    Fields:
        schedule: uniform | cosine | linear | sigmoid | groups | custom.
        start: multiplier of the baseline at the first layer (cosine/linear/sigmoid).
        end: multiplier at the last layer; start < end gives the wider-late mirror.
        steepness: k of the sigmoid schedule.
        groups: multipliers of n equal groups of consecutive layers (schedule `groups`).
        values: explicit per-layer multipliers or widths (schedule `custom`).
        values_are_widths: whether `values` are integer widths (True) or multipliers (False).
        multiple_of: every resolved size is a multiple of this (16 in the paper; 64-256 on GPUs).
        monotone: enforce a monotone result; None = enforce exactly when the multipliers are monotone.
    """

    schedule: str = setting("uniform", "{" + ", ".join(SCHEDULES) + "}")
    start: float = setting(DEFAULT_START, "(0, inf)")
    end: float = setting(DEFAULT_END, "(0, inf)")
    steepness: float = setting(DEFAULT_STEEPNESS, "(0, inf)")
    groups: list[float] = setting([], "(0, inf)")
    values: list[float] = setting([], "(0, inf)")
    values_are_widths: bool = False
    multiple_of: int = setting(DEFAULT_MULTIPLE_OF, "[1, inf)")
    monotone: bool | None = None

    @classmethod
    def parse(cls, text: str, multiple_of: int | None = None) -> TaperSpec:
        """Parse a CLI taper specification such as `cosine:1.5:0.5` or `groups:1.5,1.0,0.5`."""
        text = text.strip()
        name, _, rest = text.partition(":")
        name = name.strip().lower()
        m = DEFAULT_MULTIPLE_OF if multiple_of is None else multiple_of
        if name not in SCHEDULES:
            raise TaperError(
                f"unknown taper schedule {name!r} in {text!r}; choose one of {', '.join(SCHEDULES)} "
                "(e.g. cosine:1.5:0.5, groups:1.5,1.0,0.5, custom:4224,3840,...)"
            )
        parts = [p.strip() for p in rest.split(":")] if rest else []
        if name == "uniform":
            if parts:
                raise TaperError(f"taper 'uniform' takes no arguments, got {text!r}")
            return cls(schedule="uniform", multiple_of=m)
        if name in ("cosine", "linear", "sigmoid"):
            max_args = 3 if name == "sigmoid" else 2
            if len(parts) not in (0, 2) and not (name == "sigmoid" and len(parts) == 3):
                raise TaperError(
                    f"taper {text!r}: expected {name} or {name}:START:END"
                    + (":K" if name == "sigmoid" else "")
                    + f" (at most {max_args} numbers)"
                )
            nums = [_number(p, text) for p in parts]
            spec = cls(schedule=name, multiple_of=m)
            if nums:
                spec.start, spec.end = nums[0], nums[1]
            if len(nums) == 3:
                spec.steepness = nums[2]
            spec.validate()
            return spec
        if not parts or not parts[0]:
            raise TaperError(
                f"taper {text!r}: {name} needs a comma-separated list, e.g. {name}:1.5,1.0,0.5"
            )
        if len(parts) > 1:
            raise TaperError(f"taper {text!r}: use commas between {name} values, not colons")
        items = [p.strip() for p in parts[0].split(",")]
        nums = [_number(p, text) for p in items]
        if name == "groups":
            spec = cls(schedule="groups", groups=nums, multiple_of=m)
        else:
            as_widths = all(("." not in p and "e" not in p.lower()) for p in items)
            spec = cls(schedule="custom", values=nums, values_are_widths=as_widths, multiple_of=m)
        spec.validate()
        return spec

    def to_string(self) -> str:
        """Inverse of `parse`: `TaperSpec.parse(spec.to_string())` equals `spec` exactly."""
        if self.schedule == "uniform":
            return "uniform"
        if self.schedule in ("cosine", "linear"):
            return f"{self.schedule}:{_exact(self.start)}:{_exact(self.end)}"
        if self.schedule == "sigmoid":
            return f"sigmoid:{_exact(self.start)}:{_exact(self.end)}:{_exact(self.steepness)}"
        if self.schedule == "groups":
            return "groups:" + ",".join(_exact(g) for g in self.groups)
        if self.values_are_widths:
            return "custom:" + ",".join(str(int(v)) for v in self.values)
        # repr of a float always has a '.' or an exponent, so parse reads multipliers back.
        return "custom:" + ",".join(_exact(v) for v in self.values)

    def validate(self) -> None:
        if self.schedule not in SCHEDULES:
            raise TaperError(
                f"unknown taper schedule {self.schedule!r}; choose one of {', '.join(SCHEDULES)}"
            )
        if (
            not isinstance(self.multiple_of, int)
            or isinstance(self.multiple_of, bool)
            or self.multiple_of < 1
        ):
            raise TaperError(
                f"taper multiple_of must be a positive integer, got {self.multiple_of!r}"
            )
        if self.schedule in ("cosine", "linear", "sigmoid"):
            for name, v in (("start", self.start), ("end", self.end)):
                if not math.isfinite(v) or v <= 0:
                    raise TaperError(
                        f"taper {self.schedule} {name} multiplier must be > 0, got {v}"
                    )
            if self.schedule == "sigmoid" and (
                not math.isfinite(self.steepness) or self.steepness <= 0
            ):
                raise TaperError(f"sigmoid steepness k must be > 0, got {self.steepness}")
        if self.schedule == "groups":
            _check_positive(
                self.groups,
                "taper 'groups' needs at least one group multiplier, e.g. groups:1.5,1.0,0.5",
                "group multipliers",
            )
        if self.schedule == "custom":
            _check_positive(
                self.values,
                "taper 'custom' needs one value per layer, e.g. custom:4224,2816,1408",
                "custom taper values",
            )
            if self.values_are_widths and any(v != int(v) for v in self.values):
                raise TaperError("custom widths must be integers")

    @property
    def is_uniform(self) -> bool:
        return self.schedule == "uniform"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"schedule": self.schedule, "multiple_of": self.multiple_of}
        if self.schedule in ("cosine", "linear", "sigmoid"):
            d.update(start=self.start, end=self.end)
        if self.schedule == "sigmoid":
            d["steepness"] = self.steepness
        if self.schedule == "groups":
            d["groups"] = list(self.groups)
        if self.schedule == "custom":
            d["values"] = [int(v) if self.values_are_widths else v for v in self.values]
            d["values_are_widths"] = self.values_are_widths
        if self.monotone is not None:
            d["monotone"] = self.monotone
        return d

    def with_multiple_of(self, multiple_of: int) -> TaperSpec:
        return replace(self, multiple_of=multiple_of)


def _number(text: str, spec: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise TaperError(f"taper {spec!r}: {text!r} is not a number") from None


def _fmt(x: float) -> str:
    return f"{x:g}"


def _exact(x: float) -> str:
    """Shortest string that parses back to the same float (1.5 -> '1.5', 1.0 -> '1.0')."""
    return repr(float(x))


# ----------------------------------------------------------------------------------------------
# Multipliers


def multipliers(spec: TaperSpec, n_layers: int) -> list[float]:
    """The real-valued multiplier of every layer before rounding (PAPER.md §2 formulas)."""
    spec.validate()
    if n_layers < 1:
        raise TaperError(f"n_layers must be >= 1, got {n_layers}")
    L = n_layers
    s, e = spec.start, spec.end
    if spec.schedule == "uniform":
        return [1.0] * L
    if spec.schedule in ("cosine", "linear", "sigmoid") and L == 1:
        return [(s + e) / 2]
    if spec.schedule == "cosine":
        return [e + (s - e) * (1 + math.cos(math.pi * i / (L - 1))) / 2 for i in range(L)]
    if spec.schedule == "linear":
        return [s - (s - e) * i / (L - 1) for i in range(L)]
    if spec.schedule == "sigmoid":
        k = spec.steepness
        # exp() is capped: it overflows for a large k (e.g. sigmoid:1.5:0.5:5000); 1/(1+e^700)~0.
        return [e + (s - e) / (1 + math.exp(min(k * (i / (L - 1) - 0.5), 700.0))) for i in range(L)]
    if spec.schedule == "groups":
        n = len(spec.groups)
        if n > L:
            raise TaperError(
                f"taper groups: {n} groups need at least {n} layers, the model has {L}"
            )
        # n groups of consecutive layers, sizes differing by at most one (earlier groups larger).
        sizes = [L // n + (1 if g < L % n else 0) for g in range(n)]
        out: list[float] = []
        for g, size in enumerate(sizes):
            out.extend([spec.groups[g]] * size)
        return out
    # custom
    if len(spec.values) != L:
        raise TaperError(
            f"custom taper has {len(spec.values)} values but the model has {L} layers; give exactly one per layer"
        )
    if spec.values_are_widths:
        raise TaperError("custom widths have no multipliers; resolve them with solve_sizes")
    return [float(v) for v in spec.values]


def _direction(values: list[float]) -> int:
    """+1 non-decreasing, -1 non-increasing, 0 constant, None-like 2 for neither."""
    inc = all(b >= a for a, b in itertools.pairwise(values))
    dec = all(b <= a for a, b in itertools.pairwise(values))
    if inc and dec:
        return 0
    if dec:
        return -1
    if inc:
        return 1
    return 2


# ----------------------------------------------------------------------------------------------
# Solver


def solve_sizes(
    spec: TaperSpec, n_layers: int, baseline: int, *, what: str = "mlp width"
) -> list[int]:
    """Resolve `spec` to one integer size per layer with sum exactly n_layers * baseline.

    `what` names the quantity in error messages (the solver is generic over per-layer sizes).
    """
    spec.validate()
    m = spec.multiple_of
    if not isinstance(baseline, int) or baseline < 1:
        raise TaperError(f"baseline {what} must be a positive integer, got {baseline!r}")
    if n_layers < 1:
        raise TaperError(f"n_layers must be >= 1, got {n_layers}")
    target = n_layers * baseline

    if spec.schedule == "custom" and spec.values_are_widths:
        widths = [int(v) for v in spec.values]
        if len(widths) != n_layers:
            raise TaperError(
                f"custom taper has {len(widths)} widths but the model has {n_layers} layers; give exactly one per layer"
            )
        total = sum(widths)
        if total != target:
            raise TaperError(
                f"custom {what}s sum to {total} but the budget is {n_layers} x {baseline} = {target} "
                f"(off by {total - target:+d}); adjust the list so its mean equals the baseline"
            )
        if spec.monotone and _direction([float(w) for w in widths]) == 2:
            raise TaperError(
                f"custom {what}s {widths} are not monotone but monotone=true was asked"
            )
        return widths

    if baseline % m:
        raise TaperError(
            f"baseline {what} {baseline} is not a multiple of multiple_of={m}; "
            f"use a baseline divisible by {m} or a multiple_of that divides {baseline}"
        )
    r = multipliers(spec, n_layers)
    direction = _direction(r)
    if spec.monotone and direction == 2:
        raise TaperError(
            f"taper {spec.to_string()} is not monotone across depth but monotone=true was asked"
        )
    enforce = direction in (-1, 1) if spec.monotone is None else bool(spec.monotone)

    mean = sum(r) / len(r)
    if abs(mean - 1.0) > MAX_MEAN_DEVIATION:
        raise TaperError(
            f"taper {spec.to_string()} has mean multiplier {mean:.4g}, but a taper must keep the "
            f"budget: the mean must be 1.0 (e.g. start + end = 2 for cosine/linear/sigmoid, "
            f"group multipliers that average 1, custom multipliers that average 1)"
        )
    unit = baseline // m  # baseline in steps of m
    exact = [x * unit for x in r]  # ideal size in steps
    steps = [math.floor(x + 0.5) for x in exact]
    for i, s in enumerate(steps):
        if s <= 0:
            raise TaperError(
                f"layer {i} {what} rounds to {s * m} (multiplier {r[i]:.4f} x {baseline}); "
                f"every layer needs a positive width — raise the end multiplier or lower multiple_of"
            )
    deficit = n_layers * unit - sum(steps)
    interior = list(range(1, n_layers - 1)) if n_layers > 2 else list(range(n_layers))
    if n_layers <= 2 and deficit:
        # Nothing is interior; fall back to adjusting every layer (pinning is impossible).
        interior = list(range(n_layers))

    while deficit:
        sign = 1 if deficit > 0 else -1
        best, best_key = -1, None
        for i in interior:
            new = steps[i] + sign
            if new <= 0:
                continue
            if enforce and not _keeps_order(steps, i, new, direction):
                continue
            # Prefer the layer whose rounding error points the same way (largest remainder).
            key = sign * (exact[i] - steps[i])
            if best_key is None or key > best_key + 1e-12:
                best, best_key = i, key
        if best < 0:
            mean = sum(r) / len(r)
            raise TaperError(
                f"taper {spec.to_string()} cannot meet the budget {n_layers} x {baseline} at multiple_of={m}: "
                f"{abs(deficit)} more step(s) of {m} would have to be {'added' if deficit > 0 else 'removed'} "
                f"without breaking {'the monotone order' if enforce else 'positivity'} "
                f"(mean multiplier {mean:.4f}; it must be 1.0 — e.g. start + end = 2 for cosine/linear/sigmoid)"
            )
        steps[best] += sign
        deficit -= sign
    return [s * m for s in steps]


def _keeps_order(steps: list[int], i: int, new: int, direction: int) -> bool:
    prev_ok = i == 0 or (steps[i - 1] >= new if direction <= 0 else steps[i - 1] <= new)
    next_ok = i == len(steps) - 1 or (
        new >= steps[i + 1] if direction <= 0 else new <= steps[i + 1]
    )
    return prev_ok and next_ok


def describe(spec: TaperSpec) -> str:
    """Human-readable name of a taper, e.g. 'cosine 1.5 -> 0.5'."""
    if spec.schedule == "uniform":
        return "uniform"
    if spec.schedule in ("cosine", "linear"):
        return f"{spec.schedule} {_fmt(spec.start)} -> {_fmt(spec.end)}"
    if spec.schedule == "sigmoid":
        return f"sigmoid {_fmt(spec.start)} -> {_fmt(spec.end)} (k={_fmt(spec.steepness)})"
    if spec.schedule == "groups":
        return "groups " + "/".join(_fmt(g) for g in spec.groups)
    return "custom"
