"""Taper schedules and the exact integer width solver (pure Python; no torch).

A taper assigns layer l of L a multiplier r_l of a baseline size B (the MLP width of the uniform
model, or any other per-layer integer quantity: heads, memory widths, CMS level widths). The
solver turns the multipliers into integers that are multiples of `multiple_of` and whose sum is
exactly L * B, so a tapered model holds exactly the parameters and FLOPs of its baseline
(the paper's principle and schedules):

1. w_l = round(r_l * B / m) * m for every layer (m = multiple_of);
2. the first and last layers stay pinned at their rounded values;
3. the remaining difference L*B - sum(w) is removed one step of m at a time from the interior
   layers whose rounding error points the same way (largest remainder first), never breaking the
   monotone order of a monotone schedule and never dropping a width to <= 0.

Specification strings (CLI `--taper`): `uniform`, `cosine[:START:END]`, `linear[:START:END]`,
`sigmoid[:START:END[:K]]`, `groups:R1,R2,...`, `custom:V1,V2,...` (multipliers if any value has a
decimal point, widths if all are integers), `novelty:SOURCE[:STRENGTH]` (multipliers from a
measured per-layer rho_mlp, see `novelty_multipliers`).
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from taperlm.domains import MAX_WIDTH, setting, up_to
from taperlm.errors import TaperError
from taperlm.io import strict_json_loads

SCHEDULES = ("uniform", "cosine", "linear", "sigmoid", "groups", "custom", "novelty")
DEFAULT_START = 1.5
DEFAULT_END = 0.5
DEFAULT_STEEPNESS = 10.0
# Largest deviation of a novelty multiplier from 1: 0.5 spans 1.5 .. 0.5, the paper's range.
DEFAULT_STRENGTH = 0.5
# `novelty:pilot`: the rho_mlp values come from a pilot run that `taperlm compare` makes.
PILOT = "pilot"
# rho_mlp values (cosines) closer than this are taken as equal: the uniform allocation.
NOVELTY_RESOLUTION = 1e-9
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
        schedule: uniform | cosine | linear | sigmoid | groups | custom | novelty.
        start: multiplier of the baseline at the first layer (cosine/linear/sigmoid).
        end: multiplier at the last layer; start < end gives the wider-late mirror.
        steepness: k of the sigmoid schedule.
        groups: multipliers of n equal groups of consecutive layers (schedule `groups`).
        values: explicit per-layer multipliers or widths (schedule `custom`).
        values_are_widths: whether `values` are integer widths (True) or multipliers (False).
        multiple_of: every resolved size is a multiple of this (16 in the paper; 64-256 on GPUs).
        monotone: enforce a monotone result; None = enforce exactly when the multipliers are
            monotone (never for novelty, whose order is measured, not a schedule).
        strength: novelty: the largest deviation of a multiplier from 1 (0 < strength < 1).
        source: novelty: where rho_mlp was measured (a JSON file, a run dir, or `pilot`).
        rho_mlp: novelty: the measured per-layer mean rho_mlp the multipliers are made from.
    """

    schedule: str = setting("uniform", "{" + ", ".join(SCHEDULES) + "}")
    start: float = setting(DEFAULT_START, "(0, inf)")
    end: float = setting(DEFAULT_END, "(0, inf)")
    steepness: float = setting(DEFAULT_STEEPNESS, "(0, inf)")
    groups: list[float] = setting([], "(0, inf)")
    values: list[float] = setting([], "(0, inf)")
    values_are_widths: bool = False
    multiple_of: int = setting(DEFAULT_MULTIPLE_OF, up_to(MAX_WIDTH))
    monotone: bool | None = None
    strength: float = setting(DEFAULT_STRENGTH, "(0, 1)")
    source: str = setting("", "text")
    rho_mlp: list[float] = setting([], "(-inf, inf)")  # finite (a cosine, measured)

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
                "(e.g. cosine:1.5:0.5, groups:1.5,1.0,0.5, custom:4224,3840,..., novelty:pilot)"
            )
        if name == "novelty":
            return _parse_novelty(rest.strip(), text, m)
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
        if self.schedule == "novelty":
            return f"novelty:{self.source}:{_exact(self.strength)}"
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
        if self.schedule == "novelty":
            if not (isinstance(self.strength, (int, float)) and 0 < self.strength < 1):
                raise TaperError(
                    f"novelty strength must be in (0, 1) (the largest change of a layer's width, "
                    f"as a fraction of the baseline), got {self.strength!r}"
                )
            bad = [v for v in self.rho_mlp if not math.isfinite(v)]
            if bad:
                raise TaperError(f"novelty rho_mlp values must be finite, got {self.rho_mlp}")

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
        if self.schedule == "novelty":
            d.update(strength=self.strength, source=self.source, rho_mlp=list(self.rho_mlp))
        if self.monotone is not None:
            d["monotone"] = self.monotone
        return d

    def with_multiple_of(self, multiple_of: int) -> TaperSpec:
        return replace(self, multiple_of=multiple_of)

    @property
    def needs_pilot(self) -> bool:
        """A `novelty:pilot` spec whose rho_mlp values are still to be measured."""
        return self.schedule == "novelty" and self.source == PILOT and not self.rho_mlp

    def with_novelty(self, rho_mlp: list[float], source: str | None = None) -> TaperSpec:
        """This novelty spec with measured per-layer rho_mlp values (and their source)."""
        spec = replace(self, rho_mlp=[float(v) for v in rho_mlp], source=source or self.source)
        spec.validate()
        return spec


