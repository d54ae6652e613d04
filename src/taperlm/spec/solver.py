"""The exact integer size solver of a taper (pure Python; no torch).

The solver turns a taper's multipliers r_l (`taperlm.spec.taper`) into integers that are multiples
of `multiple_of` and whose sum is exactly L * B, so a tapered model holds exactly the parameters
and FLOPs of its baseline (the paper's principle and schedules):

1. w_l = round(r_l * B / m) * m for every layer (m = multiple_of);
2. the first and last layers stay pinned at their rounded values;
3. the remaining difference L*B - sum(w) is removed one step of m at a time from the interior
   layers whose rounding error points the same way (largest remainder first), never breaking the
   monotone order of a monotone schedule and never dropping a width below 1 step (nor a layer
   that rounded to 0 below 0).

Zero sizes: the MLP widths (`zero_ok=True`) may be 0 where the schedule asks for it (its
multiplier x baseline rounds to 0 steps of m, e.g. cosine:2:0's last layer, or a custom width 0):
that layer is attention only. Heads and memory widths must stay >= 1 (`zero_ok=False`).

A spec that gives its sizes outright (custom widths) is checked instead of solved. A schedule
whose layers come in blocks of one size (`groups`: `Schedule.blocks`) is solved block by block
instead (`_solve_units`): its groups stay equal. A symmetric schedule (bell, hourglass:
`Schedule.mirrored`) is solved pair by pair the same way (layer l with layer L-1-l), so its
widths stay symmetric wherever the budget can be split into equal pairs.
"""

from __future__ import annotations

import itertools
import math

from taperlm.errors import TaperError
from taperlm.spec.taper import TaperSpec, multipliers

# How far the multipliers' mean may stray from 1 before the solver tries to repair it (uneven group
# sizes in shallow models give e.g. 1.125); beyond this the schedule itself breaks the budget.
MAX_MEAN_DEVIATION = 0.25


