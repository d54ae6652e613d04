"""The ratio advice `taperlm plan` prints (taperlm.spec.ratio_advice): its packaged measurements are the
reports' own, docs/compare.md shows the same points and says what they say, and the arithmetic
(nearest points in log space, decades outside the measured range, the token-axis rule that
says the advantage is gone) is right on synthetic points where a wrong rule would answer
otherwise."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from conftest import readme_results_text, readme_text
from taperlm.errors import MalformedFileError
from taperlm.spec.ratio_advice import (
    MEASUREMENTS,
    advantage_gone,
    advice,
    decades_outside,
    format_advice,
    load_measurements,
    nearest,
    points_markdown,
    status,
)

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "compare.md"


def _diff(mean: float, lo: float, hi: float) -> dict:
    return {"mean": mean, "ci": [lo, hi], "se": (hi - lo) / 3.92}


def _point(name: str, params: float, tpp: float, best: tuple[float, float, float] | None,
           at_15: tuple[float, float, float] = (-0.05, -0.08, -0.02),
           best_taper: str | None = "cosine:1.75:0.25", fitted: float = 1.8) -> dict:  # fmt: skip
    return {
        "point": name,
        "size": name.split("-")[0],
        "params": params,
        "tokens": params * tpp,
        "tokens_per_param": tpp,
        "diff_1.5": _diff(*at_15),
        "best_measured": best_taper if best else None,
        "diff_best": _diff(*best) if best else None,
        "best_ratio": {"best": fitted, "ci": [fitted - 0.05, 1.9], "at_upper_edge": 0.1},
        "mode": "tokens",
    }


HELPS = (-0.06, -0.09, -0.03)
UNDECIDED = (-0.005, -0.02, +0.01)
HURTS = (+0.03, +0.01, +0.05)


def _doc(*points: dict) -> dict:
    paper = {"params": 440e6, "tokens_per_param": 68.18, "ppl": [16.28, 14.44],
             "diff": -0.1199, "best": 1.5}  # fmt: skip
    return {"points": list(points), "paper": paper}


# ----------------------------------------------------------------------------------------------
# the packaged file is the reports' own, and the docs show the same points


def test_packaged_measurements_are_the_reports():
    """src/taperlm/spec/ratio_measurements.json equals what benchmarks/ratio_measurements.py makes of
    the reports in benchmarks/results now: a report rewritten (a new point) without the file
    regenerated fails here."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import ratio_measurements
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    built = ratio_measurements.build()
    stale = (
        "src/taperlm/spec/ratio_measurements.json differs from benchmarks/results: run "
        "`python3 benchmarks/ratio_measurements.py`, then `python3 benchmarks/docs_numbers.py "
        "--only ratio-measurements --only ratio-advice-440m`"
    )
    assert built == load_measurements(), stale
    assert ratio_measurements.render(built) == MEASUREMENTS.read_text(encoding="utf-8"), stale
    scaling = json.loads((ROOT / "benchmarks/results/scaling_report.json").read_text())
    nano = json.loads((ROOT / "benchmarks/results/longrun_tokens_nano.json").read_text())
    names = [(p["mode"], p["point"]) for p in built["points"]]
    assert names[: len(scaling["points"])] == [("scaling", p["point"]) for p in scaling["points"]]
    # every token-axis point once: as the ratio axis measured it where that swept it too
    wider = {
        p["point"]
        for path in (ROOT / "benchmarks/results").glob("longrun_ratios_*.json")
        for p in json.loads(path.read_text())["points"]
    }
    assert {n for _, n in names} >= {p["point"] for p in nano["points"]}
    assert {n for m, n in names if m == "ratios"} == wider
    assert len({n for _, n in names}) == len(names)
    assert built["paper"]["best"] == 1.5 and built["paper"]["diff"] == pytest.approx(-0.1199, 1e-3)


