"""Taper schedules: the spec language and one record per schedule (pure Python; no torch).

A taper assigns layer l of L a multiplier r_l of a baseline size B (the MLP width of the uniform
model, or any other per-layer integer quantity: heads, memory widths, CMS level widths);
`taperlm.spec.solver` turns the multipliers into integer sizes at exactly L * B.

Specification strings (CLI `--taper`): `uniform`, `cosine[:START:END]`, `linear[:START:END]`,
`sigmoid[:START:END[:K]]`, `bell[:STRENGTH]`, `hourglass[:STRENGTH]`, `groups:R1,R2,...`, `custom:V1,V2,...` (multipliers if any value has a
decimal point, widths if all are integers), `novelty:SOURCE[:STRENGTH]` (multipliers from a
measured per-layer rho_mlp, see `novelty_multipliers`).

Each schedule is one `Schedule` record in the `SCHEDULES` registry (its parser, canonical string,
checks, YAML settings, multipliers and label); `TaperSpec`, the solver, `taperlm plan` and the
head and KV tapers reach a schedule only through its record, so a new schedule is one record
given to `register_schedule` (docs/tapers.md, "Adding a schedule").
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from taperlm.errors import TaperError, UnsafeFileError
from taperlm.files.io import MAX_RECORD_BYTES, quoted, read_json
from taperlm.spec.domains import MAX_WIDTH, Domain, setting, up_to

DEFAULT_START = 1.5
DEFAULT_END = 0.5
DEFAULT_STEEPNESS = 10.0
# bell/hourglass: the multiplier difference between the middle and the end layers (as wide a
# contrast as cosine 1.25 -> 0.75); below MAX_BUMP every depth keeps every multiplier > 0 for bell.
DEFAULT_BUMP = 0.5
MAX_BUMP = 2.0
# Largest deviation of a novelty multiplier from 1: 0.5 spans 1.5 .. 0.5, the paper's range.
DEFAULT_STRENGTH = 0.5
# `novelty:pilot`: the rho_mlp values come from a pilot run that `taperlm compare` makes.
PILOT = "pilot"
# rho_mlp values (cosines) closer than this are taken as equal: the uniform allocation.
NOVELTY_RESOLUTION = 1e-9
DEFAULT_MULTIPLE_OF = 16


# ----------------------------------------------------------------------------------------------
# The schedule record and its registry


@dataclass(frozen=True)
class Schedule:
    """One taper schedule: everything taperlm knows of it. `register_schedule` makes its name a
    spec (`--taper NAME[:ARGS]`, `taper: {schedule: NAME, ...}` in YAML, head and KV tapers).
    """

    name: str
    """the spec's first word (`cosine` in `cosine:1.5:0.5`)."""
    parse: Callable[[TaperSpec, str, str], TaperSpec]
    """(spec, args, text) -> the spec with `args` (the text after `NAME:`, "" if none) read into its
    fields; `spec` is a fresh TaperSpec of this schedule, `text` the whole spec string for error
    messages. TaperError for bad arguments.
    """
    to_string: Callable[[TaperSpec], str]
    """the canonical spec string; `parse` reads it back to an equal spec."""
    settings: Callable[[TaperSpec], dict[str, Any]]
    """the fields it uses, as its YAML mapping writes them after schedule and multiple_of (a mapping
    that gives them reads back to an equal spec).
    """
    check: Callable[[TaperSpec], None]
    """TaperError for settings out of range (TaperSpec.validate calls it)."""
    multipliers: Callable[[TaperSpec, int], list[float]]
    """(spec, n_layers) -> the real-valued multiplier of every layer (mean 1)."""
    describe: Callable[[TaperSpec], str]
    """a short label for people (`taperlm plan`: 'cosine 1.5 -> 0.5')."""
    sizes: Callable[[TaperSpec], list[int] | None] = lambda spec: None
    """integer sizes the spec gives outright (custom widths), which the solver checks instead of
    rounding multipliers; None when it gives multipliers.
    """
    measured: bool = False
    """its multipliers are measured on the MLP (novelty's rho_mlp): they allocate MLP widths only,
    never heads or KV heads, and their order across depth is not enforced.
    """
    blocks: Callable[[TaperSpec, int], list[int] | None] = lambda spec, n_layers: None
    """(spec, n_layers) -> the lengths of the runs of consecutive layers that keep one size (groups:
    its equal groups), which the solver moves as wholes; None: any layer may move on its own.
    """
    mirrored: bool = False
    """its multipliers are symmetric about the middle of the depth (bell, hourglass): the solver
    gives layer l and layer L-1-l one size, moving them as pairs, where the budget allows it.
    """


