"""Class 8 of issue 26: numbers in the docs that the code determines cannot drift from it.

Every such table or block is written by `benchmarks/docs_numbers.py` between
`<!-- docs_numbers:NAME -->` markers; each test renders a block from the code and compares it
with the page (the planner's blocks are `slow`: a 440M Titans activation trace takes ~20 s).
Measured tables whose rows the code partly determines (the 440M CPU dry run) have those rows
checked here against the code.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

from conftest import readme_results_text, readme_text

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import docs_numbers as D  # noqa: E402

GiB = 2**30
FAST = [n for n, b in D.BLOCKS.items() if not b.planner]
PLANNER = [n for n, b in D.BLOCKS.items() if b.planner]


def _fail_message(name: str) -> str:
    return (
        f"{D.BLOCKS[name].page}: block {name} differs from the code; run "
        f"`python benchmarks/docs_numbers.py --only {name}`"
    )


@pytest.mark.unit
@pytest.mark.parametrize("name", FAST)
def test_block_matches_the_code(name):
    assert D.current(name) == D.BLOCKS[name].render(), _fail_message(name)


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) if n != "scaling-plan-440m" else n for n in PLANNER],
)
def test_planner_block_matches_the_code(name):
    assert D.current(name) == D.BLOCKS[name].render(), _fail_message(name)


@pytest.mark.unit
def test_every_block_has_its_markers_and_the_check_catches_drift(tmp_path, capsys):
    for name in D.BLOCKS:
        assert D.current(name)  # raises when a page lost its markers
    name = "tapers-presets"
    copy = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", copy)
    page = copy / Path(D.BLOCKS[name].page).name
    page.write_text(page.read_text().replace("456.0M", "440.0M", 1))
    assert D.current(name, tmp_path) != D.BLOCKS[name].render()
    assert D.write(name, D.BLOCKS[name].render(), tmp_path)
    assert D.current(name, tmp_path) == D.BLOCKS[name].render()


# ----------------------------------------------------------------------------------------------
# the 440M CPU dry run (docs/scaling.md): measured, but partly determined by the code


def dryrun_table() -> dict[str, list[str]]:
    text = (ROOT / "docs/scaling.md").read_text()
    start = text.index("| | transformer-440m | titans-mag-440m |")
    rows = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def numbers(cell: str) -> list[float]:
    return [float(x) for x in re.findall(r"\d+(?:\.\d+)?", cell)]


PRESETS = ["transformer-440m", "titans-mag-440m"]


@pytest.mark.parametrize("column", [0, 1], ids=PRESETS)
def test_dry_run_rows_the_code_determines(column):
    from taperlm.config.budget import total_params
    from taperlm.config.presets import get_preset
    from taperlm.training.planner import parameter_shapes, shard_numel

    cfg = get_preset(PRESETS[column])
    n = total_params(cfg)
    rows = dryrun_table()
    assert rows["parameters"][column] == f"{n / 1e6:.1f}M"
    local = sum(shard_numel(s, 2) for s in parameter_shapes(cfg).values())
    planned = [4 * local / GiB, 4 * local / GiB, 8 * local / GiB]
    for label in ("planner, 2 GPUs: params / grads / AdamW",
                  "FSDP2 tensors per rank: params / grads / AdamW (measured)"):  # fmt: skip
        assert numbers(rows[label][column]) == [round(x, 3) for x in planned], label
    one = numbers(rows["one process: params + grads + AdamW tensors"][column])
    assert one == [round(16 * n / GiB, 2)]
    ckpt = numbers(rows["DCP checkpoint (2 shard files + metadata + state)"][column])[0]
    assert abs(ckpt * 1e9 - 12 * n) < 0.005 * 12 * n  # fp32 weights + 2 AdamW moments
    # a peak RSS cannot be below what the code holds: weights, gradients, AdamW, and (unless
    # measured before it) the step guard's copy of weights and AdamW
    for label, cells in rows.items():
        if "peak RSS" not in label or "/ one process" in label or "not" in cells[column]:
            continue
        per_rank = 2 if "FSDP2" in label or "after resuming" in label else 1
        held = (16 + (0 if "before the step guard" in label else 12)) * n / per_rank
        for value in numbers(cells[column]):
            assert value * GiB >= held, f"{label}: {value} GiB < the {held / GiB:.2f} GiB held"


# ----------------------------------------------------------------------------------------------
# measured tables of benchmarks/README.md against the JSON their script wrote


def shown_matches(cell: str, value: float) -> bool:
    """A doc cell (`0.984`, `1.01`, `635`) shows `value` rounded to the digits it prints."""
    text = cell.strip("* ").replace(",", "")
    decimals = len(text.split(".")[1]) if "." in text else 0
    return abs(float(text) - value) <= 0.5 * 10**-decimals + 1e-9


def readme_table(heading_row: str) -> list[list[str]]:
    text = (ROOT / "benchmarks/README.md").read_text()
    lines = text[text.index(heading_row) :].splitlines()[2:]
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


@pytest.mark.unit
def test_taper_overhead_table_matches_its_json():
    import json

    results = {}
    for size in ("small", "tiny"):
        data = json.loads((ROOT / f"benchmarks/results/taper_overhead_{size}.json").read_text())
        for r in data["rows"]:
            results[(f"{r['family']}-{size}", str(r["multiple_of"]))] = r
    rows = readme_table("| preset | multiple_of | distinct widths | uniform ms | tapered ms |")
    assert len(rows) == len(results)
    columns = ["distinct widths", "uniform cpu ms", "tapered cpu ms", "ratio (cpu)", "ratio (wall)"]
    for preset, multiple_of, *cells in rows:
        r = results[(preset, multiple_of)]
        for name, cell in zip(columns, cells):
            assert shown_matches(cell, r[name]), (
                f"{preset} x{multiple_of} {name}: {cell} vs {r[name]}"
            )


def test_robustness_table_matches_its_json():
    """docs/compare.md's robustness table is benchmarks/robustness.py's rendering of
    results/robustness.json (every number read from the compare reports), row for row."""
    import json

    import robustness

    data = json.loads((ROOT / "benchmarks/results/robustness.json").read_text())
    assert len(data["rows"]) == 8 and not data["missing"]
    page = (ROOT / "docs/compare.md").read_text(encoding="utf-8")
    assert robustness.markdown(data["rows"]) in page


def test_scaling_table_matches_its_report():
    """docs/compare.md's scaling table is the sweep's own table (scaling.points_table) of
    results/scaling_report.json, the report.json that `taperlm compare --paper scaling` wrote;
    and each point's best ratio is the vertex of its recorded mean losses' local parabola."""
    import json

    import numpy as np

    from taperlm.compare import scaling

    data = json.loads((ROOT / "benchmarks/results/scaling_report.json").read_text())
    points = data["points"]
    assert data["meta"]["done"] == data["meta"]["total"] == len(points) == 6
    page = (ROOT / "docs/compare.md").read_text(encoding="utf-8")
    rows = [scaling.ScalingPoint.from_json(p) for p in points]
    assert "\n".join(scaling.points_table(rows, link=False)) in page
    for p in points:
        fit = p["fit"]
        vertex, _, _ = scaling.local_parabola(np.array(fit["starts"]), np.array(fit["mean_loss"]))
        # The vertex comes from a LAPACK solve: its last bits depend on the CPU and the BLAS build
        # (1.8229038174632055 on one machine, ...077 on another), so bit-equality is no promise
        # we can make; 1e-9 is far below the 2 decimals the table prints.
        assert fit["best"] == pytest.approx(vertex, rel=1e-9, abs=1e-12)
        assert fit["n_seeds"] >= 5


def test_compress_tables_are_the_benchmarks_own():
    """docs/compress.md's tables are benchmarks/prune.py's own rendering (markdown,
    scores_markdown, speed_markdown) of results/prune.json and prune_heal131k.json, the runs the
    page describes: every contestant, at least 5 seeds of healing data order."""
    import json

    import prune

    page = (ROOT / "docs/compress.md").read_text(encoding="utf-8")
    for name in ("prune", "prune_heal131k"):
        data = json.loads((ROOT / f"benchmarks/results/{name}.json").read_text())
        assert data["seeds_done"]["heal"] >= 5 and data["seeds_done"]["scratch"] >= 5
        assert len(data["rows"]) == 8 and {r["shape"] for r in data["rows"]} == {
            "cosine", "uniform", "novelty", "scratch"
        }  # fmt: skip
        assert prune.markdown(data) in page
    assert prune.scores_markdown(data) in page and prune.speed_markdown(data) in page


LONGRUN_REPORTS = sorted((ROOT / "benchmarks/results").glob("longrun_*.json"))


@pytest.mark.parametrize("path", LONGRUN_REPORTS, ids=lambda p: p.stem)
def test_long_training_table_matches_its_report(path):
    """docs/compare.md shows each long-training trend report's table (results/longrun_MODE_SIZE
    .json, the trend.json `taperlm compare --paper tokens/ratios` wrote) as `longrun.trend_table`
    renders it; the token axis's figures at nano are in docs/img."""
    import json

    from taperlm.compare import longrun

    data = json.loads(path.read_text())
    mode, size = path.stem.split("_")[1:]
    assert data["meta"]["mode"] == mode and len(data["points"]) == data["meta"]["done"] >= 1
    assert {p["size"] for p in data["points"]} == {size}
    page = (ROOT / "docs/compare.md").read_text(encoding="utf-8")
    rows = [longrun.TrendRow.from_json(p) for p in data["points"]]
    assert "\n".join(longrun.trend_table(rows)) in page
    assert data["meta"]["paper_440m"]["ppl"] == [16.28, 14.44]
    if path.stem == "longrun_tokens_nano":
        for png in ("longrun-advantage-nano.png", "longrun-best-ratio-nano.png"):
            assert f"(img/{png})" in page and (ROOT / "docs/img" / png).is_file()