def test_a_new_trend_report_is_new_points_without_code(tmp_path):
    """A report that lands later (say --paper ratios) is read by the same glob: a point only it
    measured joins the packaged file with its mode, and a point the token axis measured too is
    one point, the ratio axis's (its sweep contains the token axis's: steeper starts), never two
    rows counted twice; the advice reads them."""
    import shutil

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import ratio_measurements
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    results = ROOT / "benchmarks/results"
    for name in ("scaling_report.json", "longrun_tokens_nano.json"):
        shutil.copy(results / name, tmp_path / name)
    tokens_rows = json.loads((results / "longrun_tokens_nano.json").read_text())["points"]
    swept = {"at_lower_edge": 0.0, "lowest_start": 0.5, "highest_start": 2.0}
    shared = _point("nano-2134016", 266_816, 8.0, HURTS, best_taper="cosine:1.95:0.05")
    new = _point("micro-10579968", 1_058_016, 10.0, HURTS, best_taper="cosine:2.0:0.0")
    for row in (shared, new):
        del row["mode"]
        row["best_ratio"].update(swept)
    assert any(r["point"] == "nano-2134016" for r in tokens_rows)
    meta = {"mode": "ratios", "command": "taperlm compare --paper ratios", "done": 2, "total": 5}
    report = {"meta": meta, "points": [shared, new], "trends": {}}  # as trend.json has it
    before = ratio_measurements.build(tmp_path)
    (tmp_path / "longrun_ratios_nano.json").write_text(json.dumps(report))
    doc = ratio_measurements.build(tmp_path)
    ratios = [p for p in doc["points"] if p["mode"] == "ratios"]
    assert ratios == [{**shared, "mode": "ratios"}, {**new, "mode": "ratios"}]
    assert [p["point"] for p in doc["points"]].count("nano-2134016") == 1
    assert len(doc["points"]) == len(before["points"]) + 1
    assert "benchmarks/results/longrun_ratios_nano.json" in [s["file"] for s in doc["sources"]]
    a = advice(266_816, 266_816 * 8.0, doc)
    assert a["where"] == "measured point" and a["nearest"][0]["status"] == "hurts"
    assert a["nearest"][0]["best_measured"] == "cosine:1.95:0.05"
    assert a["verdict"].startswith("The advantage is gone: at nano-2134016")


@pytest.mark.unit
def test_docs_table_is_the_packaged_points_and_says_what_they_say():
    """docs/compare.md shows the points plan reads (its own rendering) and its hand-written
    "which ratio" table agrees with them: every point at <= 0.5 tokens/param decided in the
    taper's favour, fitted 1.82-1.96; at 2 tokens/param no decided difference at 0.27M and an
    inverse taper ahead at 1.06M, with the numbers the row quotes; at 10 (1.06M) the same inverse
    taper ahead and 1.5->0.5 undecided, as the 8-10 row, README and its former results (now in
    docs/compare.md) quote them."""
    page = PAGE.read_text(encoding="utf-8")
    doc = load_measurements()
    assert points_markdown(doc) in page
    # "0.5 tokens/param" points train whole batches: 0.499 at nano, 0.5004 at micro
    short = [p for p in doc["points"] if p["tokens_per_param"] < 0.51]
    assert len(short) >= 7 and all(status(p) == "helps" for p in short)
    fitted = sorted(p["best_ratio"]["best"] for p in short)
    row = next(line for line in page.splitlines() if line.startswith("| ≤ 0.5 |"))
    assert f"fitted {fitted[0]:.2f}–{fitted[-1]:.2f}" in row
    two = {p["size"]: p for p in doc["points"] if abs(p["tokens_per_param"] - 2) < 0.1}
    assert sorted(two) == ["micro", "nano"]
    assert status(two["nano"]) == "undecided" and status(two["micro"]) == "helps"
    assert two["micro"]["best_measured"] == "cosine:0.75:1.25"  # an inverse taper

    def minus(x: float) -> str:
        return f"{x:+.3f}".replace("-", "−")

    def quoted(d: dict) -> str:
        return f"{minus(d['mean'])} [{minus(d['ci'][0])}, {minus(d['ci'][1])}]"

    row = next(line for line in page.splitlines() if line.startswith("| ≈ 2–2.5 |"))
    for d in (two["nano"]["diff_1.5"], two["micro"]["diff_1.5"], two["micro"]["diff_best"]):
        assert quoted(d) in row
    # README's sentences, and the measurements that moved from README to docs/compare.md
    quotes = (readme_text(), readme_results_text())
    for d in (two["micro"]["diff_1.5"], two["micro"]["diff_best"]):
        for text in quotes:
            assert quoted(d) in text  # the sentence on micro at 2 tokens/param
    # and plan's advice at those points says the same: nothing decided at 0.27M (micro's inverse
    # taper, decided at the same budget, keeps the token axis from calling it gone), and the
    # inverse taper at 1.06M
    verdict = advice(two["nano"]["params"], two["nano"]["tokens"], doc)["verdict"]
    assert verdict.startswith("No decided advantage")
    verdict = advice(two["micro"]["params"], two["micro"]["tokens"], doc)["verdict"]
    assert verdict.startswith("Widen with depth (an inverse taper)")
    ten = [
        p for p in doc["points"] if p["size"] == "micro" and abs(p["tokens_per_param"] - 10) < 0.1
    ]
    assert len(ten) == 1 and ten[0]["best_measured"] == "cosine:0.75:1.25"
    lo, hi = ten[0]["diff_1.5"]["ci"]
    assert status(ten[0]) == "helps" and lo < 0 < hi  # 1.5->0.5 undecided
    row = next(line for line in page.splitlines() if line.startswith("| 8–10 |"))
    for d in (ten[0]["diff_1.5"], ten[0]["diff_best"]):
        assert quoted(d) in row  # the 8-10 row
        for text in quotes:
            assert quoted(d) in text  # the sentence on micro at 10 tokens/param
    verdict = advice(ten[0]["params"], ten[0]["tokens"], doc)["verdict"]
    assert verdict.startswith("Widen with depth (an inverse taper)")
    nano_short = next(p for p in short if p["size"] == "nano")
    assert advice(nano_short["params"], nano_short["tokens"], doc)["verdict"].startswith(
        "Taper, steeply"
    )


