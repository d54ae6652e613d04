"""The comparison grid: allocations x seeds, each cell one run config at the same budget.

An allocation is an MLP taper spec (`uniform`, `cosine:1.5:0.5`, `groups:1.5,1.0,0.5`,
`novelty:pilot`, ...), optionally with a head taper (`cosine+heads:cosine:1.25:0.75`; alone:
`heads:cosine:1.25:0.75`, MLP uniform) and a KV taper (`cosine+kv:cosine:1.0:0.25`,
`heads:...+kv:...`, `kv:groups:0.5`), optionally named (`wider-early=groups:1.5,1.0,0.5`).
Because `groups:`/`custom:` specs contain commas, a list is split on `;` when it has one,
otherwise on commas, where a bare number after a `groups:`/`custom:` spec continues that spec
(`uniform,groups:1.5,1.0,0.5,cosine` is three).

`novelty:pilot[:STRENGTH]` takes its widths from the per-layer rho_mlp of a pilot: a short
uniform run of the same seed (`pilot_cells`), made before the grid; each seed gets its own
widths (`build_grid(..., pilots=)`).

Every cell of seed s uses train.seed = s, which the trainer uses both for the model init and
for the data order, so all allocations of one seed see the same batches in the same order and
start from the same RNG state; the only difference between them is the per-layer MLP width
(and heads). The uniform allocation is always part of the grid: it is the baseline of the
paired differences.

Paper modes (its controlled experiment, schedule x ratio sweep, family table): `controlled` = uniform / wider-early / wider-middle /
wider-late as three equal groups of layers (multipliers 1.5/1.0/0.5 and mirrors); `sweep` =
cosine, linear, sigmoid x the five start/end ratio pairs, plus uniform; `families` = uniform vs
cosine 1.5 -> 0.5, in one grid per model family (`taperlm.compare.families`). The paper's
validation perplexities are attached to the allocations they belong to.

The paper's reference numbers and claims, which every study puts its own measurements beside,
are data here too (docs/compare.md says where each comes from): §3's controlled experiment and
§4's schedule x ratio sweep (validation perplexities of the 440M Transformer at 30B tokens:
`PAPER_CONTROLLED`, `PAPER_SWEEP`, `PAPER_UNIFORM_PPL`, and the sweep's claims); §6's family table
(760M, 50B tokens: `PAPER_760M`); the 440M point the scaling and long-training studies
extrapolate to (`PAPER_440M`, `PAPER_POINT`). The paper's training recipe and token budgets per
size are a recipe, not a result: `taperlm.compare.recipe.PAPER_TRAIN` / `PAPER_TOKENS`."""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from dataclasses import dataclass, field, fields
from typing import Any

from taperlm.config import RunConfig, to_dict
from taperlm.config.budget import flops_per_token, kv_cache_bytes, total_params
from taperlm.errors import ConfigError, TaperError
from taperlm.families import FAMILIES
from taperlm.spec.taper import TaperSpec

# §3/§4: the 440M Transformer's validation perplexity with uniform widths.
PAPER_UNIFORM_PPL = 16.28

# §3, the controlled experiment: (label, groups multipliers, val ppl of the 440M Transformer).
PAPER_CONTROLLED: list[tuple[str, list[float] | None, float]] = [
    ("uniform", None, PAPER_UNIFORM_PPL),
    ("wider-early", [1.5, 1.0, 0.5], 15.96),
    ("wider-middle", [1.0, 1.5, 0.5], 16.61),
    ("wider-late", [0.5, 1.0, 1.5], 17.29),
]

