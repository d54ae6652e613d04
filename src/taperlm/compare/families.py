"""`taperlm compare --paper families`: the paper's family table at any scale.

Every family's preset `{prefix}-{size}` (default: transformer, gated, hope and titans-mag at the
size `micro`) is compared uniform vs cosine 1.5 -> 0.5 over the same seeds. Each family is its own
comparison at exactly its own uniform budget (`build_grid` asserts equal parameters and
FLOPs/token, and that the cells of a seed differ only in the widths): `OUT/<prefix>-<size>/` is a
complete `taperlm compare` of that family (report.md, runs/, plots), reproducible on its own
with the command its report names. `OUT/report.md`, `report.json` and `families.png` then put the
families side by side like the paper's 760M table, with the paper's numbers and relative changes
beside ours (`taperlm.compare.family_table`).

`--set` keys of a family's own section (`model.titans.window=32`, `hope.levels=2`) apply to that
family only; every other key applies to all. At the paper's sizes (`--preset-size 760m`) the
cells train with the paper's recipe (`taperlm.compare.recipe.PAPER_TRAIN`).

Titans: the paper does not say which variant it tapered; the default is MAG (why: docs/compare.md);
`--families transformer,titans-mac,titans-mal` runs others.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from pathlib import Path
from typing import Any

from taperlm.compare.family_table import FamilyMeta, write_family_report
from taperlm.compare.grid import FAMILIES_TAPERS
from taperlm.compare.options import DEFAULT_FAMILIES, CompareOptions, list_text
from taperlm.compare.reproduce import run_arguments
from taperlm.compare.study import Part, StudyPlan, StudyProgress
from taperlm.config.assembly import Assembly, Layer
from taperlm.config.presets import PAPER_SHAPES, SMALL_SHAPES, preset_families
from taperlm.errors import ConfigError
from taperlm.families import FAMILIES

# The main job's size: the default table (4 families x 5 seeds) fits about half an hour on 2 cores.
DEFAULT_PRESET_SIZE = "micro"


def family_presets(opts: CompareOptions) -> list[str]:
    """The preset prefixes of --families (default DEFAULT_FAMILIES), checked and deduplicated."""
    known = preset_families()
    out: list[str] = []
    for name in DEFAULT_FAMILIES if opts.families is None else opts.families:
        if name not in known:
            raise ConfigError(
                f"--families: unknown family preset {name!r}; choose from {', '.join(known)}"
            )
        if name not in out:
            out.append(name)
    if not out:
        raise ConfigError(f"--families is empty; give e.g. --families {','.join(DEFAULT_FAMILIES)}")
    return out


def preset_size(opts: CompareOptions) -> str:
    """--preset-size (default micro), checked against the preset sizes."""
    size = list_text(opts.preset_size) if opts.preset_size else DEFAULT_PRESET_SIZE
    sizes = [*SMALL_SHAPES, *PAPER_SHAPES]
    if size not in sizes:
        raise ConfigError(f"--preset-size {size!r} is unknown; choose from {', '.join(sizes)}")
    return size


def override_family(key: str) -> str | None:
    """The family whose own section the dotted key of a `--set` addresses (`model.titans.window`
    -> titans), or None for a key every family has."""
    parts = key.split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "model" and parts[1] in FAMILIES else None


def family_options(opts: CompareOptions) -> list[tuple[str, CompareOptions]]:
    """(preset prefix, the CompareOptions of its comparison) for every family of the run."""
    if opts.preset or opts.config:
        raise ConfigError(
            "--paper families builds every family from its own preset: choose the size with "
            "--preset-size (tiny, small, 440m, ...) and the families with --families, not "
            "--preset/--config"
        )
    if opts.tapers or opts.taper_list:
        raise ConfigError("give either --paper MODE or --tapers/--taper, not both")
    prefixes = family_presets(opts)
    size = preset_size(opts)
    known = preset_families()
    names = {known[p][0].name for p in prefixes}
    # the key each --set text sets, as the assembly records it (checked here, as every family's
    # own assembly would)
    keys = Assembly.of({}, "--set", Layer.DEFAULT).overrides(opts.overrides, Layer.SET, "--set")
    families_of = {text: override_family(key) for text, key in zip(opts.overrides, keys)}
    for text in opts.overrides:
        fam = families_of[text]
        if fam is not None and fam not in names:
            raise ConfigError(
                f"--set {text!r} is an option of the {fam} family, which is not among "
                f"--families {','.join(prefixes)}"
            )
    out = []
    for prefix in prefixes:
        fam = known[prefix][0].name
        sets = [o for o in opts.overrides if families_of[o] in (None, fam)]
        sub = dataclasses.replace(
            opts,
            out=opts.out / f"{prefix}-{size}",
            preset=f"{prefix}-{size}",
            paper=None,
            tapers=FAMILIES_TAPERS,
            preset_size=None,
            families=None,
            overrides=sets,
        )
        out.append((prefix, sub))
    return out


def families_plan(opts: CompareOptions) -> StudyPlan:
    """The families study: every family's comparison, one after the other, and the family table
    rewritten after each (`taperlm.compare.studies.run_study` runs it)."""
    subs = family_options(opts)
    size = preset_size(opts)

    def report(done: StudyProgress) -> tuple[Path, Path]:
        latest = done.reports[next(reversed(done.reports))]
        meta = FamilyMeta(
            command=_command(opts, subs, latest.meta["settings"]["tokens"]),
            preset_size=size,
            families=tuple(p for p, _ in subs),
            family_wall_s=dict(done.walls),
            wall_s=done.wall(),
            cpu_s=done.cpu(),
            created=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            done=len(done.reports),
            total=done.total,
        )
        return write_family_report(done.reports, opts.out, meta)

    parts = [Part(prefix, sub, "family", sub.preset or prefix) for prefix, sub in subs]
    return StudyPlan(parts, report, mode="families", folder="families folder")


def _command(opts, subs: list[tuple[str, Any]], tokens: int) -> str:
    """The command line that reproduces the families run (every choice explicit)."""
    parts = ["taperlm", "compare", "--paper", "families", "--preset-size", preset_size(opts)]
    parts += ["--families", ",".join(p for p, _ in subs)]
    if opts.multiple_of:
        parts += ["--multiple-of", str(opts.multiple_of)]
    return shlex.join(parts + run_arguments(opts, subs[0][1].seeds, tokens))