@pytest.mark.unit
def test_a_malformed_file_is_refused_with_what_to_do(tmp_path):
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"points": [{"point": "x"}], "paper": {}}))
    with pytest.raises(MalformedFileError, match=r"lacks size, params.*ratio_measurements\.py"):
        load_measurements(path)
    path.write_text(json.dumps({"points": []}))
    with pytest.raises(MalformedFileError, match="non-empty 'points'"):
        load_measurements(path)


# ----------------------------------------------------------------------------------------------
# the arithmetic


@pytest.mark.unit
def test_nearest_is_in_log_space_on_both_axes():
    a = _point("a-1", 1e6, 1.0, HELPS)
    b = _point("b-1", 1e7, 1.0, HELPS)
    c = _point("c-1", 1e6, 10.0, HELPS)
    # 5e6 params: log10 distance 0.70 to a, 0.30 to b (in plain numbers a is nearer: 4e6 < 5e6)
    assert [p["point"] for p in nearest([a, b, c], 5e6, 1.0)] == ["b-1", "a-1", "c-1"]
    # 5 tokens/param: c is nearer than a (an advice blind to the token axis would tie them)
    got = nearest([a, b, c], 1e6, 5.0, k=2)
    assert [p["point"] for p in got] == ["c-1", "a-1"]
    assert got[0]["distance_decades"] == pytest.approx(math.log10(2))
    assert got[1]["distance_decades"] == pytest.approx(math.log10(5))
    # both axes at once: Euclidean in decades
    (d,) = nearest([a], 1e7, 10.0, k=1)
    assert d["distance_decades"] == pytest.approx(math.sqrt(2))


@pytest.mark.unit
def test_decades_outside_the_range():
    assert decades_outside(440e6, 266_816, 6_099_648) == pytest.approx(1.85815, abs=1e-5)
    assert decades_outside(1e5, 1e6, 1e7) == pytest.approx(-1.0)
    assert decades_outside(3e6, 1e6, 1e7) == 0.0


@pytest.mark.unit
def test_status_of_a_point():
    assert status(_point("p-1", 1e6, 1, HELPS)) == "helps"
    assert status(_point("p-1", 1e6, 1, UNDECIDED)) == "undecided"
    assert status(_point("p-1", 1e6, 1, HURTS)) == "hurts"
    # uniform measured lowest (no best taper): 1.5 -> 0.5's interval decides
    assert status(_point("p-1", 1e6, 1, None, at_15=HURTS)) == "hurts"
    assert status(_point("p-1", 1e6, 1, None, at_15=UNDECIDED)) == "undecided"