# §4, the schedule x ratio sweep: (start, end) -> {schedule: val ppl}; 440M Transformer, 30B tokens.
PAPER_SWEEP: dict[tuple[float, float], dict[str, float]] = {
    (1.25, 0.75): {"cosine": 15.18, "linear": 15.96, "sigmoid": 16.44},
    (1.375, 0.625): {"cosine": 14.59, "linear": 15.80, "sigmoid": 16.44},
    (1.5, 0.5): {"cosine": 14.44, "linear": 15.96, "sigmoid": 16.12},
    (1.625, 0.375): {"cosine": 14.59, "linear": 15.64, "sigmoid": 15.96},
    (1.75, 0.25): {"cosine": 15.49, "linear": 16.28, "sigmoid": 17.12},
}
SWEEP_SCHEDULES = ("cosine", "linear", "sigmoid")  # §4's claim: better in this order per ratio
PAPER_SIGMOID_K = 10.0  # the steepness of the sweep's sigmoid schedule
# §4's claim: the best cosine ratio (report.json's sweep_claims.best_cosine_ratio_paper).
PAPER_BEST_SWEEP_RATIO = "1.5->0.5"

# §6, the family table, 760M parameters / 50B tokens: family -> (the paper's name, uniform,
# + tapered), one value per column of PAPER_760M_COLUMNS.
PAPER_760M_COLUMNS = (
    "Wiki ppl",
    "LMB ppl",
    "LMB acc",
    "PIQA",
    "Hella",
    "Wino",
    "ARC-e",
    "ARC-c",
    "SIQA",
    "BoolQ",
    "Avg",
)
PAPER_760M: dict[str, tuple[str, tuple[float, ...], tuple[float, ...]]] = {
    "transformer": (
        "Transformer++",
        (21.86, 22.29, 39.0, 68.7, 46.3, 57.1, 66.8, 35.3, 42.5, 62.3, 52.25),
        (21.42, 21.25, 40.1, 69.3, 47.0, 57.3, 66.7, 35.9, 43.0, 63.4, 52.84),
    ),
    "gated": (
        "Gated Attention",
        (20.74, 21.85, 39.7, 69.2, 46.3, 57.9, 68.4, 35.5, 41.8, 62.1, 52.61),
        (19.98, 21.44, 40.0, 69.3, 46.8, 57.8, 69.1, 35.8, 41.6, 62.6, 52.88),
    ),
    "hope": (
        "Hope-attention",
        (20.62, 21.29, 40.2, 70.1, 50.6, 56.8, 69.9, 37.1, 41.3, 63.5, 53.69),
        (20.50, 21.07, 40.3, 70.7, 51.0, 57.4, 69.2, 38.1, 41.8, 63.9, 54.05),
    ),
    "titans": (
        "Titans",
        (21.58, 23.09, 39.2, 67.7, 50.0, 52.8, 68.0, 35.6, 41.4, 63.7, 52.30),
        (20.77, 22.92, 39.9, 69.0, 51.6, 54.5, 67.9, 36.1, 42.5, 64.8, 53.29),
    ),
}
# §6's claim, quoted beside the family table's tally.
PAPER_760M_CLAIM = "tapered better in every family, single runs"

# The 440M Transformer at 30B tokens (68 tokens per parameter) that the scaling and long-training
# studies extrapolate to: §4's uniform 16.28 and cosine 1.5 -> 0.5 14.44 validation perplexity
# (read from PAPER_SWEEP, not copied); its best ratio is 1.5.
PAPER_440M_PARAMS = 440e6
PAPER_440M_TOKENS = 30e9
PAPER_BEST = 1.5  # the best cosine start ratio at 440M (end = 2 - start)


@dataclass(frozen=True)
class Paper440M:
    """The paper's 440M point (trend.json's `meta.paper_440m`, with its difference and best)."""

    params: float
    tokens_per_param: float
    ppl: tuple[float, float]  # validation perplexity: uniform, cosine 1.5 -> 0.5

    @property
    def diff(self) -> float:
        """ln(tapered / uniform perplexity): the taper's advantage in nats."""
        return math.log(self.ppl[1]) - math.log(self.ppl[0])

    def to_json(self) -> dict[str, Any]:
        return {"params": self.params, "tokens_per_param": self.tokens_per_param, "ppl": self.ppl}