def _parse_novelty(rest: str, text: str, multiple_of: int) -> TaperSpec:
    """`novelty:SOURCE[:STRENGTH]`; SOURCE is read at once unless it is `pilot`."""
    source, strength = rest, DEFAULT_STRENGTH
    head, sep, tail = rest.rpartition(":")
    if sep and _is_number(tail):
        source, strength = head, _number(tail, text)
    if not source:
        raise TaperError(
            f"taper {text!r}: novelty needs a source, e.g. novelty:novelty.json, novelty:RUN_DIR "
            "or (in taperlm compare) novelty:pilot, optionally with :STRENGTH"
        )
    spec = TaperSpec(schedule="novelty", multiple_of=multiple_of, strength=strength, source=source)
    spec.validate()
    return spec if source == PILOT else spec.with_novelty(read_rho_mlp(source))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def read_rho_mlp(source: str | Path) -> list[float]:
    """Per-layer mean rho_mlp from a novelty measurement: the JSON of `taperlm novelty --json`,
    a compare cell's result.json, a JSON object with a `rho_mlp` list, or a run dir holding
    novelty.json or result.json."""
    path = Path(source).expanduser()
    if path.is_dir():
        found = [path / n for n in ("novelty.json", "result.json") if (path / n).is_file()]
        if not found:
            raise TaperError(
                f"novelty source {path} holds no novelty measurement (novelty.json or "
                f"result.json); measure it with `taperlm novelty {path} --out "
                f"{path / 'novelty.json'}`, or use `taperlm allocate --from {path}`"
            )
        path = found[0]
    if not path.is_file():
        raise TaperError(
            f"novelty source {str(source)!r} is neither a file nor a run dir (give a novelty "
            "JSON from `taperlm novelty --json`, a run dir, or `pilot` in taperlm compare)"
        )
    try:
        data = strict_json_loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise TaperError(f"novelty source {path} is not JSON: {err.msg}") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise TaperError(f"novelty source {path} is not JSON: {err}") from None
    values = rho_mlp_of(data.get("novelty", data) if isinstance(data, dict) else data)
    if values is None:
        raise TaperError(
            f"novelty source {path} has no per-layer rho_mlp (expected the JSON of `taperlm "
            'novelty --json`, a compare result.json, or {"rho_mlp": [...]})'
        )
    return values


def rho_mlp_of(data: Any) -> list[float] | None:
    """Per-layer mean rho_mlp of a novelty result dict (`NoveltyResult.to_dict`, or a dict with
    a `rho_mlp` list); None when it holds none (an undefined mean becomes nan)."""
    if not isinstance(data, dict):
        return None
    try:
        if isinstance(data.get("rho_mlp"), list):
            return [float("nan") if v is None else float(v) for v in data["rho_mlp"]]
        layers = data.get("layers")
        if isinstance(layers, list) and layers:
            means = [layer["rho_mlp"]["mean"] for layer in layers]
            return [float("nan") if v is None else float(v) for v in means]
    except (KeyError, TypeError, ValueError):
        return None
    return None