@pytest.mark.unit
def test_the_advantage_is_gone_only_where_training_no_longer_than_the_run_lost_it():
    early = _point("s-a", 1e6, 0.5, HELPS)
    late = _point("s-b", 1e6, 2.0, UNDECIDED)
    pts = [early, late]
    assert advantage_gone(pts, 1.0) == []  # the longest not longer than 1 (0.5) helps
    assert advantage_gone(pts, 0.1) == []  # every point trained longer
    assert advantage_gone(pts, 3.0) == [late]
    assert advantage_gone(pts, 2.0 * 0.9) == [late]  # within 0.05 decades counts as as long
    assert advantage_gone(pts, 2.0 * 0.8) == []
    # two sizes at the longest budget: one still helps, so it is not gone
    other = _point("t-b", 1e7, 2.0, HELPS)
    assert advantage_gone([*pts, other], 3.0) == []
    doc = _doc(*pts)
    a = advice(1e6, 1e6 * 1.0, doc)  # between the two budgets
    assert a["advantage_gone_at"] == [] and a["verdict"].startswith("Taper, steeply")
    assert "Longer training loses it: at s-b" in a["verdict"]
    a = advice(1e6, 1e6 * 20, doc)
    assert [g["point"] for g in a["advantage_gone_at"]] == ["s-b"]
    assert "The advantage is gone" in a["verdict"] and "1.0 decades longer" in a["verdict"]


@pytest.mark.unit
def test_the_verdict_says_which_way_the_winning_taper_runs():
    """A decided winner can be any start swept, from an inverse taper (MLPs widening with depth:
    micro at 2 tokens/param measured 0.75 -> 1.25 best) to the steepest: the verdict opens with
    its direction, and only a winner that narrows with depth agrees with the paper's 1.5 -> 0.5."""
    openings = {
        "cosine:0.5:1.5": "Widen with depth (an inverse taper): ",
        "cosine:0.75:1.25": "Widen with depth (an inverse taper): ",
        "cosine:1.25:0.75": "Taper: ",
        "cosine:1.5:0.5": "Taper: ",
        "cosine:1.75:0.25": "Taper, steeply: ",
        "cosine:1.9:0.1": "Taper, steeply: ",
        "cosine:2.0:0.0": "Taper, steeply: ",
    }
    for taper, opening in openings.items():
        start = float(taper.split(":")[1])
        # nearest to the run, trained on the run's budget: neither gone nor lost by longer training
        p = _point("s-a", 1e6, 1.0, HELPS, best_taper=taper, fitted=start)
        verdict = advice(1e6, 1e6, _doc(p))["verdict"]
        assert verdict.startswith(opening), (taper, verdict)
        assert f"the best measured ratio is cosine {start:g}" in verdict.replace(".0 ", " ")
        # a run beside the paper's point, the measured point trained longer (nothing gone): the
        # paper's narrowing winner agrees with a narrowing one only
        far = _point("s-b", 1e8, 100.0, HELPS, best_taper=taper, fitted=start)
        verdict = advice(440e6, 440e6 * 68.18, _doc(far))["verdict"]
        agrees = "which agrees with the measurements here" in verdict
        assert agrees == (start > 1.0), (taper, verdict)


# ----------------------------------------------------------------------------------------------
# the advice at the documented kinds of run


@pytest.mark.unit
@pytest.mark.parametrize(
    "params, tpp, far, near",
    [  # each end of each axis, once just past it (within a point's 0.05 decades) and once far
        (1e7 * 1.05, 1.0, "0.0 decades larger", "as large as the largest model measured (10M)"),
        (1e7 * 30, 1.0, "1.5 decades larger than the largest model measured (10M)", None),
        (1e5 / 1.05, 1.0, "0.0 decades smaller", "as small as the smallest model measured"),
        (1e5 / 30, 1.0, "1.5 decades smaller than the smallest model measured", None),
        (1e6, 10 * 1.05, "0.0 decades longer", "as long as the longest training measured (10 "),
        (1e6, 10 * 30, "1.5 decades longer than the longest training measured (10 ", None),
        (1e6, 0.1 / 1.05, "0.0 decades shorter", "as short as the shortest training measured"),
        (1e6, 0.1 / 30, "1.5 decades shorter than the shortest training measured", None),
    ],
)
def test_how_far_outside_is_said_at_every_end(params, tpp, far, near):
    """Past an end of the measured range by less than a point's width the advice says the run is
    as large / small / long / short as that end, never "0.0 decades"; further out it gives the
    decades. Points span 1e5-1e7 params and 0.1-10 tokens/param, apart from the run."""
    doc = _doc(
        _point("a-1", 1e5, 0.1, HELPS),
        _point("b-1", 1e7, 0.1, HELPS),
        _point("c-1", 1e5, 10.0, UNDECIDED),
        _point("d-1", 1e7, 10.0, UNDECIDED),
    )
    a = advice(params, params * tpp, doc)
    sure = a["how_sure"]
    assert a["where"] == "outside" and sure.startswith("Extrapolated")
    assert "0.0 decades" not in sure
    if near is None:
        assert far in sure
    else:
        assert near in sure and far not in sure


