"""Sequential seeds: the anytime-valid confidence sequence keeps its error rate however often it
is looked at (thousands of simulated paired comparisons, zero and small effects, several caps,
scales and arrival orders), where the naive "stop when the t interval excludes 0" does not; the
stop rule decides from seeds 0..n-1 alone whatever order cells finish in; its options and its
report section."""

from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import raises_naming
from taperlm.analysis import stats
from taperlm.compare import report, statistics
from taperlm.compare.grid import build_grid, parse_allocations
from taperlm.compare.options import CompareOptions
from taperlm.config import RunConfig, TrainConfig
from taperlm.config.presets import get_preset
from taperlm.errors import ConfigError

ALPHA = 0.05
RUNS = 4000  # simulated comparisons per setting
# Monte Carlo slack: at a true rate of exactly ALPHA, 4000 runs give a standard error of 0.0034;
# the sequence's real rate is about half of ALPHA (conservative), so ALPHA itself is the bound.
NAIVE_FLOOR = 2 * ALPHA  # the naive rule measured 0.12-0.33 at these caps


def _t_halfwidths(x: np.ndarray) -> np.ndarray:
    """The fixed-n Student-t half-widths at every n of every row (inf at n = 1)."""
    n = np.arange(1, x.shape[1] + 1)
    d = x - x[:, :1]
    q = np.maximum(np.cumsum(d**2, axis=1) - np.cumsum(d, axis=1) ** 2 / n, 0.0)
    sd = np.sqrt(q / np.maximum(n - 1, 1))
    t = np.array([math.inf] + [stats.t_quantile(1 - ALPHA / 2, k - 1) for k in n[1:]])
    with np.errstate(invalid="ignore"):  # inf * 0 at n = 1: never decides there
        return np.where(n > 1, t * sd / np.sqrt(n), np.inf)


def _ever_misses(x: np.ndarray, mu: float, halfwidths) -> np.ndarray:
    """Per run: whether the interval (mean +- half-width) looked at after EVERY seed misses the
    true mean mu at some n — the false decision of a rule that stops when the interval excludes
    a value (with mu = 0: "the effect is not zero")."""
    n = np.arange(1, x.shape[1] + 1)
    means = np.cumsum(x, axis=1) / n
    return (np.abs(means - mu) > halfwidths(x)).any(axis=1)


def _sequence(x: np.ndarray) -> np.ndarray:
    return stats.running_halfwidths(x, ALPHA)[1]


ORDERS = {
    "as drawn": lambda x, rng: x,
    "reversed": lambda x, rng: x[:, ::-1],
    "shuffled per run": lambda x, rng: rng.permuted(x, axis=1),
}


@pytest.mark.parametrize("cap", [5, 15, 40])
@pytest.mark.parametrize("mu_over_sd", [0.0, 0.3, 1.0])
def test_sequence_error_rate_holds_when_looking_after_every_seed(cap, mu_over_sd):
    """The false-decision rate of the confidence sequence, looked at after every seed up to the
    cap, stays <= ALPHA at every scale (the sequence is scale-invariant), for zero effect (any
    decision is false) and small effects (a false decision = the true mean outside the interval
    at some n), in every arrival order; the naive rule on the same data exceeds it."""
    rng = np.random.default_rng(cap * 100 + int(10 * mu_over_sd))
    for sd in (1e-3, 1.0, 50.0):
        mu = mu_over_sd * sd
        x = rng.normal(mu, sd, size=(RUNS, cap))
        for name, order in ORDERS.items():
            seq = order(x, rng)
            rate = _ever_misses(seq, mu, _sequence).mean()
            assert rate <= ALPHA, f"cap {cap}, sd {sd}, mu/sd {mu_over_sd}, {name}: {rate}"
        naive = _ever_misses(x, mu, _t_halfwidths).mean()
        assert naive > NAIVE_FLOOR, f"cap {cap}, sd {sd}: the naive rule's rate {naive}"


def test_the_naive_rule_would_fail_this_test(monkeypatch):
    """Replacing the confidence sequence by the fixed-n t interval (the mistake these tests
    guard against) makes the error-rate check above fail."""
    monkeypatch.setattr(
        stats, "running_halfwidths", lambda x, alpha: (None, _t_halfwidths(np.asarray(x)))
    )
    with pytest.raises(AssertionError, match="cap 15"):
        test_sequence_error_rate_holds_when_looking_after_every_seed(15, 0.0)