def solve_sizes(
    spec: TaperSpec,
    n_layers: int,
    baseline: int,
    *,
    what: str = "mlp width",
    total: int | None = None,
    zero_ok: bool = False,
) -> list[int]:
    """Resolve `spec` to one integer size per layer with sum exactly n_layers * baseline, or
    `total` when given (a multiple of multiple_of: e.g. the MLP widths that take up the
    parameters a KV taper saves); the multipliers then scale the mean size total / n_layers.

    `what` names the quantity in error messages (the solver is generic over per-layer sizes);
    `zero_ok`: a layer may get size 0 where its multiplier rounds to 0 (MLP widths).
    """
    spec.validate()
    m = spec.multiple_of
    if not isinstance(baseline, int) or baseline < 1:
        raise TaperError(f"baseline {what} must be a positive integer, got {baseline!r}")
    if n_layers < 1:
        raise TaperError(f"n_layers must be >= 1, got {n_layers}")
    target = n_layers * baseline if total is None else total
    budget = f"{n_layers} x {baseline} = {target}" if total is None else f"{total} in total"
    given = spec.given_sizes()
    if given is not None:
        return _checked_given_sizes(spec, given, n_layers, target, budget, what, zero_ok)
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
    direction, enforce = _order(spec, r)
    _check_mean(spec, r)
    unit = target / (n_layers * m)  # the mean size in steps of m
    blocks = spec.record.blocks(spec, n_layers)
    if blocks is not None:
        units = _runs(blocks)
        order = (direction, enforce)
        return _solve_units(spec, r, units, unit, target // m, order, budget, zero_ok=zero_ok)
    if spec.record.mirrored and n_layers > 2:
        units = _mirror_pairs(n_layers)
        # the order kept is the half profile's, from the end layers in to the middle
        half = _direction([r[u[0]] for u in units])
        kept = half != 2 and spec.monotone is not False
        symmetric = _solve_units(
            spec, r, units, unit, target // m, (half, kept), budget, True, zero_ok=zero_ok
        )
        if symmetric is not None:
            return symmetric
        # an odd number of steps over an even depth (e.g. a KV taper's `total`) cannot be
        # split into equal pairs: the general solver below meets it, the pairs within one step
    exact = [x * unit for x in r]  # ideal size in steps
    steps = _rounded_steps(exact, r, baseline, m, what, zero_ok)
    deficit = target // m - sum(steps)
    if deficit:
        _meet_budget(steps, exact, deficit, (direction, enforce), spec, r, budget)
    return [s * m for s in steps]


def _checked_given_sizes(
    spec: TaperSpec,
    sizes: list[int],
    n_layers: int,
    target: int,
    budget: str,
    what: str,
    zero_ok: bool = False,
) -> list[int]:
    """Sizes given outright (custom widths), checked against the depth, budget, order and
    positivity (0 allowed with `zero_ok`)."""
    name = spec.schedule
    low = 0 if zero_ok else 1
    if any(s < low for s in sizes):
        raise TaperError(
            f"{name} {what}s {sizes}: every layer needs a {what} >= {low}"
            + ("" if zero_ok else " (only MLP widths may be 0)")
        )
    if len(sizes) != n_layers:
        raise TaperError(
            f"{name} taper has {len(sizes)} widths but the model has {n_layers} layers; give exactly one per layer"
        )
    given = sum(sizes)
    if given != target:
        raise TaperError(
            f"{name} {what}s sum to {given} but the budget is {budget} "
            f"(off by {given - target:+d}); adjust the list so its sum equals the budget"
        )
    if spec.monotone and _direction([float(w) for w in sizes]) == 2:
        raise TaperError(f"{name} {what}s {sizes} are not monotone but monotone=true was asked")
    return sizes


def _order(spec: TaperSpec, r: list[float]) -> tuple[int, bool]:
    """(direction of the multipliers as `_direction`, whether the solver keeps it)."""
    direction = _direction(r)
    if spec.monotone and direction == 2:
        raise TaperError(
            f"taper {spec.to_string()} is not monotone across depth but monotone=true was asked"
        )
    # A measured (novelty) allocation is monotone only by chance: its order is not enforced.
    auto = direction in (-1, 1) and not spec.measured
    return direction, auto if spec.monotone is None else bool(spec.monotone)


def _check_mean(spec: TaperSpec, r: list[float]) -> None:
    mean = sum(r) / len(r)
    if abs(mean - 1.0) > MAX_MEAN_DEVIATION:
        raise TaperError(
            f"taper {spec.to_string()} has mean multiplier {mean:.4g}, but a taper must keep the "
            f"budget: the mean must be 1.0 (e.g. start + end = 2 for cosine/linear/sigmoid, "
            f"group multipliers that average 1, custom multipliers that average 1)"
        )


def _rounded_steps(
    exact: list[float], r: list[float], baseline: int, m: int, what: str, zero_ok: bool = False
) -> list[int]:
    """Every layer's ideal size rounded to whole steps of m (half up); each must be > 0
    (>= 0 with `zero_ok`)."""
    steps = [math.floor(x + 0.5) for x in exact]
    for i, s in enumerate(steps):
        if s < 0 or (s == 0 and not zero_ok):
            raise TaperError(
                f"layer {i} {what} rounds to {s * m} (multiplier {r[i]:.4f} x {baseline}); "
                f"every layer needs a positive width — raise the end multiplier or lower multiple_of"
            )
    return steps


def _meet_budget(
    steps: list[int],
    exact: list[float],
    deficit: int,
    order: tuple[int, bool],
    spec: TaperSpec,
    r: list[float],
    budget: str,
) -> None:
    """Move `deficit` steps onto the interior layers (every layer in a model of <= 2), one at a
    time to the layer whose rounding error points that way most, keeping the order when
    `order` says so (direction, enforce); `steps` is changed in place."""
    direction, enforce = order
    n_layers, m = len(steps), spec.multiple_of
    interior = list(range(1, n_layers - 1)) if n_layers > 2 else list(range(n_layers))
    while deficit:
        sign = 1 if deficit > 0 else -1
        best, best_key = -1, None
        for i in interior:
            new = steps[i] + sign
            if new <= 0:  # a width the schedule gave is never moved to 0 (nor below)
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


def _runs(blocks: list[int]) -> list[list[int]]:
    """The layer indices of consecutive runs of the given lengths."""
    starts = [sum(blocks[:b]) for b in range(len(blocks))]
    return [list(range(s, s + c)) for s, c in zip(starts, blocks)]


def _mirror_pairs(n_layers: int) -> list[list[int]]:
    """Layer l with layer L-1-l, from the end layers in, and the middle layer alone (odd L)."""
    return [sorted({k, n_layers - 1 - k}) for k in range((n_layers + 1) // 2)]


def _unit_name(spec: TaperSpec, layers: list[int], index: int) -> str:
    if spec.record.mirrored:
        return f"layer {layers[0]}" if len(layers) == 1 else f"layers {layers[0]} and {layers[1]}"
    return f"group {index + 1}"


def _solve_units(
    spec: TaperSpec,
    r: list[float],
    units: list[list[int]],
    unit: float,
    total_steps: int,
    order: tuple[int, bool],
    budget: str,
    optional: bool = False,
    *,
    zero_ok: bool = False,
) -> list[int] | None:
    """Sizes for a schedule whose layers come in units that keep one size (groups: runs of
    consecutive layers; bell, hourglass: mirrored pairs): every unit is solved as a whole, so its
    layers stay equal (docs/tapers.md promises equal groups and symmetric shapes). `order` is kept
    across the units in their order. `optional`: None instead of the error when whole units
    cannot meet the budget (the caller has another way). `zero_ok`: a unit whose size rounds to
    0 steps may keep size 0 (MLP widths), as in the per-layer solver.

    The multipliers are first scaled to a layer-weighted mean of exactly 1 (uneven blocks, e.g.
    3 groups over 4 layers, give a mean of 1.125 as written): the ratios between units stay as
    written. Rounding leaves a deficit that whole units absorb (a unit of c layers moves the
    total by c steps), chosen to stay closest to the ideal sizes (`_block_moves`)."""
    m = spec.multiple_of
    direction, enforce = order
    counts = [len(u) for u in units]
    rb = [r[u[0]] for u in units]
    mean = sum(c * x for c, x in zip(counts, rb)) / sum(counts)
    exact = [x / mean * unit for x in rb]
    steps = [math.floor(x + 0.5) for x in exact]
    if min(steps) < 0 or (min(steps) == 0 and not zero_ok):
        at = steps.index(min(steps))
        raise TaperError(
            f"taper {spec.to_string()}: the width of {_unit_name(spec, units[at], at)} rounds to "
            f"{min(steps) * m}; every {'layer' if spec.record.mirrored else 'group'} needs a "
            "positive width: "
            + (
                "lower the strength or multiple_of"
                if spec.record.mirrored
                else "raise its multiplier or lower multiple_of"
            )
        )
    deficit = total_steps - sum(c * s for c, s in zip(counts, steps))
    best = _block_moves(counts, exact, steps, deficit, direction if enforce else None)
    if best is None:
        if optional:
            return None
        raise TaperError(
            f"taper {spec.to_string()} cannot keep its groups equal at the budget {budget} "
            f"with multiple_of={m}: {abs(deficit)} step(s) of {m} cannot be "
            f"{'added' if deficit > 0 else 'removed'} by whole groups"
            + (" without breaking the monotone order" if enforce else "")
            + "; use a depth divisible by the number of groups, or a smaller multiple_of"
        )
    sizes = [0] * len(r)
    for layers, s in zip(units, best):
        for i in layers:
            sizes[i] = s * m
    return sizes


MAX_BLOCK_MOVE = 4  # steps of m a block may move from its rounded size to meet the budget


def _block_moves(
    blocks: list[int],
    exact: list[float],
    rounded: list[int],
    deficit: int,
    direction: int | None,
) -> list[int] | None:
    """Block sizes (in steps) within MAX_BLOCK_MOVE of `rounded` whose layer-weighted sum moves
    by exactly `deficit`, positive, in `direction`'s order when given (-1 non-increasing, +1
    non-decreasing, 0 constant), closest to `exact` (least sum of c * error^2): a dynamic
    programme over the blocks, its state (the sum moved so far, the last block's size). No block
    is moved to 0; one that rounded to 0 may stay there or grow (as the per-layer solver). None
    when there is none."""
    # (moved, last size) -> (cost, sizes so far)
    states: dict[tuple[int, int], tuple[float, list[int]]] = {(0, 0): (0.0, [])}
    for b, c in enumerate(blocks):
        nxt: dict[tuple[int, int], tuple[float, list[int]]] = {}
        for (moved, last), (cost, sizes) in states.items():
            for d in range(-MAX_BLOCK_MOVE, MAX_BLOCK_MOVE + 1):
                new = rounded[b] + d
                if new < 0 or (new == 0 and rounded[b]):
                    continue
                ordered = not b or direction is None or direction == 2
                if not ordered and (
                    (direction <= 0 and new > last) or (direction >= 0 and new < last)
                ):
                    continue
                key = (moved + c * d, new)
                total = cost + c * (new - exact[b]) ** 2
                if key not in nxt or total < nxt[key][0] - 1e-12:
                    nxt[key] = (total, [*sizes, new])
        states = nxt
    done = [v for (moved, _), v in states.items() if moved == deficit]
    return min(done, key=lambda v: v[0])[1] if done else None


def _keeps_order(steps: list[int], i: int, new: int, direction: int) -> bool:
    prev_ok = i == 0 or (steps[i - 1] >= new if direction <= 0 else steps[i - 1] <= new)
    next_ok = i == len(steps) - 1 or (
        new >= steps[i + 1] if direction <= 0 else new <= steps[i + 1]
    )
    return prev_ok and next_ok


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