# name -> record, in the order error messages list them.
SCHEDULES: dict[str, Schedule] = {}


def register_schedule(schedule: Schedule) -> Schedule:
    """Add a schedule (ValueError if its name is taken or is not one lower-case word)."""
    name = schedule.name
    if name in SCHEDULES:
        raise ValueError(f"taper schedule {name!r} is already registered")
    if not name or name != name.strip().lower() or any(c in name for c in ":+;="):
        raise ValueError(f"taper schedule name {name!r} must be one lower-case word")
    SCHEDULES[name] = schedule
    return schedule


def _check_positive(values: list[float], if_empty: str, what: str) -> None:
    """TaperError `if_empty` for no values, or naming the values that are not finite and >= 0
    (a multiplier or width of 0 is a layer without an MLP: `solve_sizes(zero_ok=True)`)."""
    if not values:
        raise TaperError(if_empty)
    bad = [v for v in values if not math.isfinite(v) or v < 0]
    if bad:
        raise TaperError(f"{what} must be >= 0, got {bad}")


@dataclass
class TaperSpec:
    """How per-layer sizes are derived from a baseline size."""

    schedule: str = setting("uniform", Domain.choice_of(lambda: SCHEDULES, "{schedules}"))
    """the name of a registered schedule (`SCHEDULES`): uniform | cosine | linear | sigmoid | bell
    | hourglass | groups | custom | novelty.
    """
    start: float = setting(DEFAULT_START, "[0, inf)")
    """multiplier of the baseline at the first layer (cosine/linear/sigmoid); >= 0."""
    end: float = setting(DEFAULT_END, "[0, inf)")
    """multiplier at the last layer; start < end gives the wider-late mirror. A multiplier of 0
    (here, in `groups` or `values`) or one that rounds to 0 steps of multiple_of gives an MLP
    width of 0: that layer is attention only (docs/tapers.md, "Zero widths"); head and memory
    tapers refuse it.
    """
    steepness: float = setting(DEFAULT_STEEPNESS, "(0, inf)")
    """k of the sigmoid schedule."""
    bump: float = setting(DEFAULT_BUMP, "[0, 2)")
    """bell/hourglass: the strength s, the multiplier difference between the middle and the end
    layers (0 = uniform; docs/tapers.md has the formula); an hourglass deep enough to push its
    middle below 0 is refused at that depth.
    """
    groups: list[float] = setting([], "[0, inf)")
    """multipliers of n equal groups of consecutive layers (schedule `groups`)."""
    values: list[float] = setting([], "[0, inf)")
    """explicit per-layer multipliers or widths (schedule `custom`)."""
    values_are_widths: bool = False
    """whether `values` are integer widths (True) or multipliers (False)."""
    multiple_of: int = setting(DEFAULT_MULTIPLE_OF, up_to(MAX_WIDTH))
    """every resolved size is a multiple of this (16 in the paper; 64-256 on GPUs)."""
    monotone: bool | None = None
    """enforce a monotone result; None = enforce exactly when the multipliers are monotone (never
    for novelty, whose order is measured, not a schedule).
    """
    strength: float = setting(DEFAULT_STRENGTH, "(0, 1)")
    """novelty: the largest deviation of a multiplier from 1 (0 < strength < 1)."""
    source: str = setting("", "text")
    """novelty: where rho_mlp was measured (a JSON file, a run dir, or `pilot`)."""
    rho_mlp: list[float] = setting([], "(-inf, inf)")  # finite (a cosine, measured)
    """novelty: the measured per-layer mean rho_mlp the multipliers are made from."""
    text: str = field(default="", init=False, compare=False, repr=False)
    """the spec string `parse` read (`cosine`, not its canonical `cosine:1.5:0.5`), which `as_text`
    writes back where a config keeps a spec as the user's text (the head and KV tapers); "" for a
    spec built otherwise. Not a setting: never compared, never read from a mapping, and a copy by
    `replace` drops it (its settings may differ).
    """

    @classmethod
    def parse(cls, text: str, multiple_of: int | None = None) -> TaperSpec:
        """Parse a CLI taper specification such as `cosine:1.5:0.5` or `groups:1.5,1.0,0.5`."""
        text = text.strip()
        name, _, args = text.partition(":")
        name = name.strip().lower()
        m = DEFAULT_MULTIPLE_OF if multiple_of is None else multiple_of
        if name not in SCHEDULES:
            raise TaperError(
                f"unknown taper schedule {name!r} in {quoted(text)}; choose one of {', '.join(SCHEDULES)} "
                "(e.g. cosine:1.5:0.5, groups:1.5,1.0,0.5, custom:4224,3840,..., novelty:pilot)"
            )
        spec = SCHEDULES[name].parse(cls(schedule=name, multiple_of=m), args, text)
        spec.text = text
        return spec

    @property
    def record(self) -> Schedule:
        """The registered schedule of this spec; TaperError naming the known ones otherwise."""
        if not isinstance(self.schedule, str) or self.schedule not in SCHEDULES:
            raise TaperError(
                f"unknown taper schedule {self.schedule!r}; choose one of {', '.join(SCHEDULES)}"
            )
        return SCHEDULES[self.schedule]

    def to_string(self) -> str:
        """Inverse of `parse`: `TaperSpec.parse(spec.to_string())` equals `spec` exactly."""
        return self.record.to_string(self)

    def as_text(self) -> str:
        """The spec as text: the string it was parsed from, else the canonical `to_string()`."""
        return self.text or self.to_string()

    def validate(self) -> None:
        record = self.record
        if (
            not isinstance(self.multiple_of, int)
            or isinstance(self.multiple_of, bool)
            or self.multiple_of < 1
        ):
            raise TaperError(
                f"taper multiple_of must be a positive integer, got {self.multiple_of!r}"
            )
        record.check(self)

    @property
    def is_uniform(self) -> bool:
        return self.schedule == "uniform"

    @property
    def measured(self) -> bool:
        """Multipliers measured on the MLP: for MLP widths only (`Schedule.measured`)."""
        return self.record.measured

    def given_sizes(self) -> list[int] | None:
        """The integer sizes this spec gives outright (custom widths), else None."""
        return self.record.sizes(self)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"schedule": self.schedule, "multiple_of": self.multiple_of}
        d.update(self.record.settings(self))
        if self.monotone is not None:
            d["monotone"] = self.monotone
        return d

    @property
    def needs_pilot(self) -> bool:
        """A `novelty:pilot` spec whose rho_mlp values are still to be measured."""
        return self.measured and self.source == PILOT and not self.rho_mlp

    def with_novelty(self, rho_mlp: list[float], source: str | None = None) -> TaperSpec:
        """This novelty spec with measured per-layer rho_mlp values (and their source)."""
        spec = replace(self, rho_mlp=[float(v) for v in rho_mlp], source=source or self.source)
        spec.validate()
        return spec