def test_sequence_decides_real_effects_within_a_handful_of_seeds():
    """Power, at the main job's effect (mean -0.088, sd 0.016 nats): decided (interval below 0)
    by 4 seeds in most runs, and by 6 in nearly all; at a tenth of that standardized effect it
    rarely decides at 15 (an honest 'undecided' instead of a false one)."""
    rng = np.random.default_rng(7)
    x = rng.normal(-0.088, 0.016, size=(RUNS, 15))
    means, half = stats.running_halfwidths(x, ALPHA)
    decided = means + half < 0
    first = np.where(decided.any(axis=1), decided.argmax(axis=1) + 1, 99)
    assert np.mean(first <= 4) > 0.5 and np.mean(first <= 6) > 0.99
    assert not decided[:, :2].any()  # n = 1, 2: unbounded at c = 0.1, alpha = 0.05
    weak = rng.normal(-0.0088, 0.016, size=(RUNS, 15))
    m, h = stats.running_halfwidths(weak, ALPHA)
    assert (np.abs(m) > h).any(axis=1).mean() < 0.2


def _martingale(x: np.ndarray, mu: float) -> float:
    """The t-mixture martingale M_n(mu) of the whole of x, written out (stats.confidence_sequence)."""
    c, n = stats.CS_PRECISION, len(x)
    s, v = float(np.sum(x - mu)), float(np.sum((x - mu) ** 2))
    return math.sqrt(c / (n + c)) * (v / (v - s * s / (n + c))) ** (n / 2)


def test_confidence_sequence_matches_its_vectorized_form_and_the_martingale():
    """`confidence_sequence` (what compare decides with) equals `running_halfwidths` (what the
    simulations use) at every n, and its interval is exactly where the mixture martingale stays
    below 1/alpha."""
    rng = np.random.default_rng(3)
    for _ in range(20):
        x = rng.normal(rng.normal(), rng.uniform(0.01, 5), size=12)
        seq = stats.confidence_sequence(x.tolist(), ALPHA)
        means, half = stats.running_halfwidths(x[None, :], ALPHA)
        for e, m, h in zip(seq, means[0], half[0]):
            assert math.isclose(e.mean, m, rel_tol=1e-9, abs_tol=1e-12)
            assert (math.isinf(e.half) and math.isinf(h)) or math.isclose(e.half, h, rel_tol=1e-9)
        lo, hi = seq[-1].ci
        for edge in (lo, hi):
            assert math.isclose(_martingale(x, edge), 1 / ALPHA, rel_tol=1e-6)
        assert _martingale(x, (lo + hi) / 2) < 1 / ALPHA
        assert _martingale(x, hi + 0.01 * (hi - lo)) > 1 / ALPHA
    assert stats.confidence_sequence([1.0, 2.0])[-1].ci == (-math.inf, math.inf)
    with pytest.raises(ValueError):
        stats.confidence_sequence([1.0], alpha=1.5)


# ---------------------------------------------------------------------------- the stop rule


def _grid(seeds: int, tapers: str = "uniform;cosine:1.5:0.5;cosine:1.9:0.1"):
    model = get_preset("transformer-micro", resolve=False).resolve()
    cfg = RunConfig(model=model, train=TrainConfig(tokens=4096, batch_tokens=1024))
    allocs = parse_allocations(tapers.split(";"))
    return build_grid(cfg, allocs, list(range(seeds)))


def _result(loss: float, seed: int) -> SimpleNamespace:
    """The part of a cell's result (`taperlm.compare.results.CellResult`) the stop rule reads."""
    return SimpleNamespace(val=SimpleNamespace(loss=loss), seed=seed)


def _fake_results(grid, effects: dict[str, float], sd: float, seed: int) -> dict:
    rng = random.Random(seed)
    out = {}
    for s in grid.seeds:
        base = 5.0 + rng.gauss(0, 0.05)
        for a in grid.allocations:
            loss = base + effects.get(a.name, 0.0) + rng.gauss(0, sd)
            out[grid.cell(a.name, s).name] = _result(loss, s)
    return out


def _first_decision(grid, results, rule) -> int:
    """By hand: the first n >= min_seeds at which every allocation's sequence excludes 0."""
    for n in range(rule.min_seeds, len(grid.seeds) + 1):
        if all(
            (lambda ci: ci[0] > 0 or ci[1] < 0)(stats.confidence_sequence(d, rule.alpha)[-1].ci)
            for d in statistics.comparisons(grid, results, n, "each").values()
        ):
            return n
    return len(grid.seeds)


def test_the_stop_depends_only_on_the_seeds_before_it_whatever_finishes_first():
    """Cells finishing in any order (several workers, load, interruptions) give the same stop,
    at the first n where the rule holds on seeds 0..n-1; cells of later seeds, done or not,
    change nothing."""
    grid = _grid(12)
    names = [a.name for a in grid.allocations]
    results = _fake_results(grid, {names[1]: -0.08, names[2]: -0.05}, 0.02, seed=1)
    rule = statistics.parse_rule("decided", 0.05, 3, "each")
    want = _first_decision(grid, results, rule)
    assert 3 <= want < 12
    rng = random.Random(0)
    for trial in range(30):
        order = [c.name for c in grid.cells]
        if trial:
            rng.shuffle(order)
        monitor, done = statistics.Monitor(rule, grid), {}
        for name in order:
            done[name] = results[name]
            monitor.update(done)
        assert monitor.stopped_at == want and monitor.reason == "decided"
        assert not monitor.wants(want) and monitor.wants(want - 1)
    # a later seed's numbers (however extreme) take no part
    extreme = dict(results)
    for a in names:
        extreme[grid.cell(a, want).name] = _result(1e6, want)
    monitor = statistics.Monitor(rule, grid)
    monitor.update(extreme)
    assert monitor.stopped_at == want