PAPER_440M = Paper440M(
    params=PAPER_440M_PARAMS,
    tokens_per_param=PAPER_440M_TOKENS / PAPER_440M_PARAMS,
    ppl=(PAPER_UNIFORM_PPL, PAPER_SWEEP[(1.5, 0.5)]["cosine"]),
)
PAPER_DIFF = PAPER_440M.diff  # -0.1199 nats


@dataclass(frozen=True)
class PaperPoint:
    """The same point as the scaling report's `meta.paper_point`: the ratio sweep at 440M
    (docs/compare.md)."""

    params: float
    tokens: float
    best_start: float  # its best cosine start ratio

    def to_json(self) -> dict[str, float]:
        return {"params": self.params, "tokens": self.tokens, "best_start": self.best_start}


PAPER_POINT = PaperPoint(PAPER_440M_PARAMS, PAPER_440M_TOKENS, PAPER_BEST)


@dataclass(frozen=True)
class Paper760M:
    """The paper's 760M rows of one family: uniform and tapered per column (PAPER_760M_COLUMNS)
    and the changes it reports (% for the perplexities, accuracy points for Avg)."""

    name: str  # the family's name in the paper
    uniform: dict[str, float]  # column -> value
    tapered: dict[str, float]
    change: dict[str, float]  # "Wiki ppl", "LMB ppl" (%), "Avg" (points)

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Paper760M:
        return cls(**{f.name: data[f.name] for f in fields(cls)})


def paper_760m(family: str) -> Paper760M | None:
    """The paper's 760M rows of `family`, or None if it has none."""
    row = PAPER_760M.get(family)
    if row is None:
        return None
    name, uniform, tapered = row
    u, t = dict(zip(PAPER_760M_COLUMNS, uniform)), dict(zip(PAPER_760M_COLUMNS, tapered))
    change = {c: 100.0 * (t[c] - u[c]) / u[c] for c in ("Wiki ppl", "LMB ppl")}
    change["Avg"] = t["Avg"] - u["Avg"]  # accuracy points
    return Paper760M(name, u, t, change)


DEFAULT_TAPERS = ("uniform", "cosine:1.5:0.5")
HEADS = "heads:"  # an allocation's head-taper component: SPEC+heads:HEAD_SPEC or heads:HEAD_SPEC
KV = "kv:"  # an allocation's KV-taper component: SPEC[+heads:HEAD_SPEC]+kv:KV_SPEC or kv:KV_SPEC
PILOT_NAME = "pilot"  # pilot runs live in runs/pilot-s<seed>
# Placeholder rho for checking a novelty:pilot allocation before its pilot ran: alternating
# extremes give multipliers 1 +- strength, the narrowest and widest layers it can produce.
_PROBE_RHO = (0.0, 1.0)
# `--paper families` (the paper's family table): every family, uniform vs the paper's taper.
FAMILIES_TAPERS = ("uniform", "cosine:1.5:0.5")


def uniform_heads() -> TaperSpec:
    """A uniform head or KV taper (in steps of 1: the model applies its own step)."""
    return TaperSpec(multiple_of=1)