def novelty_multipliers(rho_mlp: list[float], strength: float = DEFAULT_STRENGTH) -> list[float]:
    """The novelty rule: more width where a layer writes new directions (low rho_mlp), less
    where it reinforces the residual stream (high rho_mlp), affine in rho:

        r_l = 1 - strength * (rho_l - mean(rho)) / max_k |rho_k - mean(rho)|

    The mean multiplier is exactly 1 (the budget), the layer with the most extreme rho gets
    1 -+ strength, and every multiplier lies in [1 - strength, 1 + strength]. Equal rho in every
    layer (within NOVELTY_RESOLUTION) gives the uniform model.
    """
    if not rho_mlp:
        raise TaperError("novelty multipliers need at least one rho_mlp value")
    bad = [v for v in rho_mlp if not math.isfinite(v)]
    if bad:
        raise TaperError(
            f"novelty rho_mlp must be finite in every layer, got {rho_mlp} (a layer measured on "
            "no tokens?)"
        )
    mean = math.fsum(rho_mlp) / len(rho_mlp)
    spread = max(abs(v - mean) for v in rho_mlp)
    if spread <= NOVELTY_RESOLUTION:  # cosines this close are equal; no contrast to follow
        return [1.0] * len(rho_mlp)
    return [1.0 - strength * (v - mean) / spread for v in rho_mlp]


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
    """The real-valued multiplier of every layer before rounding (the paper's schedule formulas)."""
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
    if spec.schedule == "novelty":
        if spec.needs_pilot:
            raise TaperError(
                "taper novelty:pilot takes its rho_mlp from a pilot run, which only `taperlm "
                "compare` makes; elsewhere give a measurement: novelty:FILE.json or novelty:RUN_DIR"
            )
        if len(spec.rho_mlp) != L:
            raise TaperError(
                f"novelty taper from {spec.source or 'rho_mlp'} has {len(spec.rho_mlp)} layers "
                f"but the model has {L}; measure a pilot of the same depth"
            )
        return novelty_multipliers(spec.rho_mlp, spec.strength)
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
    spec: TaperSpec,
    n_layers: int,
    baseline: int,
    *,
    what: str = "mlp width",
    total: int | None = None,
) -> list[int]:
    """Resolve `spec` to one integer size per layer with sum exactly n_layers * baseline, or
    `total` when given (a multiple of multiple_of: e.g. the MLP widths that take up the
    parameters a KV taper saves); the multipliers then scale the mean size total / n_layers.

    `what` names the quantity in error messages (the solver is generic over per-layer sizes).
    """
    spec.validate()
    m = spec.multiple_of
    if not isinstance(baseline, int) or baseline < 1:
        raise TaperError(f"baseline {what} must be a positive integer, got {baseline!r}")
    if n_layers < 1:
        raise TaperError(f"n_layers must be >= 1, got {n_layers}")
    target = n_layers * baseline if total is None else total
    budget = f"{n_layers} x {baseline} = {target}" if total is None else f"{total} in total"

    if spec.schedule == "custom" and spec.values_are_widths:
        widths = [int(v) for v in spec.values]
        if len(widths) != n_layers:
            raise TaperError(
                f"custom taper has {len(widths)} widths but the model has {n_layers} layers; give exactly one per layer"
            )
        given = sum(widths)
        if given != target:
            raise TaperError(
                f"custom {what}s sum to {given} but the budget is {budget} "
                f"(off by {given - target:+d}); adjust the list so its sum equals the budget"
            )
        if spec.monotone and _direction([float(w) for w in widths]) == 2:
            raise TaperError(
                f"custom {what}s {widths} are not monotone but monotone=true was asked"
            )
        return widths

    if total is not None and (total % m or total < n_layers * m):
        raise TaperError(
            f"the {what}s' total {total} is not a positive multiple of multiple_of={m} per layer"
        )
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
    # A measured (novelty) allocation is monotone only by chance: its order is not enforced.
    auto = direction in (-1, 1) and spec.schedule != "novelty"
    enforce = auto if spec.monotone is None else bool(spec.monotone)

    mean = sum(r) / len(r)
    if abs(mean - 1.0) > MAX_MEAN_DEVIATION:
        raise TaperError(
            f"taper {spec.to_string()} has mean multiplier {mean:.4g}, but a taper must keep the "
            f"budget: the mean must be 1.0 (e.g. start + end = 2 for cosine/linear/sigmoid, "
            f"group multipliers that average 1, custom multipliers that average 1)"
        )
    unit = target / (n_layers * m)  # the mean size in steps of m
    exact = [x * unit for x in r]  # ideal size in steps
    steps = [math.floor(x + 0.5) for x in exact]
    for i, s in enumerate(steps):
        if s <= 0:
            raise TaperError(
                f"layer {i} {what} rounds to {s * m} (multiplier {r[i]:.4f} x {baseline}); "
                f"every layer needs a positive width — raise the end multiplier or lower multiple_of"
            )
    deficit = target // m - sum(steps)
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
                f"taper {spec.to_string()} cannot meet the budget {budget} at multiple_of={m}: "
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
    if spec.schedule == "novelty":
        return f"novelty of {spec.source} (strength {_fmt(spec.strength)})"
    return "custom"