@pytest.mark.parametrize(
    "stop, effects, want_reason",
    [
        ("fixed", {1: -0.08, 2: -0.05}, "cap"),
        ("decided", {1: -0.08, 2: 0.0}, "cap"),  # one allocation without effect: never decided
        ("half-width:1e-9", {1: -0.08, 2: -0.05}, "cap"),
        ("half-width:0.5", {1: -0.08, 2: -0.05}, "half-width"),
    ],
)
def test_rules_and_their_reasons(stop, effects, want_reason):
    grid = _grid(8)
    names = [a.name for a in grid.allocations]
    results = _fake_results(grid, {names[k]: v for k, v in effects.items()}, 0.02, seed=2)
    rule = statistics.parse_rule(stop, 0.05, 3, "each")
    monitor = statistics.Monitor(rule, grid)
    monitor.update(results)
    assert monitor.reason == want_reason
    assert monitor.stopped_at == (3 if want_reason == "half-width" else 8)
    rec = statistics.record(rule, grid, results, monitor.stopped_at, monitor.reason, 8)
    assert [s.n for s in rec.sequence] == list(range(1, monitor.stopped_at + 1))
    assert type(rec).from_json(rec.to_json()) == rec and "plot" not in rec.to_json()
    assert rec.rule == stop.replace("1e-9", "1e-09")
    text = "\n".join(report.stopping_section(rec))
    assert report.why(rec) in text and "## When it stopped" in text


def test_best_question_rests_on_the_best_and_its_neighbours():
    grid = _grid(6, "uniform;cosine:1.25:0.75;cosine:1.5:0.5;cosine:1.75:0.25")
    names = [a.name for a in grid.allocations]
    results = _fake_results(grid, {names[1]: -0.05, names[2]: -0.15, names[3]: -0.10}, 0.01, 3)
    labels = set(statistics.comparisons(grid, results, 6, "best"))
    a = {x.name: x.label for x in grid.allocations}
    best = a[names[2]]
    assert labels == {f"{best} − {a[n]}" for n in (names[0], names[1], names[3])}


@pytest.mark.parametrize(
    "field, value, named",
    [  # the flag, the value given, and what it accepts
        ("stop", "soon", ("--stop", "'soon'", "fixed", "decided", "half-width:X")),
        ("stop", "half-width:-1", ("--stop", "half-width", "positive")),
        ("stop", "half-width:abc", ("--stop", "half-width", "positive")),
        ("stop_alpha", 0.0, ("--stop-alpha", "(0, 1)")),
        ("stop_alpha", 1.0, ("--stop-alpha", "(0, 1)")),
        ("min_seeds", 0, ("--min-seeds", ">= 1")),
    ],
)
def test_bad_stop_options_fail_before_any_work(tmp_path: Path, field, value, named):
    from taperlm.compare.comparison import check_options

    # a --stop text is parsed where the options are built; the ranges are checked by check_options
    with raises_naming(ConfigError, *named):
        check_options(dataclasses.replace(CompareOptions(out=tmp_path), **{field: value}))


def test_the_replay_table_in_the_docs_is_the_scripts_rendering_of_the_stored_runs():
    """docs/compare.md's replay table is benchmarks/sequential_replay.py's rendering of
    results/sequential_replay.json, and that JSON is what the script computes today from the
    stored scaling report (the rule as compare applies it)."""
    import json
    import sys

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "benchmarks"))
    import sequential_replay as R

    stored = json.loads((root / "benchmarks/results/sequential_replay.json").read_text())
    page = (root / "docs/compare.md").read_text(encoding="utf-8")
    assert R.markdown(stored["rows"]) in page
    args = R.argparse.Namespace(
        stop="decided", alpha=0.05, min_seeds=3, stop_on="each", scaling_tuning_runs=8
    )
    scaling = json.loads((root / "benchmarks/results/scaling_report.json").read_text())
    fresh = R.from_scaling_report(scaling, args)
    # the stops and the printed table; not every float's last bit (libm may differ by machine)
    assert R.markdown(fresh) == R.markdown(stored["rows"])
    key = ("comparison", "stop_on", "sequential_seeds", "reason")
    assert [[r[k] for k in key] for r in fresh] == [[r[k] for k in key] for r in stored["rows"]]
    assert all(v["same_verdict"] for r in fresh for v in r["verdicts"])