@pytest.mark.unit
def test_far_outside_the_paper_run():
    """440M parameters at 68 tokens/param: 1.9 decades larger than the largest model measured
    (6.1M), as long as the longest training (68 tokens/param, at 0.27M), so nothing is said of
    training beyond it; the advantage gone at that longest point, the paper's own 1.5 -> 0.5
    beside it."""
    doc = load_measurements()
    a = advice(440e6, 30e9, doc, taper="cosine:1.5:0.5", family="transformer")
    biggest = max(p["params"] for p in doc["points"])
    longest = max(doc["points"], key=lambda p: p["tokens_per_param"])
    assert a["where"] == "outside"
    assert a["outside_decades"]["params"] == pytest.approx(math.log10(440e6 / biggest))
    assert a["outside_decades"]["tokens_per_param"] == pytest.approx(
        math.log10(30e9 / 440e6 / longest["tokens_per_param"])
    )
    assert biggest == 6_099_648 and longest["point"] == "nano-18143232"
    sure = a["how_sure"]
    assert sure.startswith("Extrapolated")
    assert "1.9 decades larger than the largest model measured (6.1M)" in sure
    # 68.2 against 68 tokens/param: as long, not "0.0 decades longer"
    assert "as long as the longest training measured (68 tokens/param" in sure
    assert "3.2 decades smaller than your run" in sure and "decades longer" not in sure
    assert [g["point"] for g in a["advantage_gone_at"]] == ["nano-18143232"]
    assert a["verdict"].startswith("The advantage is gone: at nano-18143232")
    assert "no taper decidedly beats uniform" in a["verdict"]
    assert (
        "best measured 2.0 -> 0.0: -0.0209" in a["verdict"]
        and "1.5 -> 0.5: +0.0017" in a["verdict"]
    )
    assert "Your run trains as long as that" in a["verdict"]
    assert a["paper"]["distance_decades"] == pytest.approx(0, abs=1e-3)
    assert "nearer the paper's point" in a["verdict"] and "cosine 1.5 -> 0.5" in a["verdict"]
    assert "disagrees" in a["verdict"]
    # the nearest three, nearest first, each with its own distance
    ds = [p["distance_decades"] for p in a["nearest"]]
    assert len(ds) == 3 and ds == sorted(ds)
    # nearest: micro's longest run (1.06M, 10 tokens/param), 2.75 decades away in log space
    first = a["nearest"][0]
    assert first["point"] == "micro-10579968"
    p0 = next(p for p in doc["points"] if p["point"] == first["point"])
    far = math.hypot(math.log10(440e6 / p0["params"]), math.log10(30e9 / 440e6 / 10.0))
    assert ds[0] == pytest.approx(far, abs=1e-3) and ds[0] > 2.7
    text = format_advice(a)
    assert "your run: 440M params x 30,000,000,000 tokens = 68.2 tokens/param" in text
    assert "this model's taper: cosine:1.5:0.5" in text and "-0.1199 nats" in text


@pytest.mark.unit
def test_on_a_measured_point():
    doc = load_measurements()
    p = next(p for p in doc["points"] if p["point"] == "micro-163840")
    a = advice(p["params"], p["tokens"], doc)
    assert a["where"] == "measured point" and a["nearest"][0]["point"] == "micro-163840"
    assert a["nearest"][0]["distance_decades"] == pytest.approx(0, abs=1e-12)
    assert a["how_sure"].startswith("Measured: your run is on micro-163840")
    assert a["verdict"].startswith("Taper, steeply") and "cosine 1.9 -> 0.1" in a["verdict"]
    assert f"{p['diff_best']['mean']:+.4f}" in a["verdict"]
    assert "Longer training loses it: at nano-533504" in a["verdict"]