@dataclass
class Allocation:
    """One allocation, parsed once (`parse_allocation`, where the options are read): its MLP,
    head and KV taper specs, a directory-safe name and a label. Every consumer reads the specs;
    `spec_string` is the text written back (report names, JSON, the reproducing command)."""

    name: str  # directory-safe, unique in the grid (runs/<name>-s<seed>)
    label: str  # shown in tables and legends
    spec: TaperSpec
    paper_ppl: float | None = None  # the paper's val ppl for this allocation, if it reports one
    # model.head_taper / model.kv_taper, canonical (written as their `to_string()`)
    head_taper: TaperSpec = field(default_factory=uniform_heads)
    kv_taper: TaperSpec = field(default_factory=uniform_heads)

    @property
    def spec_string(self) -> str:
        """The allocation as written in --tapers (without its name)."""
        parts = [] if self.spec.is_uniform else [self.spec.to_string()]
        parts += [] if self.head_taper.is_uniform else [f"{HEADS}{self.head_taper.to_string()}"]
        parts += [] if self.kv_taper.is_uniform else [f"{KV}{self.kv_taper.to_string()}"]
        return "+".join(parts) or self.spec.to_string()

    @property
    def is_uniform(self) -> bool:
        return self.spec.is_uniform and self.tapers_no_heads

    @property
    def tapers_no_heads(self) -> bool:
        """Whether the head and KV tapers are uniform (the paper tapers only MLP widths)."""
        return self.head_taper.is_uniform and self.kv_taper.is_uniform

    @property
    def start_ratio(self) -> float:
        """The MLP taper's first-layer multiplier (uniform: 1.0), a sweep's ratio axis."""
        return 1.0 if self.spec.is_uniform else float(self.spec.start)

    @property
    def needs_pilot(self) -> bool:
        return self.spec.needs_pilot

    def at_step(self, multiple_of: int | None) -> Allocation:
        """This allocation with its MLP widths in steps of `multiple_of` (None: the taper's
        default), the comparison's: the step is no part of the text it was parsed from."""
        return dataclasses.replace(
            self, spec=dataclasses.replace(self.spec, multiple_of=_m(multiple_of))
        )

    def spec_for(self, seed: int, pilots: dict[int, list[float]] | None, n_layers: int):
        """The MLP taper of this allocation's cell of `seed`: a novelty:pilot spec gets the
        rho_mlp of that seed's pilot (or, before the pilots ran, a probe of its extremes)."""
        if not self.needs_pilot:
            return self.spec
        if pilots is None:
            return self.spec.with_novelty([_PROBE_RHO[i % 2] for i in range(n_layers)])
        return self.spec.with_novelty(pilots[seed], source=f"runs/{PILOT_NAME}-s{seed}")


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
class AllocationBudget:
    """What one allocation's model costs and how it is shaped (report.json's allocation entry
    copies it); `build_grid` checks that every allocation's params (and FLOPs/token) are the
    uniform model's."""

    params: int  # parameters
    flops_per_token: int  # training FLOPs per token
    widths: list[int]  # MLP width per layer (a novelty:pilot allocation: its first seed's)
    baseline_width: int  # the uniform model's MLP width
    heads: list[int]  # attention heads per layer
    baseline_heads: int  # the uniform model's heads
    kv_heads: list[int]  # KV heads per layer
    kv_cache_bytes_per_token_bf16: int  # its KV cache per token in bf16
    # a novelty:pilot allocation: seed -> its widths (None: the widths depend on no seed)
    widths_by_seed: dict[str, list[int]] | None = None


@dataclass
class Grid:
    """Allocations x seeds at one budget, with the budget of each allocation."""

    allocations: list[Allocation]
    seeds: list[int]
    cells: list[Cell]
    base: RunConfig  # the uniform config of seed seeds[0]
    budget: dict[str, AllocationBudget] = field(default_factory=dict)  # allocation name -> its
    paper: str | None = None
    pilot: Pilots | None = None  # the pilots of novelty:pilot allocations (None: no such)

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
        prev = re.split(r"=|\+?(?:heads|kv):", out[-1], flags=re.IGNORECASE)[-1] if out else ""
        if _NUMBER.match(part) and prev.lower().startswith(("groups:", "custom:")):
            out[-1] = f"{out[-1]},{part}"
        else:
            out.append(part)
    return out


def slug(spec: TaperSpec | str) -> str:
    """Directory-safe name of a spec: cosine:1.5:0.5 -> cosine-1.5-0.5 (a novelty spec is named
    by its source and strength, not by the path's characters)."""
    text = spec if isinstance(spec, str) else spec.to_string()
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")


