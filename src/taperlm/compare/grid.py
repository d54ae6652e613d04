"""The comparison grid: width allocations x seeds, each cell one run config at the same budget.

Allocations are taper spec strings (`uniform`, `cosine:1.5:0.5`, `groups:1.5,1.0,0.5`, ...),
optionally named (`wider-early=groups:1.5,1.0,0.5`). Because `groups:`/`custom:` specs contain
commas, a list is split on `;` when it has one, otherwise on commas, where a bare number after a
`groups:`/`custom:` spec continues that spec (`uniform,groups:1.5,1.0,0.5,cosine` is three).

Every cell of seed s uses train.seed = s, which the trainer uses both for the model init and
for the data order, so all allocations of one seed see the same batches in the same order and
start from the same RNG state; the only difference between them is the per-layer MLP width.
The uniform allocation is always part of the grid: it is the baseline of the paired differences.

Paper modes (PAPER.md §3, §4): `controlled` = uniform / wider-early / wider-middle / wider-late
as three equal groups of layers (multipliers 1.5/1.0/0.5 and mirrors); `sweep` = cosine, linear,
sigmoid x the five start/end ratio pairs, plus uniform. The paper's validation perplexities are
attached to the allocations they belong to.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from taperlm.config import RunConfig, to_dict
from taperlm.errors import ConfigError, TaperError
from taperlm.families import FAMILIES
from taperlm.taper import TaperSpec

PAPER_MODES = ("controlled", "sweep")
PAPER_UNIFORM_PPL = 16.28

# PAPER.md §3: (label, groups multipliers, val ppl of the 440M Transformer).
PAPER_CONTROLLED: list[tuple[str, list[float] | None, float]] = [
    ("uniform", None, 16.28),
    ("wider-early", [1.5, 1.0, 0.5], 15.96),
    ("wider-middle", [1.0, 1.5, 0.5], 16.61),
    ("wider-late", [0.5, 1.0, 1.5], 17.29),
]

# PAPER.md §4: (start, end) -> {schedule: val ppl}; 440M Transformer, 30B tokens.
PAPER_SWEEP: dict[tuple[float, float], dict[str, float]] = {
    (1.25, 0.75): {"cosine": 15.18, "linear": 15.96, "sigmoid": 16.44},
    (1.375, 0.625): {"cosine": 14.59, "linear": 15.80, "sigmoid": 16.44},
    (1.5, 0.5): {"cosine": 14.44, "linear": 15.96, "sigmoid": 16.12},
    (1.625, 0.375): {"cosine": 14.59, "linear": 15.64, "sigmoid": 15.96},
    (1.75, 0.25): {"cosine": 15.49, "linear": 16.28, "sigmoid": 17.12},
}
SWEEP_SCHEDULES = ("cosine", "linear", "sigmoid")
PAPER_SIGMOID_K = 10.0

DEFAULT_TAPERS = ("uniform", "cosine:1.5:0.5", "cosine:0.5:1.5")


@dataclass
class Allocation:
    """One width allocation: a taper spec, a directory-safe name and a display label."""

    name: str  # directory-safe, unique in the grid (runs/<name>-s<seed>)
    label: str  # shown in tables and legends
    spec: TaperSpec
    paper_ppl: float | None = None  # the paper's val ppl for this allocation, if it reports one

    @property
    def spec_string(self) -> str:
        return self.spec.to_string()

    @property
    def is_uniform(self) -> bool:
        return self.spec.schedule == "uniform"


@dataclass
class Cell:
    """One (allocation, seed) run."""

    allocation: Allocation
    seed: int
    config: RunConfig

    @property
    def name(self) -> str:
        return f"{self.allocation.name}-s{self.seed}"


@dataclass
class Grid:
    """Allocations x seeds at one budget, with the budget of each allocation."""

    allocations: list[Allocation]
    seeds: list[int]
    cells: list[Cell]
    base: RunConfig  # the uniform config of seed seeds[0]
    budget: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> params, flops, widths
    paper: str | None = None

    def cell(self, alloc_name: str, seed: int) -> Cell:
        for c in self.cells:
            if c.allocation.name == alloc_name and c.seed == seed:
                return c
        raise KeyError(f"{alloc_name}-s{seed}")

    @property
    def total_tokens(self) -> int:
        return sum(c.config.train.tokens for c in self.cells)


# ----------------------------------------------------------------------------------------------
# parsing


_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


def split_taper_list(text: str) -> list[str]:
    """Split a --tapers list into spec strings (see the module docstring)."""
    if ";" in text:
        return [p.strip() for p in text.split(";") if p.strip()]
    out: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        prev = out[-1].split("=", 1)[-1] if out else ""
        if _NUMBER.match(part) and prev.lower().startswith(("groups:", "custom:")):
            out[-1] = f"{out[-1]},{part}"
        else:
            out.append(part)
    return out


def slug(spec: TaperSpec) -> str:
    """Directory-safe name of a spec: cosine:1.5:0.5 -> cosine-1.5-0.5."""
    text = spec.to_string()
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")


def parse_allocation(text: str, multiple_of: int | None = None) -> Allocation:
    """`SPEC` or `NAME=SPEC` -> Allocation; TaperError names the bad spec."""
    name, sep, spec_text = text.partition("=")
    if not sep:
        name, spec_text = "", text
    name = name.strip()
    if sep and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise ConfigError(
            f"allocation name {name!r} in {text!r} must be letters, digits, '.', '_' or '-'"
        )
    try:
        spec = TaperSpec.parse(spec_text, multiple_of=multiple_of)
    except TaperError as err:
        raise TaperError(f"--tapers: {err}") from None
    label = name or spec.to_string()
    return Allocation(name=name or slug(spec), label=label, spec=spec)


def parse_allocations(texts: list[str], multiple_of: int | None = None) -> list[Allocation]:
    """Parse specs, add uniform first if absent, reject duplicates."""
    allocs = [parse_allocation(t, multiple_of) for t in texts]
    if not allocs:
        raise ConfigError("--tapers is empty; give e.g. --tapers 'uniform;cosine:1.5:0.5'")
    if not any(a.is_uniform for a in allocs):
        allocs.insert(0, Allocation("uniform", "uniform", TaperSpec(multiple_of=_m(multiple_of))))
    seen: dict[str, str] = {}
    for a in allocs:
        if a.name in seen:
            raise ConfigError(
                f"--tapers lists {a.name!r} twice ({seen[a.name]!r} and {a.label!r}); give each "
                "allocation once (name duplicates with NAME=SPEC)"
            )
        seen[a.name] = a.label
    attach_paper_numbers(allocs)
    return allocs


def _m(multiple_of: int | None) -> int:
    return 16 if multiple_of is None else multiple_of


# ----------------------------------------------------------------------------------------------
# paper modes


def paper_allocations(mode: str, multiple_of: int | None = None) -> list[Allocation]:
    """The allocations of `--paper controlled` or `--paper sweep` (paper numbers attached)."""
    m = _m(multiple_of)
    if mode == "controlled":
        out = []
        for label, groups, ppl in PAPER_CONTROLLED:
            if groups is None:
                spec = TaperSpec(multiple_of=m)
            else:
                spec = TaperSpec(schedule="groups", groups=list(groups), multiple_of=m)
            out.append(Allocation(name=label, label=label, spec=spec, paper_ppl=ppl))
        return out
    if mode == "sweep":
        out = [Allocation("uniform", "uniform", TaperSpec(multiple_of=m), PAPER_UNIFORM_PPL)]
        for sched in SWEEP_SCHEDULES:
            for (start, end), row in PAPER_SWEEP.items():
                spec = TaperSpec(schedule=sched, start=start, end=end, multiple_of=m)
                if sched == "sigmoid":
                    spec.steepness = PAPER_SIGMOID_K
                out.append(Allocation(slug(spec), spec.to_string(), spec, row[sched]))
        return out
    raise ConfigError(f"--paper {mode!r} is unknown; choose {' or '.join(PAPER_MODES)}")


def paper_ppl_of(spec: TaperSpec) -> float | None:
    """The paper's val ppl for an allocation it reports (uniform, §3 groups, §4 sweep)."""
    if spec.schedule == "uniform":
        return PAPER_UNIFORM_PPL
    if spec.schedule == "groups":
        for _, groups, ppl in PAPER_CONTROLLED:
            if groups is not None and [float(g) for g in spec.groups] == groups:
                return ppl
        return None
    if spec.schedule in SWEEP_SCHEDULES:
        if spec.schedule == "sigmoid" and spec.steepness != PAPER_SIGMOID_K:
            return None
        row = PAPER_SWEEP.get((float(spec.start), float(spec.end)))
        return None if row is None else row[spec.schedule]
    return None