@pytest.mark.unit
def test_inside_the_measured_range():
    doc = load_measurements()
    a = advice(2e6, 1e6, doc)  # 0.5 tokens/param at 2M params: between the sizes, no point there
    assert a["where"] == "inside" and a["outside_decades"] == {
        "params": 0.0,
        "tokens_per_param": 0.0,
    }
    want = min(
        doc["points"],
        key=lambda p: math.hypot(
            math.log10(2e6 / p["params"]), math.log10(0.5 / p["tokens_per_param"])
        ),
    )
    assert a["nearest"][0]["point"] == want["point"] == "micro-529408"
    assert a["how_sure"].startswith("Interpolated: inside the measured range")
    assert f"{a['nearest'][0]['distance_decades']:.2f} decades away" in a["how_sure"]


@pytest.mark.unit
def test_smaller_and_shorter_than_anything_measured():
    doc = load_measurements()
    a = advice(1e5, 1e3, doc)  # 0.1M params, 0.01 tokens/param
    smallest = min(p["params"] for p in doc["points"])
    shortest = min(p["tokens_per_param"] for p in doc["points"])
    assert a["outside_decades"]["params"] == pytest.approx(-math.log10(smallest / 1e5))
    assert a["outside_decades"]["tokens_per_param"] == pytest.approx(-math.log10(shortest / 0.01))
    assert "0.4 decades smaller than the smallest model measured" in a["how_sure"]
    assert "0.4 decades shorter than the shortest training measured" in a["how_sure"]
    assert a["advantage_gone_at"] == []  # every point trained longer than this run


@pytest.mark.unit
def test_the_fitted_best_start_says_which_end_of_the_sweep_bounds_it():
    """Every state of the fit: inside the sweep (a number), at the steepest start swept, at the
    lowest start swept when that is uniform, and when it is an inverse taper below uniform."""
    cases = {
        "inside": ({"at_upper_edge": 0.1, "at_lower_edge": 0.2}, None),
        "upper": ({"at_upper_edge": 0.8, "at_lower_edge": 0.0}, "at the steepest ratio swept"),
        "lower, uniform": (
            {"at_upper_edge": 0.0, "at_lower_edge": 0.9, "lowest_start": 1.0},
            "at the lowest start swept, uniform, in 90% of resamples",
        ),
        "lower, an inverse taper": (
            {"at_upper_edge": 0.0, "at_lower_edge": 0.7, "lowest_start": 0.5},
            "at the lowest start swept, the mildest swept, 0.5, in 70% of resamples",
        ),
    }
    for name, (edges, says) in cases.items():
        p = _point("s-a", 1e6, 8.0, HURTS, best_taper="cosine:1.25:0.75", fitted=1.0)
        p["best_ratio"].update(edges)
        text = " ".join(format_advice(advice(1e6, 8e6, _doc(p))).split())  # lines wrapped
        if says is None:
            assert "swept in" not in text and "of resamples" not in text, name
        else:
            assert says in text, (name, text)


# ----------------------------------------------------------------------------------------------
# a point's lead checked again, pre-registered, on fresh seeds (`taperlm compare --paper confirm`)


def _check(point: str, verdict: str, corpus: str = "built-in", taper: str = "cosine:0.75:1.25"):
    ci = {"confirmed": [-0.05, -0.01], "refuted": [0.01, 0.04], "not confirmed": [-0.02, 0.02]}
    return {
        "point": point, "mode": "confirm" if corpus == "built-in" else "confirm-code",
        "taper": taper, "corpus": corpus, "seeds": list(range(100, 115)),
        "mean": sum(ci[verdict]) / 2,
        "anytime_ci": ci[verdict], "t_ci": ci[verdict], "better_in": 8, "verdict": verdict,
        "size": "micro", "tokens_per_param": 10.0, "lr": 0.004,
    }  # fmt: skip