def assert_same_report(got: object, want: object, where: str = "") -> None:
    """`got` equals `want` in every key, string and count; floats to 1e-9 relative, since least
    squares and bootstraps end in the last bits differently across numpy builds and CPUs (seen:
    the same AMD EPYC with a fresh install moved 17 floats of trend_all_points.json by <= 1e-15
    relative)."""
    if isinstance(want, float) and isinstance(got, (int, float)):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12), where
    elif isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), where
        for k in want:
            assert_same_report(got[k], want[k], f"{where}/{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same_report(g, w, f"{where}[{i}]")
    else:
        assert got == want, where


def test_same_report_tolerates_last_bits_only():
    a = {"x": [1.0, {"y": 0.1 + 0.2, "n": 3, "s": "a"}]}
    assert_same_report({"x": [1.0 + 1e-15, {"y": 0.3, "n": 3, "s": "a"}]}, a)
    for wrong in (
        {"x": [1.001, {"y": 0.3, "n": 3, "s": "a"}]},
        {"x": [1.0, {"y": 0.3, "n": 4, "s": "a"}]},
        {"x": [1.0, {"y": 0.3, "n": 3, "s": "b"}]},
        {"x": [1.0, {"y": 0.3, "n": 3}]},
        {"x": [1.0]},
    ):
        with pytest.raises(AssertionError):
            assert_same_report(wrong, a)


def test_the_trend_across_every_point_is_its_reports():
    """benchmarks/results/trend_all_points.json is the trend of every committed scaling and
    token-axis point together, as benchmarks/trend_all_points.py computes it now (a new point
    without a rerun fails here), and docs/compare.md quotes its across-size lines and shows its
    figure."""
    import json
    import tempfile

    import trend_all_points as T
    from taperlm.compare import longrun

    committed = json.loads(T.OUT_JSON.read_text(encoding="utf-8"))
    with tempfile.TemporaryDirectory() as tmp:
        _, js = T.write(Path(tmp))
        assert_same_report(json.loads(js.read_text(encoding="utf-8")), committed)
    report = longrun.TrendReport.from_json(committed)
    assert report.mode == longrun.ALL_POINTS and len({r.size for r in report.points}) >= 2
    # a point two modes measured (--paper tokens and --paper ratios share points) counts once,
    # in the table, the fits and the count of points done
    keys = [r.point for r in report.points]
    assert len(set(keys)) == len(keys) and report.done == len(keys) <= report.total
    page = " ".join((ROOT / "docs/compare.md").read_text(encoding="utf-8").split())
    md = (ROOT / "benchmarks/results/trend_all_points.md").read_text(encoding="utf-8")
    assert md.startswith(longrun.trend_markdown(report).split("\n![")[0])
    across = [line for line in md.splitlines() if "across sizes, extrapolated" in line]
    assert len(across) == 2
    for line in across:
        assert " ".join(line.removeprefix("- ").split()) in page
    assert "(img/all-points-advantage.png)" in page
    assert (ROOT / "docs/img/all-points-advantage.png").is_file()
    # README and its former verdict (docs/compare.md, "README's results") quote the
    # extrapolation to 440M at 68 tokens/param as the fit gives it
    fit = committed["trends"]["diff_1.5"]["440m"]
    lo, hi = fit["prediction_ci"]
    said = f"{fit['prediction']:+.3f} [{lo:+.3f}, {hi:+.3f}] nats".replace("-", "−")
    assert said in readme_text() and said in readme_results_text(), said


@pytest.mark.parametrize("path", LONGRUN_REPORTS, ids=lambda p: p.stem)
def test_the_kept_cells_resume_the_long_training_modes(path):
    """benchmarks/results/longrun_MODE_SIZE/ keeps every finished cell's result.json of that
    mode and size, laid out as `--out`, so that the mode continues where it stopped
    (docs/compare.md); the ratio axis keeps only the cells the token axis does not (1.95, 2.0),
    the rest being the token axis's own (`longrun.shared_points`). Each must still read as a done
    cell (a bump of the result layout would retrain them all), and each measured point must have
    all of its reported cells: every allocation of the mode x at least 3 seeds, at that point's
    tokens."""
    import json

    from taperlm.compare import longrun
    from taperlm.compare.cell import read_result
    from taperlm.files.outdirs import check_folder

    mode, size = path.stem.split("_")[1:]
    kept = [ROOT / "benchmarks/results" / path.stem]
    if mode == "ratios":  # the cells both modes train are kept once, with the token axis's
        kept.append(ROOT / f"benchmarks/results/longrun_tokens_{size}")
    data = json.loads(path.read_text())
    # the documented `cp -r` copy must be accepted as --out (the study's folder and each point's
    # comparison folder), not refused as a folder taperlm did not write
    for folder in (kept[0], *sorted(p for p in kept[0].iterdir() if p.is_dir())):
        check_folder(folder, "compare", "--out")
    cells = sorted(kept[0].glob("*/runs/*/result.json"))
    assert cells
    for path_ in cells:
        assert read_result(path_.parent) is not None, path_
    allocations = 1 + len(longrun.plan_of(mode).starts)
    for point in data["points"]:
        reported = {
            p.parent.name: p
            for k in kept
            for p in (k / point["point"] / "runs").glob("*-s[0-9]/result.json")
        }
        seeds = _seeds_by_allocation(reported)
        assert len(seeds) == allocations, (point["point"], sorted(seeds))
        # every allocation at the same seeds, at least 3 (a missing cell is a gap in the pairs)
        first = next(iter(seeds.values()))
        assert len(first) >= 3 and all(v == first for v in seeds.values()), (point["point"], seeds)
        for p in reported.values():
            cfg = json.loads(p.read_text())["config"]
            assert cfg["train"]["tokens"] == point["tokens"], p


@pytest.mark.parametrize("path", LONGRUN_REPORTS, ids=lambda p: p.stem)
def test_a_point_under_way_is_quoted_as_its_kept_cells(path):
    """A point whose cells are kept but which its trend report does not have yet (under way:
    rerunning the mode resumes it) is quoted in docs/compare.md as its kept cells say: how many
    of its reported cells are done, and each taper's mean difference from uniform over the
    seeds every allocation has (an interim reading, so the page cannot go stale as cells land)."""
    import json

    from taperlm.compare import longrun
    from taperlm.compare.options import PAPER_MODE_SEEDS

    mode = path.stem.split("_")[1]
    kept = ROOT / "benchmarks/results" / path.stem
    measured = {p["point"] for p in json.loads(path.read_text())["points"]}
    allocations = 1 + len(longrun.plan_of(mode).starts)
    page = _flat_text("docs/compare.md")
    for point in sorted(p.name for p in kept.iterdir() if p.is_dir()):
        if point in measured:
            continue
        loss = {
            r.parent.name: json.loads(r.read_text())["val"]["loss"]
            for r in (kept / point / "runs").glob("*-s[0-9]/result.json")
        }
        total = allocations * PAPER_MODE_SEEDS
        assert f"{point} is under way: {len(loss)} of its {total} reported cells" in page
        seeds = _seeds_by_allocation(loss)
        if len(seeds) < allocations:
            continue  # an allocation has no cell yet: no paired difference to quote
        common = sorted(set.intersection(*seeds.values()), key=int)
        if not common:
            continue  # no seed every allocation has yet: nothing to quote
        means = []
        for allocation in sorted(a for a in seeds if a != "uniform"):
            _, start, end = allocation.split("-")
            diff = [loss[f"{allocation}-s{s}"] - loss[f"uniform-s{s}"] for s in common]
            means.append(f"{start}→{end} {sum(diff) / len(diff):+.4f}".replace("-", "−"))
        seeds_text = f"seeds {common[0]}–{common[-1]}" if len(common) > 1 else f"seed {common[0]}"
        quoted = f"{point} over {seeds_text} (interim, not a result): {', '.join(means)}"
        assert quoted in page, quoted


@pytest.mark.unit
def test_wsd_first_look_against_cosine_table_is_the_two_summaries():
    """docs/compare.md's first-look table of WSD against cosine is `wsd_first_look.side_by_side`
    of the two summaries the script wrote (results/wsd_first_look.json, one WSD run per
    allocation and seed with a cooldown branch per budget; results/wsd_first_look_cosine.json,
    each budget its own cosine run): the same settings, 3 seeds each, every seed at every budget."""
    import json

    import wsd_first_look as W

    wsd, cosine = (
        json.loads((ROOT / f"benchmarks/results/{name}.json").read_text())
        for name in ("wsd_first_look", "wsd_first_look_cosine")
    )
    assert (wsd["schedule"], cosine["schedule"]) == ("wsd", "cosine")
    for summary in (wsd, cosine):
        assert summary["seeds"] == 3 and summary["lr"] == 0.002
        for row in summary["budgets"].values():
            assert row["diff"]["n"] == 3 and set(row["uniform"]) == set(row["cosine-1.5-0.5"])
    page = (ROOT / "docs/compare.md").read_text(encoding="utf-8")
    assert W.side_by_side(wsd, cosine) in page
    with pytest.raises(ValueError, match="more than the schedule"):
        W.side_by_side(wsd, {**cosine, "lr": 0.004})


def _seeds_by_allocation(cells) -> dict[str, set[str]]:
    """The seeds of each allocation among cell names ALLOCATION-sSEED (a run folder's name)."""
    seeds: dict[str, set[str]] = {}
    for name in cells:
        allocation, seed = name.rsplit("-s", 1)
        seeds.setdefault(allocation, set()).add(seed)
    return seeds


def _diff_text(diff: dict, digits: int = 4, unit: str = "") -> str:
    """A paired difference as the docs print it: mean [low, high] with typographic minus signs
    (`unit` after the mean, e.g. " nats")."""
    lo, hi = diff["ci"]
    return f"{diff['mean']:+.{digits}f}{unit} [{lo:+.{digits}f}, {hi:+.{digits}f}]".replace(
        "-", "−"
    )


def _flat_text(name: str) -> str:
    """A document of the repository with its line breaks and runs of spaces made single spaces,
    so that a quoted number is found wherever the prose wraps it."""
    return " ".join((ROOT / name).read_text(encoding="utf-8").split())


def test_ratio_axis_new_starts_are_the_kept_cells():
    """docs/compare.md's table of 1.9, 1.95 and 2.0 against uniform on the ratio axis (nano at
    0.5 and 8 tokens/param, micro at 0.5) is the paired difference of the kept cells' validation
    losses (the token axis's uniform and 1.9 cells, the ratio axis's own 1.95 and 2.0),
    recomputed here: a cell or a number changed fails."""
    import json

    from taperlm.analysis.stats import paired_difference

    results = ROOT / "benchmarks/results"

    def losses(root: str, point: str, allocation: str) -> dict[int, float]:
        runs = results / root / point / "runs"
        return {
            s: json.loads((runs / f"{allocation}-s{s}/result.json").read_text())["val"]["loss"]
            for s in range(5)
        }

    page = (ROOT / "docs/compare.md").read_text(encoding="utf-8")
    points = (
        ("nano", "nano-133120", "0.5"),
        ("nano", "nano-2134016", "8"),
        ("nano", "nano-18143232", "68"),
        ("micro", "micro-529408", "0.5"),
    )
    for size, point, tpp in points:
        tokens, ratios = f"longrun_tokens_{size}", f"longrun_ratios_{size}"
        uniform = losses(tokens, point, "uniform")
        cells = []
        for allocation, root in (
            ("cosine-1.9-0.1", tokens),
            ("cosine-1.95-0.05", ratios),
            ("cosine-2.0-0.0", ratios),
        ):
            d = paired_difference(losses(root, point, allocation), uniform)
            star = " *" if d.excludes_zero else ""
            better = sum(x < 0 for x in d.per_seed)
            mean_ci = {"mean": d.mean, "ci": d.ci}
            cells.append(f"{_diff_text(mean_ci)}{star}, {better}/{len(d.per_seed)}")
        assert f"| {size}, {tpp} | {' | '.join(cells)} |" in page, (point, cells)
    # README's sentence (and its former verdict, now docs/compare.md's "README's results"): the
    # fitted best start at 0.5 tokens/param, from the ratio axis's report
    report = json.loads((results / "longrun_ratios_nano.json").read_text())
    by_point = {p["point"]: p for p in report["points"]}
    early = by_point["nano-133120"]["best_ratio"]
    lo, hi = early["ci"]
    fitted = f"{early['best']:.2f} [{lo:.2f}, {hi:.2f}] at 0.5 tokens per parameter, uniform at 8"
    assert fitted in readme_text() and fitted in readme_results_text()
    assert by_point["nano-2134016"]["best_measured"] == "uniform"
    # at 68: the best measured ratio and its difference, as those sentences quote them
    longest = by_point["nano-18143232"]
    start, end = longest["best_measured"].removeprefix("cosine:").split(":")
    steep = f"{start} → {end}: {_diff_text(longest['diff_best'], digits=3)}"
    assert steep in readme_text() and steep in readme_results_text()


@pytest.mark.unit
@pytest.mark.parametrize(
    "report, tokens, taper_lr",
    [("own_lr_nano_8tpp.json", 2134016, 0.008), ("own_lr_nano_32tpp.json", 8538112, 0.002)],
)
def test_own_lr_check_is_its_report(report: str, tokens: int, taper_lr: float):
    """docs/compare.md's and README's own-lr numbers at 8 and 32 tokens/param are each
    comparison's report.json (benchmarks/results/own_lr_nano_*tpp.json): the budget, the chosen
    lrs and both paired differences, with the seeds that favour the taper."""
    import json

    data = json.loads((ROOT / "benchmarks/results" / report).read_text())
    assert f"--tokens {tokens} " in data["meta"]["command"]
    tuning = data["lr_tuning"]
    assert tuning["scope"] == "each"
    assert tuning["chosen_lr"] == {"uniform": 0.004, "cosine-1.5-0.5": taper_lr}
    (taper,) = [r for r in tuning["tuned"] if r["label"] == "cosine:1.5:0.5"]
    own, shared = taper["tuned_diff"], taper["shared_diff"]
    page = _flat_text("docs/compare.md")
    assert _diff_text(own, unit=" nats") in page
    better = sum(d < 0 for d in own["per_seed"])
    assert f"better in {better} of {own['n']} seeds" in page
    assert _diff_text(shared) in page
    said = _diff_text(own, digits=3)  # README's sentence and its former verdict
    assert said in readme_text() and said in readme_results_text()


def _component_rows(reports: list[dict]) -> list[str]:
    """docs/compare.md's rows of the heads / KV check: every allocation's widths, heads and KV
    heads, then its paired difference at each budget (mean, interval, `*` where it excludes 0,
    seeds where the allocation is better)."""
    rows = []
    for i, alloc in enumerate(reports[0]["allocations"]):
        cells = []
        for report in reports:
            same = report["allocations"][i]
            assert same["label"] == alloc["label"]
            diff = (same["diff_vs_uniform"] or {}).get("val_loss")
            if diff is None:
                cells.append("(baseline)")
                continue
            star = " *" if diff["excludes_zero"] else ""
            better = sum(d < 0 for d in diff["per_seed"])
            cells.append(f"{_diff_text(diff)}{star}, {better}/{diff['n']}")
        shape = ["/".join(map(str, alloc[k])) for k in ("widths", "heads", "kv_heads")]
        rows.append(f"| `{alloc['label']}` | {' | '.join(shape)} | {cells[0]} | {cells[1]} |")
    return rows


@pytest.mark.unit
def test_heads_and_kv_check_is_its_reports():
    """The heads / KV table in docs/compare.md is the two comparisons' report.json, row by row,
    at the budgets and lrs the docs name."""
    import json

    reports = [
        json.loads((ROOT / f"benchmarks/results/components_nano_{p}tpp.json").read_text())
        for p in ("05", "8")
    ]
    for report, (tokens, lr) in zip(reports, [(133120, 0.016), (2134016, 0.004)], strict=True):
        command = report["meta"]["command"]
        assert f"--tokens {tokens} " in command and f"train.lr={lr} " in command
    rows = _component_rows(reports)
    assert len(rows) == 5
    page = (ROOT / "docs/compare.md").read_text(encoding="utf-8").splitlines()
    for row in rows:
        assert row in page, row


@pytest.mark.unit
@pytest.mark.parametrize("point, tokens", [("05", 140288), ("8", 2240512)])
def test_depth_check_is_its_report(point: str, tokens: int):
    """docs/compare.md's 12-layer check (nano's budget, 3x its depth) quotes each comparison's
    report.json: the shape and budget in its command, uniform's tuned lr and the paired
    difference at 1.5 -> 0.5 with the seeds that favour the taper."""
    import json

    data = json.loads((ROOT / f"benchmarks/results/depth_nano12_{point}tpp.json").read_text())
    command = data["meta"]["command"]
    for given in ("model.n_layers=12", "model.d_model=40", "model.mlp_width=112"):
        assert given in command
    assert f"--tokens {tokens} " in command
    (taper,) = [a for a in data["allocations"] if a["label"] == "cosine:1.5:0.5"]
    assert taper["params"] == 280_040
    diff = taper["diff_vs_uniform"]["val_loss"]
    better = sum(d < 0 for d in diff["per_seed"])
    lr = data["lr_tuning"]["chosen_lr"]["uniform"]
    quote = f"{_diff_text(diff)}, {better} of {diff['n']} seeds better (uniform's lr {lr:g})"
    assert quote in _flat_text("docs/compare.md"), quote


def test_the_confirmatory_readings_are_their_committed_reports():
    """docs/compare.md's table of the pre-registered checks is `confirm.outcome_table` of the
    committed report.json files (benchmarks/results, `confirm.RESULT_FILES`), read by the rule;
    README says each reading in its sentence (`outcome_sentence`). A check under way (its
    finished cells kept in benchmarks/results/<stem>/runs, as --out lays them out) is quoted as
    the rule reads them so far (`interim_sentence`); one not started is said to be not run yet;
    neither has a row."""
    from taperlm.compare.confirm import (
        RESULT_FILES,
        interim,
        interim_sentence,
        outcome_sentence,
        outcome_table,
        read_outcome_file,
    )

    page, readme = _flat_text("docs/compare.md"), readme_text()
    done = []
    for mode, name in RESULT_FILES.items():
        path = ROOT / "benchmarks/results" / name
        kept = path.with_suffix("") / "runs"
        if path.is_file():
            outcome = read_outcome_file(path, mode)
            done.append(outcome)
            assert " ".join(outcome_sentence(outcome).split()) in readme, mode
            assert f"`--paper {mode}`: not run yet" not in page + readme, mode
            assert f"`--paper {mode}`: under way" not in page + readme, mode
        elif kept.is_dir():
            so_far = interim(kept)
            quoted = f"`--paper {mode}`: {interim_sentence(so_far)}"
            assert " ".join(quoted.split()) in page, quoted
            if mode == "confirm":  # README's summary says how many seeds it has read so far
                assert f"the first {len(so_far.seeds)} fresh seeds" in readme
        else:
            assert f"`--paper {mode}`: not run yet" in page, mode
    if done:
        assert " ".join(" ".join(outcome_table(done)).split()) in page
    else:
        assert "| `--paper confirm" not in page


def test_the_kept_cells_of_a_check_resume_it(tmp_path):
    """A check's kept cells (benchmarks/results/<stem>/runs) are its own cells: each reads as a
    done cell, trained exactly as the pre-registered comparison trains that cell (the run's
    config, compared as a resume compares it), so that the command continues from them. A check
    that tunes uniform's lr (confirm-code) keeps its tuning cells too, each the tuning grid's
    cell at its lr, and its seeds' cells are at the lr its committed report chose."""
    import copy
    import json
    import math

    from taperlm.cli import build_parser
    from taperlm.compare.cell import read_result
    from taperlm.compare.comparison import check_options, reported_seeds
    from taperlm.compare.confirm import RESULT_FILES, confirm_options, read_outcome_file
    from taperlm.compare.grid import build_grid
    from taperlm.compare.options import options_from
    from taperlm.compare.tuning import tuning_grid
    from taperlm.files.outdirs import check_folder
    from taperlm.training.run_dir import resume_conflicts

    for mode, name in RESULT_FILES.items():
        kept = (ROOT / "benchmarks/results" / name).with_suffix("")
        if not kept.is_dir():
            continue
        check_folder(kept, "compare", "--out")  # the documented copy is accepted as --out
        data = ["--data", str(tmp_path)] if mode == "confirm-code" else []
        args = ["compare", "--paper", mode, *data, "--out", str(tmp_path / "out")]
        sub = confirm_options(options_from(build_parser().parse_args(args)))
        allocs, provisional = check_options(sub)
        cells = sorted((kept / "runs").iterdir())
        assert cells
        results = {folder: read_result(folder) for folder in cells}
        assert None not in results.values(), [f for f, r in results.items() if r is None]
        tuning = {f: r for f, r in results.items() if r.seed >= 10000}  # type: ignore[union-attr]
        base = copy.deepcopy(provisional)
        if sub.tune_lr:  # the seeds' cells train at the lr the kept tuning cells choose
            by_lr: dict[float, list[float]] = {}
            for r in tuning.values():
                by_lr.setdefault(r.trained_lr, []).append(r.val.loss)  # type: ignore[union-attr]
            recipe = provisional.train.lr
            base.train.lr = min(
                by_lr, key=lambda lr: (sum(by_lr[lr]) / len(by_lr[lr]), abs(math.log(lr / recipe)))
            )
            report = ROOT / "benchmarks/results" / name
            if report.is_file():
                assert read_outcome_file(report, mode).lr == base.train.lr
            lrs = sorted(by_lr)
            tseeds = sorted({r.seed for r in tuning.values()})  # type: ignore[union-attr]
            tgrid, _ = tuning_grid(provisional, allocs, tseeds, lrs, "uniform")
        else:
            assert not tuning, "a check at a fixed lr has no tuning cells"
        grid = build_grid(base, allocs, reported_seeds(sub))
        for folder, result in results.items():
            config = json.loads((folder / "result.json").read_text())["config"]
            at = tgrid if folder in tuning else grid
            cell = at.cell(result.allocation, result.seed)  # type: ignore[union-attr]
            conflicts = resume_conflicts(config, cell.config)
            # the vocabulary is sized to the data when it is read (here: none)
            assert [c for c in conflicts if c[0] != "model.vocab_size"] == [], folder