def attach_paper_numbers(allocs: list[Allocation]) -> None:
    for a in allocs:
        if a.paper_ppl is None:
            a.paper_ppl = paper_ppl_of(a.spec)


# ----------------------------------------------------------------------------------------------
# the grid


def _differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _differences(a.get(k), b.get(k), f"{prefix}.{k}" if prefix else k)
        return out
    return [] if a == b else [prefix]


# Keys that may differ between allocations of one seed: the taper and what it resolves to.
ALLOCATION_KEYS = (
    "model.taper",
    "model.mlp_widths",
    *(f"model.{fam.name}.{key}" for fam in FAMILIES.values() for key in fam.resolved),
)


def build_grid(
    base: RunConfig, allocations: list[Allocation], seeds: list[int], paper: str | None = None
) -> Grid:
    """Cells for every allocation x seed from `base` (model + data + train), with the budget
    checks: every allocation has exactly the uniform model's parameters and FLOPs/token, and cells
    of one seed differ only in the allocation keys."""
    from taperlm.budget import flops_per_token, total_params

    if not seeds:
        raise ConfigError("--seeds must be at least 1")
    if not allocations:
        raise ConfigError("no allocations to compare")
    cells: list[Cell] = []
    budget: dict[str, dict[str, Any]] = {}
    seq_len = base.train.seq_len
    for alloc in allocations:
        try:
            model = copy.deepcopy(base.model).with_taper(alloc.spec)
        except (TaperError, ConfigError) as err:
            raise ConfigError(
                f"allocation {alloc.label!r} does not fit the model "
                f"({base.model.n_layers} layers, mlp_width {base.model.mlp_width}): {err}"
            ) from None
        budget[alloc.name] = {
            "params": total_params(model),
            "flops_per_token": flops_per_token(model, seq_len),
            "widths": list(model.mlp_widths or []),
            "baseline_width": model.mlp_width,
        }
        for seed in seeds:
            cfg = RunConfig(
                model=copy.deepcopy(model),
                data=copy.deepcopy(base.data),
                train=copy.deepcopy(base.train),
            )
            cfg.train.seed = int(seed)
            cells.append(Cell(alloc, int(seed), cfg))
    # Seed-major order: every allocation of seed 0, then of seed 1, ... so that an interrupted
    # or still-running grid already holds complete pairs.
    cells.sort(key=lambda c: seeds.index(c.seed))
    _check_budget(budget, allocations)
    _check_only_allocation_differs(cells)
    base_cfg = next(c.config for c in cells if c.allocation.is_uniform and c.seed == seeds[0])
    return Grid(allocations, list(seeds), cells, base_cfg, budget, paper)


def _check_budget(budget: dict[str, dict[str, Any]], allocations: list[Allocation]) -> None:
    ref = next(a for a in allocations if a.is_uniform)
    want = budget[ref.name]
    for a in allocations:
        got = budget[a.name]
        for key in ("params", "flops_per_token"):
            if got[key] != want[key]:
                raise ConfigError(
                    f"allocation {a.label!r} has {key} {got[key]:,} but uniform has "
                    f"{want[key]:,}; every allocation must have the same budget (check its taper "
                    "and multiple_of)"
                )


def _check_only_allocation_differs(cells: list[Cell]) -> None:
    by_seed: dict[int, dict[str, Any]] = {}
    for c in cells:
        d = to_dict(c.config)
        ref = by_seed.setdefault(c.seed, d)
        diffs = [
            k
            for k in _differences(ref, d)
            if not any(k == p or k.startswith(p + ".") for p in ALLOCATION_KEYS)
        ]
        if diffs:  # a bug, not a user error: the grid would not be a controlled comparison
            raise AssertionError(f"cells of seed {c.seed} differ beyond the allocation: {diffs}")