def parse_allocation(text: str, multiple_of: int | None = None) -> Allocation:
    """`[NAME=]SPEC[+heads:HEAD_SPEC][+kv:KV_SPEC]` (SPEC may be left out before a heads: or kv:
    part) -> Allocation; TaperError names the bad spec."""
    name, sep, spec_text = text.partition("=")
    if not sep:
        name, spec_text = "", text
    name = name.strip()
    if sep and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise ConfigError(
            f"allocation name {name!r} in {text!r} must be letters, digits, '.', '_' or '-'"
        )
    mlp_text, head_text, kv_text = _split_parts(spec_text.strip(), text)
    try:
        spec = TaperSpec.parse(mlp_text, multiple_of=multiple_of)
        heads, kv = _canonical(head_text, "heads"), _canonical(kv_text, "KV heads")
    except TaperError as err:
        raise TaperError(f"--tapers {text!r}: {err}") from None
    alloc = Allocation(name="", label="", spec=spec, head_taper=heads, kv_taper=kv)
    alloc.label = name or alloc.spec_string
    alloc.name = name or slug(alloc.spec_string)
    return alloc


def _canonical(text: str, what: str) -> TaperSpec:
    """A head or KV spec checked for syntax, kept canonical (written cosine:1.5:0.5 for
    `cosine`: the copy drops the text it was parsed from); its steps are resolved against the
    model later."""
    if text == "uniform":
        return uniform_heads()
    spec = TaperSpec.parse(text, multiple_of=1)
    if spec.measured:
        raise TaperError(f"novelty allocations act on MLP widths, not on {what}")
    return dataclasses.replace(spec)


def _split_parts(spec_text: str, text: str) -> tuple[str, str, str]:
    """(MLP spec, head spec, KV spec) of `[SPEC][+heads:HEAD_SPEC][+kv:KV_SPEC]`, in that
    order; a missing part is uniform."""
    pieces = re.split(r"(?:^|\+)(heads:|kv:)", spec_text, flags=re.IGNORECASE)
    mlp = pieces[0].strip() or "uniform"
    found: dict[str, str] = {}
    for key, value in zip(pieces[1::2], pieces[2::2]):
        key = key.lower()
        if key in found:
            raise TaperError(f"--tapers {text!r}: give at most one +{key} part")
        if found and key == HEADS:
            raise TaperError(f"--tapers {text!r}: write +heads: before +kv:")
        found[key] = value.strip() or "?"
    if not pieces[0].strip() and not found:
        mlp = spec_text
    return mlp, found.get(HEADS, "uniform"), found.get(KV, "uniform")


def parse_allocations(texts: list[str], multiple_of: int | None = None) -> list[Allocation]:
    """Parse specs, add uniform first if absent, reject duplicates."""
    return complete_allocations([parse_allocation(t, multiple_of) for t in texts], multiple_of)


def complete_allocations(
    given: list[Allocation], multiple_of: int | None = None
) -> list[Allocation]:
    """The parsed allocations of a comparison: uniform added first if absent, duplicates
    rejected, the paper's numbers attached (to copies: the options' allocations stay as given)."""
    allocs = list(given)
    if not allocs:
        raise ConfigError("--tapers is empty; give e.g. --tapers 'uniform;cosine:1.5:0.5'")
    if not any(a.is_uniform for a in allocs):
        allocs.insert(0, Allocation("uniform", "uniform", TaperSpec(multiple_of=_m(multiple_of))))
    if any(a.name == PILOT_NAME for a in allocs):
        raise ConfigError(f"allocation name {PILOT_NAME!r} is reserved for the pilot runs")
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


# The paper's grids, each the allocations of the --paper mode that trains it
# (`taperlm.compare.options.PaperMode.allocations`), paper numbers attached.