# Field metadata of a spec that a config holds as the user's text (the head, KV and Titans memory
# tapers): given as a string, parsed once when set (`text_spec`), and written back as that string
# (`TaperSpec.as_text`, `taperlm.config.convert`).
TEXT_SPEC = {"text_spec": True}


def text_spec(value: Any) -> Any:
    """The one parse of a spec that a config keeps as text, when the field is set: a string
    becomes a `TaperSpec` in steps of 1 (the config applies its own step where it solves); a
    text that does not parse is kept as given, for the config's `validate` to refuse with the
    parse error, in its order of checks."""
    if isinstance(value, str):
        with contextlib.suppress(TaperError):
            return TaperSpec.parse(value, multiple_of=1)
    return value


# ----------------------------------------------------------------------------------------------
# The spec language's pieces, shared by the records


def _split_args(args: str) -> list[str]:
    return [p.strip() for p in args.split(":")] if args else []


def _number(text: str, spec: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise TaperError(f"taper {spec!r}: {quoted(text)} is not a number") from None


def _fmt(x: float) -> str:
    return f"{x:g}"


def _exact(x: float) -> str:
    """Shortest string that parses back to the same float (1.5 -> '1.5', 1.0 -> '1.0')."""
    return repr(float(x))


# ----------------------------------------------------------------------------------------------
# uniform


def _parse_uniform(spec: TaperSpec, args: str, text: str) -> TaperSpec:
    if _split_args(args):
        raise TaperError(f"taper 'uniform' takes no arguments, got {quoted(text)}")
    return spec


UNIFORM = Schedule(
    name="uniform",
    parse=_parse_uniform,
    to_string=lambda spec: "uniform",
    settings=lambda spec: {},
    check=lambda spec: None,
    multipliers=lambda spec, n_layers: [1.0] * n_layers,
    describe=lambda spec: "uniform",
)


# ----------------------------------------------------------------------------------------------
# Schedules between two end multipliers: cosine, linear, sigmoid (and any `endpoint_schedule`)


def _parse_ends(spec: TaperSpec, args: str, text: str, steepness: bool = False) -> TaperSpec:
    """`NAME[:START:END]`, with `steepness` also `NAME:START:END:K`."""
    name, parts = spec.schedule, _split_args(args)
    max_args = 3 if steepness else 2
    if len(parts) not in (0, 2) and not (steepness and len(parts) == 3):
        raise TaperError(
            f"taper {quoted(text)}: expected {name} or {name}:START:END"
            + (":K" if steepness else "")
            + f" (at most {max_args} numbers)"
        )
    nums = [_number(p, text) for p in parts]
    if nums:
        spec.start, spec.end = nums[0], nums[1]
    if len(nums) == 3:
        spec.steepness = nums[2]
    spec.validate()
    return spec


def _check_ends(spec: TaperSpec) -> None:
    # 0 is allowed: cosine:2:0 gives the last layer no MLP (`solve_sizes(zero_ok=True)`; head
    # and memory tapers refuse a zero there)
    for name, v in (("start", spec.start), ("end", spec.end)):
        if not math.isfinite(v) or v < 0:
            raise TaperError(f"taper {spec.schedule} {name} multiplier must be >= 0, got {v}")


def endpoint_schedule(name: str, multipliers: Callable[[TaperSpec, int], list[float]]) -> Schedule:
    """The record of a schedule shaped by its end multipliers (`NAME[:START:END]`, 1.5:0.5 by
    default): only its multipliers are its own."""
    return Schedule(
        name=name,
        parse=_parse_ends,
        to_string=lambda spec: f"{spec.schedule}:{_exact(spec.start)}:{_exact(spec.end)}",
        settings=lambda spec: {"start": spec.start, "end": spec.end},
        check=_check_ends,
        multipliers=multipliers,
        describe=lambda spec: f"{spec.schedule} {_fmt(spec.start)} -> {_fmt(spec.end)}",
    )


def _cosine(spec: TaperSpec, n_layers: int) -> list[float]:
    s, e, L = spec.start, spec.end, n_layers
    if L == 1:
        return [(s + e) / 2]
    return [e + (s - e) * (1 + math.cos(math.pi * i / (L - 1))) / 2 for i in range(L)]


def _linear(spec: TaperSpec, n_layers: int) -> list[float]:
    s, e, L = spec.start, spec.end, n_layers
    if L == 1:
        return [(s + e) / 2]
    return [s - (s - e) * i / (L - 1) for i in range(L)]


def _sigmoid(spec: TaperSpec, n_layers: int) -> list[float]:
    s, e, k, L = spec.start, spec.end, spec.steepness, n_layers
    if L == 1:
        return [(s + e) / 2]
    # exp() is capped: it overflows for a large k (e.g. sigmoid:1.5:0.5:5000); 1/(1+e^700)~0.
    return [e + (s - e) / (1 + math.exp(min(k * (i / (L - 1) - 0.5), 700.0))) for i in range(L)]


def _check_sigmoid(spec: TaperSpec) -> None:
    _check_ends(spec)
    if not math.isfinite(spec.steepness) or spec.steepness <= 0:
        raise TaperError(f"sigmoid steepness k must be > 0, got {spec.steepness}")


COSINE = endpoint_schedule("cosine", _cosine)
LINEAR = endpoint_schedule("linear", _linear)
SIGMOID = Schedule(
    name="sigmoid",
    parse=lambda spec, args, text: _parse_ends(spec, args, text, steepness=True),
    to_string=lambda spec: (
        f"sigmoid:{_exact(spec.start)}:{_exact(spec.end)}:{_exact(spec.steepness)}"
    ),
    settings=lambda spec: {"start": spec.start, "end": spec.end, "steepness": spec.steepness},
    check=_check_sigmoid,
    multipliers=_sigmoid,
    describe=lambda spec: (
        f"sigmoid {_fmt(spec.start)} -> {_fmt(spec.end)} (k={_fmt(spec.steepness)})"
    ),
)


# ----------------------------------------------------------------------------------------------
# Symmetric shapes: bell (middle-heavy) and hourglass (wide ends, narrow middle)


def _parse_bump(spec: TaperSpec, args: str, text: str) -> TaperSpec:
    """`NAME[:STRENGTH]`."""
    parts = _split_args(args)
    if len(parts) > 1:
        raise TaperError(
            f"taper {quoted(text)}: expected {spec.schedule} or {spec.schedule}:STRENGTH "
            f"(one number, e.g. {spec.schedule}:0.5)"
        )
    if parts:
        spec.bump = _number(parts[0], text)
    spec.validate()
    return spec


def _check_bump(spec: TaperSpec) -> None:
    s = spec.bump
    if not isinstance(s, (int, float)) or not math.isfinite(s) or not 0 <= s < MAX_BUMP:
        raise TaperError(
            f"taper {spec.schedule} strength must be in [0, {MAX_BUMP:g}) (the multiplier "
            f"difference between the middle and the end layers; 0 is uniform), got {s!r}"
        )


def bump_profile(n_layers: int) -> list[float]:
    """b_l = (1 + cos(pi u_l)) / 2 with u_l = |2l - (L-1)| / (L-1): 0 at both end layers, 1 at
    the middle of the depth (a layer only when L is odd), the same for layer l and L-1-l (u is
    computed from integers, so the symmetry is exact in floating point). [0.0] for L = 1."""
    if n_layers == 1:
        return [0.0]
    span = n_layers - 1
    return [(1 + math.cos(math.pi * abs(2 * i - span) / span)) / 2 for i in range(n_layers)]


def _bump(spec: TaperSpec, n_layers: int, sign: int) -> list[float]:
    """r_l = 1 + sign * s * (b_l - mean b): mean exactly 1 (up to rounding of floats), so the
    solver meets the budget; sign +1 is the bell, -1 the hourglass. TaperError where a layer's
    multiplier would fall below 0 at this depth (only an hourglass can, its middle)."""
    b = bump_profile(n_layers)
    mean = math.fsum(b) / n_layers
    r = [1 + sign * spec.bump * (x - mean) for x in b]
    low = min(r)
    if low < 0:
        # the multiplier is lowest where b is furthest from its mean on the narrow side
        worst = max(x - mean for x in b) if sign < 0 else mean - min(b)
        raise TaperError(
            f"taper {spec.to_string()} gives layer {r.index(low)} of {n_layers} the multiplier "
            f"{low:.4g}; widths must be >= 0: at {n_layers} layers the strength may be at most "
            f"{1 / worst:.4g}"
        )
    return r


def bump_schedule(name: str, sign: int, label: str) -> Schedule:
    """The record of a symmetric shape `NAME[:STRENGTH]` (bell: sign +1, hourglass: -1)."""
    return Schedule(
        name=name,
        parse=_parse_bump,
        to_string=lambda spec: f"{spec.schedule}:{_exact(spec.bump)}",
        settings=lambda spec: {"bump": spec.bump},
        check=_check_bump,
        multipliers=lambda spec, n_layers: _bump(spec, n_layers, sign),
        describe=lambda spec: f"{spec.schedule} {_fmt(spec.bump)} ({label})",
        mirrored=True,
    )


BELL = bump_schedule("bell", +1, "wide middle")
HOURGLASS = bump_schedule("hourglass", -1, "narrow middle")


# ----------------------------------------------------------------------------------------------
# Lists: groups and custom


def _parse_list(spec: TaperSpec, args: str, text: str) -> list[str]:
    """The comma-separated items of `NAME:V1,V2,...`."""
    name, parts = spec.schedule, _split_args(args)
    if not parts or not parts[0]:
        raise TaperError(
            f"taper {quoted(text)}: {name} needs a comma-separated list, e.g. {name}:1.5,1.0,0.5"
        )
    if len(parts) > 1:
        raise TaperError(f"taper {quoted(text)}: use commas between {name} values, not colons")
    return [p.strip() for p in parts[0].split(",")]


def _parse_groups(spec: TaperSpec, args: str, text: str) -> TaperSpec:
    spec.groups = [_number(p, text) for p in _parse_list(spec, args, text)]
    spec.validate()
    return spec


def _group_sizes(spec: TaperSpec, n_layers: int) -> list[int]:
    """n groups of consecutive layers, sizes differing by at most one (earlier groups larger)."""
    n, L = len(spec.groups), n_layers
    if n > L:
        raise TaperError(f"taper groups: {n} groups need at least {n} layers, the model has {L}")
    return [L // n + (1 if g < L % n else 0) for g in range(n)]


def _groups(spec: TaperSpec, n_layers: int) -> list[float]:
    sizes = _group_sizes(spec, n_layers)
    out: list[float] = []
    for g, size in enumerate(sizes):
        out.extend([spec.groups[g]] * size)
    return out


GROUPS = Schedule(
    name="groups",
    parse=_parse_groups,
    to_string=lambda spec: "groups:" + ",".join(_exact(g) for g in spec.groups),
    settings=lambda spec: {"groups": list(spec.groups)},
    check=lambda spec: _check_positive(
        spec.groups,
        "taper 'groups' needs at least one group multiplier, e.g. groups:1.5,1.0,0.5",
        "group multipliers",
    ),
    multipliers=_groups,
    describe=lambda spec: "groups " + "/".join(_fmt(g) for g in spec.groups),
    blocks=_group_sizes,
)


def _parse_custom(spec: TaperSpec, args: str, text: str) -> TaperSpec:
    items = _parse_list(spec, args, text)
    spec.values = [_number(p, text) for p in items]
    spec.values_are_widths = all(("." not in p and "e" not in p.lower()) for p in items)
    spec.validate()
    return spec


def _custom_string(spec: TaperSpec) -> str:
    if spec.values_are_widths:
        return "custom:" + ",".join(str(int(v)) for v in spec.values)
    # repr of a float always has a '.' or an exponent, so parse reads multipliers back.
    return "custom:" + ",".join(_exact(v) for v in spec.values)


def _check_custom(spec: TaperSpec) -> None:
    _check_positive(
        spec.values,
        "taper 'custom' needs one value per layer, e.g. custom:4224,2816,1408",
        "custom taper values",
    )
    if spec.values_are_widths and any(v != int(v) for v in spec.values):
        raise TaperError("custom widths must be integers")


def _custom(spec: TaperSpec, n_layers: int) -> list[float]:
    if len(spec.values) != n_layers:
        raise TaperError(
            f"custom taper has {len(spec.values)} values but the model has {n_layers} layers; give exactly one per layer"
        )
    if spec.values_are_widths:
        raise TaperError("custom widths have no multipliers; resolve them with solve_sizes")
    return [float(v) for v in spec.values]


CUSTOM = Schedule(
    name="custom",
    parse=_parse_custom,
    to_string=_custom_string,
    settings=lambda spec: {
        "values": [int(v) if spec.values_are_widths else v for v in spec.values],
        "values_are_widths": spec.values_are_widths,
    },
    check=_check_custom,
    multipliers=_custom,
    describe=lambda spec: "custom",
    sizes=lambda spec: [int(v) for v in spec.values] if spec.values_are_widths else None,
)


# ----------------------------------------------------------------------------------------------
# novelty: multipliers from a measured per-layer rho_mlp


def _parse_novelty(spec: TaperSpec, args: str, text: str) -> TaperSpec:
    """`novelty:SOURCE[:STRENGTH]`; SOURCE is read at once unless it is `pilot`."""
    rest = args.strip()
    source, strength = rest, DEFAULT_STRENGTH
    head, sep, tail = rest.rpartition(":")
    if sep:
        with contextlib.suppress(ValueError):  # a last part that is no number is in the source
            source, strength = head, float(tail)
    if not source:
        raise TaperError(
            f"taper {quoted(text)}: novelty needs a source, e.g. novelty:novelty.json, novelty:RUN_DIR "
            "or (in taperlm compare) novelty:pilot, optionally with :STRENGTH"
        )
    spec.strength, spec.source = strength, source
    spec.validate()
    return spec if source == PILOT else spec.with_novelty(read_rho_mlp(source))


def _check_novelty(spec: TaperSpec) -> None:
    if not (isinstance(spec.strength, (int, float)) and 0 < spec.strength < 1):
        raise TaperError(
            f"novelty strength must be in (0, 1) (the largest change of a layer's width, "
            f"as a fraction of the baseline), got {spec.strength!r}"
        )
    bad = [v for v in spec.rho_mlp if not math.isfinite(v)]
    if bad:
        raise TaperError(f"novelty rho_mlp values must be finite, got {spec.rho_mlp}")


def _novelty(spec: TaperSpec, n_layers: int) -> list[float]:
    if spec.needs_pilot:
        raise TaperError(
            "taper novelty:pilot takes its rho_mlp from a pilot run, which only `taperlm "
            "compare` makes; elsewhere give a measurement: novelty:FILE.json or novelty:RUN_DIR"
        )
    if len(spec.rho_mlp) != n_layers:
        raise TaperError(
            f"novelty taper from {spec.source or 'rho_mlp'} has {len(spec.rho_mlp)} layers "
            f"but the model has {n_layers}; measure a pilot of the same depth"
        )
    return novelty_multipliers(spec.rho_mlp, spec.strength)


NOVELTY = Schedule(
    name="novelty",
    parse=_parse_novelty,
    to_string=lambda spec: f"novelty:{spec.source}:{_exact(spec.strength)}",
    settings=lambda spec: {
        "strength": spec.strength,
        "source": spec.source,
        "rho_mlp": list(spec.rho_mlp),
    },
    check=_check_novelty,
    multipliers=_novelty,
    describe=lambda spec: f"novelty of {spec.source} (strength {_fmt(spec.strength)})",
    measured=True,
)

for _schedule in (
    UNIFORM,
    COSINE,
    LINEAR,
    SIGMOID,
    BELL,
    HOURGLASS,
    GROUPS,
    CUSTOM,
    NOVELTY,
):  # the registry
    register_schedule(_schedule)


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
        data = read_json(path, MAX_RECORD_BYTES, "novelty source", strict=True)
    except UnsafeFileError as err:  # not a file, too large, not UTF-8 or JSON, too deep
        raise TaperError(str(err)) from None
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


# ----------------------------------------------------------------------------------------------
# Multipliers and labels of any registered schedule


def multipliers(spec: TaperSpec, n_layers: int) -> list[float]:
    """The real-valued multiplier of every layer before rounding (the paper's schedule formulas)."""
    spec.validate()
    if n_layers < 1:
        raise TaperError(f"n_layers must be >= 1, got {n_layers}")
    return spec.record.multipliers(spec, n_layers)


def describe(spec: TaperSpec) -> str:
    """Human-readable name of a taper, e.g. 'cosine 1.5 -> 0.5'."""
    return spec.record.describe(spec)