@pytest.mark.unit
@pytest.mark.parametrize("exploratory", [HELPS, UNDECIDED, HURTS])
@pytest.mark.parametrize(
    "verdict, reads, opening, at_the_point",
    [
        ("confirmed", "helps", "Widen with depth", "Widen with depth"),
        ("refuted", "hurts", "Do not taper", "The advantage is gone"),
        ("not confirmed", "undecided", "No decided advantage", "The advantage is gone"),
    ],
)
def test_a_checked_lead_is_read_by_its_check(exploratory, verdict, reads, opening, at_the_point):
    """Whatever the exploratory interval said, the point reads as its pre-registered check on
    the same corpus says (status, verdict, plan's lines, the docs table); a check on another
    corpus, or of another taper than the point's best, is shown and changes nothing. A run
    shorter than the point hears the point's reading; one as long, the token-axis rule's."""
    p = _point("micro-10579968", 1_058_016, 10.0, exploratory, best_taper="cosine:0.75:1.25")
    doc = {**_doc(p), "confirmations": [_check("micro-10579968", verdict)]}
    shorter = advice(1_058_016, 1_058_016 * 6.0, doc)
    assert shorter["verdict"].startswith(opening), shorter["verdict"]
    a = advice(1_058_016, 1_058_016 * 10.0, doc)
    assert a["nearest"][0]["status"] == reads
    assert a["verdict"].startswith(at_the_point), a["verdict"]
    said = f"checked once, pre-registered, on 15 fresh seeds (taperlm compare --paper confirm): {verdict},"
    assert said in a["verdict"]
    assert said in " ".join(format_advice(a).split())
    assert ("its lead not confirmed" in shorter["verdict"]) == (verdict == "not confirmed")
    (row,) = [r for r in points_markdown(doc).splitlines() if r.startswith("| micro-10579968 |")]
    assert row.endswith(f" {verdict} on fresh seeds (--paper confirm) |"), row
    for other in (
        _check("micro-10579968", verdict, corpus="code"),
        _check("micro-10579968", verdict, taper="cosine:1.5:0.5"),
        _check("nano-2134016", verdict),
    ):
        doc = {**_doc(p), "confirmations": [other]}
        plain = advice(1_058_016, 1_058_016 * 10.0, _doc(p))
        a = advice(1_058_016, 1_058_016 * 10.0, doc)
        assert a["nearest"][0]["status"] == status(p) == plain["nearest"][0]["status"]
        shown = other["point"] == "micro-10579968"
        assert ("checked once" in a["verdict"]) == shown
        assert ("on the code corpus" in a["verdict"]) == (shown and other["corpus"] == "code")
        # the docs table names the corpus of a check that trained on another
        rows = [r for r in points_markdown(doc).splitlines() if r.startswith("| micro-10579968 |")]
        where = " on the code corpus" if other["corpus"] == "code" else ""
        mode = other["mode"]
        assert rows[0].endswith(f"{verdict} on fresh seeds{where} (--paper {mode}) |") == shown


@pytest.mark.unit
def test_a_lead_not_confirmed_is_an_advantage_gone():
    """The token-axis rule reads the check too: a run at or past a point whose only lead was not
    confirmed hears that the advantage is gone there, with the check quoted."""
    p = _point("micro-10579968", 1_058_016, 10.0, HELPS, best_taper="cosine:0.75:1.25")
    doc = {**_doc(p), "confirmations": [_check("micro-10579968", "not confirmed")]}
    a = advice(1_058_016, 1_058_016 * 20.0, doc)
    assert [g["point"] for g in a["advantage_gone_at"]] == ["micro-10579968"]
    assert "no taper's lead holds on fresh seeds" in a["verdict"]
    assert "not confirmed, Δ +0.0000 [-0.0200, +0.0200]" in a["verdict"]


@pytest.mark.unit
@pytest.mark.parametrize("key", ["point", "mode", "taper", "corpus", "seeds", "mean", "anytime_ci",
                                 "better_in", "verdict"])  # fmt: skip
def test_a_malformed_confirmation_is_refused(tmp_path, key):
    doc = json.loads(MEASUREMENTS.read_text())
    check = _check("micro-10579968", "confirmed")
    del check[key]
    doc["confirmations"] = [check]
    path = tmp_path / "m.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(MalformedFileError, match=f"confirmation lacks {key}"):
        load_measurements(path)
    check[key] = "x" if key == "verdict" else 1
    if key == "verdict":
        path.write_text(json.dumps(doc))
        with pytest.raises(MalformedFileError, match="a known verdict"):
            load_measurements(path)