def controlled_allocations(multiple_of: int | None = None) -> list[Allocation]:
    """§3's controlled experiment: uniform and three equal groups of layers."""
    m = _m(multiple_of)
    out = []
    for label, groups, ppl in PAPER_CONTROLLED:
        if groups is None:
            spec = TaperSpec(multiple_of=m)
        else:
            spec = TaperSpec(schedule="groups", groups=list(groups), multiple_of=m)
        out.append(Allocation(name=label, label=label, spec=spec, paper_ppl=ppl))
    return out


def sweep_allocations(multiple_of: int | None = None) -> list[Allocation]:
    """§4's sweep: uniform and every schedule x (start, end) pair."""
    m = _m(multiple_of)
    out = [Allocation("uniform", "uniform", TaperSpec(multiple_of=m), PAPER_UNIFORM_PPL)]
    for sched in SWEEP_SCHEDULES:
        for (start, end), row in PAPER_SWEEP.items():
            spec = TaperSpec(schedule=sched, start=start, end=end, multiple_of=m)
            if sched == "sigmoid":
                spec.steepness = PAPER_SIGMOID_K
            out.append(Allocation(slug(spec), spec.to_string(), spec, row[sched]))
    return out


def families_allocations(multiple_of: int | None = None) -> list[Allocation]:
    """§6's table, per family: uniform vs cosine 1.5 -> 0.5."""
    return parse_allocations(list(FAMILIES_TAPERS), multiple_of)


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
    """Each allocation the paper reports replaced by a copy with its val ppl."""
    for i, a in enumerate(allocs):
        if a.paper_ppl is None and a.tapers_no_heads:  # the paper tapers no heads
            allocs[i] = dataclasses.replace(a, paper_ppl=paper_ppl_of(a.spec))


# ----------------------------------------------------------------------------------------------
# the grid


def _differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _differences(a.get(k), b.get(k), f"{prefix}.{k}" if prefix else k)
        return out
    return [] if a == b else [prefix]


# Keys that may differ between allocations of one seed: the tapers and what they resolve to.
ALLOCATION_KEYS = (
    "model.taper",
    "model.mlp_widths",
    "model.head_taper",
    "model.layer_heads",
    "model.kv_taper",
    "model.layer_kv_heads",
    *(f"model.{fam.name}.{key}" for fam in FAMILIES.values() for key in fam.resolved),
)


@dataclass(frozen=True)
class PilotRun:
    """One seed's pilot, as report.json's `pilot.per_seed[seed]` records it."""

    run: str  # its folder, runs/pilot-s<seed>
    tokens: int  # the tokens it trained
    train_s: float | None  # its training seconds, as its run recorded them
    novelty_s: float | None  # the seconds its novelty measurement took
    val_loss: float  # its validation loss
    rho_mlp: list[float]  # per layer: the widths of that seed's novelty:pilot allocations


@dataclass(frozen=True)
class Pilots:
    """The pilots of a grid's novelty:pilot allocations: one short uniform run per seed."""

    tokens: int  # training tokens of each pilot
    per_seed: dict[int, PilotRun]  # seed -> its pilot, in the seeds' order

    @property
    def rho_mlp(self) -> dict[int, list[float]]:
        """seed -> its pilot's per-layer rho_mlp (what `build_grid(..., pilots=)` takes)."""
        return {seed: run.rho_mlp for seed, run in self.per_seed.items()}


def pilot_cells(pilot_base: RunConfig, seeds: list[int]) -> list[Cell]:
    """The pilot runs of a grid with novelty:pilot allocations: `pilot_base` (the uniform
    config with the pilot's shorter training) once per seed, in runs/pilot-s<seed>."""
    alloc = Allocation(
        PILOT_NAME, PILOT_NAME, TaperSpec(multiple_of=pilot_base.model.taper.multiple_of)
    )
    cells = []
    for seed in seeds:
        cfg = copy.deepcopy(pilot_base)
        cfg.train.seed = int(seed)
        cells.append(Cell(alloc, int(seed), cfg))
    return cells


def build_grid(
    base: RunConfig,
    allocations: list[Allocation],
    seeds: list[int],
    paper: str | None = None,
    pilots: dict[int, list[float]] | None = None,
) -> Grid:
    """Cells for every allocation x seed from `base` (model + data + train), with the budget
    checks: every allocation has exactly the uniform model's parameters and FLOPs/token, and cells
    of one seed differ only in the allocation keys. `pilots` (seed -> per-layer rho_mlp of its
    pilot) resolves novelty:pilot allocations; without it they are checked with probe values."""
    if not seeds:
        raise ConfigError("--seeds must be at least 1")
    if not allocations:
        raise ConfigError("no allocations to compare")
    cells: list[Cell] = []
    budget: dict[str, AllocationBudget] = {}
    seq_len = base.train.seq_len
    for alloc in allocations:
        for seed in seeds:
            spec = alloc.spec_for(seed, pilots, base.model.n_layers)
            model = _allocated(base.model, alloc, spec)
            entry = AllocationBudget(
                params=total_params(model),
                flops_per_token=flops_per_token(model, seq_len),
                widths=list(model.mlp_widths or []),
                baseline_width=model.mlp_width,
                heads=[model.attention_heads(i)[0] for i in range(model.n_layers)],
                baseline_heads=model.n_heads,
                kv_heads=[model.attention_heads(i)[1] for i in range(model.n_layers)],
                kv_cache_bytes_per_token_bf16=sum(kv_cache_bytes(model, 1, 2)),
            )
            if alloc.needs_pilot:  # widths differ by seed: the first seed's, and all of them
                first = budget.setdefault(alloc.name, entry)
                first.widths_by_seed = (first.widths_by_seed or {}) | {str(seed): entry.widths}
                _check_budget(alloc, entry, first)
            else:
                budget.setdefault(alloc.name, entry)
            cfg = RunConfig(
                model=model, data=copy.deepcopy(base.data), train=copy.deepcopy(base.train)
            )
            cfg.train.seed = int(seed)
            cells.append(Cell(alloc, int(seed), cfg))
    # Seed-major order: every allocation of seed 0, then of seed 1, ... so that an interrupted
    # or still-running grid already holds complete pairs.
    cells.sort(key=lambda c: seeds.index(c.seed))
    uniform = budget[next(a for a in allocations if a.is_uniform).name]
    for a in allocations:
        _check_budget(a, budget[a.name], uniform)
    _check_only_allocation_differs(cells)
    base_cfg = next(c.config for c in cells if c.allocation.is_uniform and c.seed == seeds[0])
    return Grid(allocations, list(seeds), cells, base_cfg, budget, paper)


def _allocated(model: Any, alloc: Allocation, spec: TaperSpec) -> Any:
    """A copy of the base model config with the allocation's tapers, resolved."""
    try:
        # copies: each cell's config owns its specs
        heads = copy.deepcopy(alloc.head_taper)
        kv = None if alloc.kv_taper.is_uniform else copy.deepcopy(alloc.kv_taper)
        return copy.deepcopy(model).with_taper(spec, heads, kv)
    except (TaperError, ConfigError) as err:
        raise ConfigError(
            f"allocation {alloc.label!r} does not fit the model ({model.n_layers} layers, "
            f"mlp_width {model.mlp_width}, {model.n_heads} heads): {err}"
        ) from None


def _check_budget(alloc: Allocation, got: AllocationBudget, want: AllocationBudget) -> None:
    # A KV taper keeps the parameters; its FLOPs/token are equal too except in a family that
    # repeats K/V projections (Titans MAC, taperlm.config.budget), where they may differ by design.
    keys = ("params", "flops_per_token") if alloc.kv_taper.is_uniform else ("params",)
    for key in keys:
        if getattr(got, key) != getattr(want, key):
            raise ConfigError(
                f"allocation {alloc.label!r} has {key} {getattr(got, key):,} but uniform has "
                f"{getattr(want, key):,}; every allocation must have the same budget (check its taper "
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
