"""The difference against tokens seen and its crossing point (`taperlm.compare.statistics`): known
crossings of synthetic curves, both ways of not crossing, a curve that dips back below zero, the
pairing by seed, the seeded bootstrap, report.md's lines and report.json's round trip."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from taperlm.analysis import stats
from taperlm.compare import report, results, statistics

TOKENS = [1000, 2000, 4000, 8000, 16000]


def _curves(deltas: dict[int, list[float]], tokens=TOKENS, base: float = 5.0):
    """(tapered, uniform) per-seed curves whose difference is `deltas[seed]`."""
    uniform = {s: [[t, base - 0.1 * i] for i, t in enumerate(tokens)] for s in deltas}
    tapered = {
        s: [[t, base - 0.1 * i + d] for i, (t, d) in enumerate(zip(tokens, ds))]
        for s, ds in deltas.items()
    }
    return tapered, uniform


def test_crossing_is_interpolated_in_log_tokens():
    c = statistics.crossing_of([1, 2, 4, 8], [-0.2, -0.1, 0.1, 0.2])
    assert c.kind == statistics.CROSSED and not c.recrossed
    assert c.tokens == pytest.approx(math.sqrt(8))  # halfway between log 2 and log 4
    # a third of the way in log tokens from 4 to 8
    c = statistics.crossing_of([1, 2, 4, 8], [-0.2, -0.2, -0.1, 0.2])
    assert c.tokens == pytest.approx(4 * 2 ** (1 / 3))
    # landing on zero exactly: the crossing is that evaluation
    c = statistics.crossing_of([1, 10, 100], [-0.1, 0.0, 0.1])
    assert c.kind == statistics.CROSSED and c.tokens == pytest.approx(10)


def test_no_crossing_says_which_side():
    below = statistics.crossing_of(TOKENS, [-0.3, -0.2, 0.1, -0.05, -0.01])
    assert below.kind == statistics.BELOW_AT_END and below.tokens is None
    assert below.recrossed  # it was at or above zero at 4000, then below again
    plain = statistics.crossing_of(TOKENS, [0.1, -0.2, -0.3, -0.2, -0.1])
    assert plain.kind == statistics.BELOW_AT_END and not plain.recrossed
    never = statistics.crossing_of(TOKENS, [0.2, 0.0, 0.1, 0.3, 0.01])
    assert never.kind == statistics.NEVER_BELOW and never.tokens is None
    assert statistics.crossing_of([1000], [-0.1]).kind == statistics.TOO_SHORT


def test_a_dip_back_below_zero_moves_the_crossing_to_the_last_one():
    # above zero at 2000, below again at 4000: the advantage ends at the second crossing
    c = statistics.crossing_of(TOKENS, [-0.3, 0.1, -0.1, 0.2, 0.3])
    assert c.kind == statistics.CROSSED and c.recrossed
    assert c.tokens == pytest.approx(4000 * 2 ** (1 / 3))
    assert c.tokens > 4000  # not the first crossing, between 1000 and 2000


def test_pairing_by_seed_and_shared_evaluations():
    tapered, uniform = _curves({0: [-0.1] * 5, 1: [-0.3] * 5, 2: [9.0] * 5})
    del uniform[2]  # seed 2 has no uniform run: it must not enter any mean
    uniform[3] = [[t, 1.0] for t in TOKENS]  # nor a uniform seed without a tapered one
    tapered[1] = [p for p in tapered[1] if p[0] != 4000]  # seed 1 missed one evaluation
    seeds, tokens, diffs = statistics.paired_curves(tapered, uniform)
    assert seeds == (0, 1)
    assert tokens == (1000, 2000, 8000, 16000)
    assert np.allclose(diffs, [[-0.1] * 4, [-0.3] * 4])
    curve = statistics.allocation_curve("t", "t", tapered, uniform, params=1000)
    assert curve.seeds == (0, 1) and [p.tokens for p in curve.points] == list(tokens)
    first = curve.points[0]
    assert first.n == 2 and first.mean == pytest.approx(-0.2)
    assert first.tokens_per_param == pytest.approx(1.0)
    assert first.per_seed == pytest.approx((-0.1, -0.3))
    # the interval is taperlm.analysis.stats.paired_difference's t interval
    half = 12.7062 * math.sqrt(0.02) / math.sqrt(2)
    assert first.ci == pytest.approx((-0.2 - half, -0.2 + half), abs=1e-3)


def _crossing_seeds(n: int = 6) -> dict[int, list[float]]:
    """Seeds whose difference rises through zero between 2000 and 8000 tokens, each a bit
    differently, plus noise."""
    rng = np.random.default_rng(1)
    out = {}
    for s in range(n):
        shift = rng.normal(0, 0.03)
        base = [-0.2, -0.1, 0.0, 0.1, 0.15]
        out[s] = [b + shift + rng.normal(0, 0.01) for b in base]
    return out


def test_bootstrap_is_deterministic_and_holds_the_point():
    tapered, uniform = _curves(_crossing_seeds())
    a = statistics.allocation_curve("t", "t", tapered, uniform, params=1000)
    b = statistics.allocation_curve("t", "t", tapered, uniform, params=1000)
    assert a == b  # the same seeds give the same interval, to the digit
    assert a.crossing.kind == statistics.CROSSED
    iv = a.interval
    assert iv is not None and iv.tokens is not None
    assert (
        iv.resamples == statistics.BOOTSTRAP_RESAMPLES and iv.rng_seed == statistics.BOOTSTRAP_SEED
    )
    assert iv.crossed + iv.below_at_end + iv.never_below == iv.resamples
    assert iv.tokens[0] <= a.crossing.tokens <= iv.tokens[1]
    assert iv.tokens[0] < iv.tokens[1]  # the seeds differ: a real interval
    # the RNG seed fixes the draws: few resamples with two seeds give two intervals
    _, tokens, diffs = statistics.paired_curves(tapered, uniform)
    draws = {statistics.bootstrap_crossing(tokens, diffs, 20, rng_seed=s).tokens for s in range(5)}
    assert len(draws) > 1
    assert statistics.bootstrap_crossing(tokens, diffs, 20, 3) == statistics.bootstrap_crossing(
        tokens, diffs, 20, 3
    )


def test_bootstrap_of_identical_seeds_is_the_point_itself():
    same = [-0.2, -0.1, 0.1, 0.2, 0.3]
    tapered, uniform = _curves(dict.fromkeys(range(4), same))
    a = statistics.allocation_curve("t", "t", tapered, uniform, params=1000)
    assert a.interval.crossed == a.interval.resamples
    assert a.interval.tokens == pytest.approx((a.crossing.tokens, a.crossing.tokens))
    assert a.crossing.tokens == pytest.approx(math.sqrt(2000 * 4000))


def test_bootstrap_counts_the_resamples_that_do_not_cross():
    # one seed always below zero, the others cross: some resamples draw it often enough
    deltas = {s: [-0.2, -0.1, 0.05, 0.1, 0.1] for s in range(4)}
    deltas[4] = [-0.5, -0.5, -0.6, -0.6, -0.6]
    tapered, uniform = _curves(deltas)
    a = statistics.allocation_curve("t", "t", tapered, uniform, params=1000)
    iv = a.interval
    assert a.crossing.kind == statistics.BELOW_AT_END  # the mean: (4 * 0.1 - 0.6) / 5 < 0
    assert iv.crossed > 0 and iv.below_at_end > 0 and iv.never_below == 0
    assert 0 < iv.share_not_crossing < 1
    assert "no crossing within the run" in report.crossing_text(a, 1000)
    assert "taper still ahead" in report.crossing_text(a, 1000)


def test_one_seed_has_no_interval():
    tapered, uniform = _curves({0: [-0.2, -0.1, 0.1, 0.2, 0.3]})
    a = statistics.allocation_curve("t", "t", tapered, uniform, params=1000)
    assert a.interval is None and a.points[0].ci is None
    assert "no interval" in report.crossing_text(a, 1000)


def test_report_json_round_trip():
    tapered, uniform = _curves(_crossing_seeds())
    data = results.LossVsTokens(
        params=1000,
        eval_tokens=4096,
        allocations=(statistics.allocation_curve("t", "taper", tapered, uniform, params=1000),),
    )
    text = json.dumps(data.to_json(), allow_nan=False)
    assert results.LossVsTokens.from_json(json.loads(text)) == data
    (entry,) = json.loads(text)["allocations"]
    curve = data.allocations[0]
    assert entry["crossing_tokens_per_param"] == pytest.approx(curve.crossing.tokens / 1000)
    assert entry["interval_tokens_per_param"] == pytest.approx(
        [t / 1000 for t in curve.interval.tokens]
    )
    # a report.json keeps it among the summary's extras: tests/compare/test_compare.py reads it
    # back from a real report


def _paired(per_seed: list[float]) -> stats.PairedDifference:
    """The final validation-loss difference the report's table computes, from per-seed values."""
    seeds = range(len(per_seed))
    return stats.paired_difference(dict(zip(seeds, per_seed)), dict.fromkeys(seeds, 0.0), 0.95)


def test_report_lines_lead_with_the_verdict_and_say_worse_plainly(tmp_path):
    tapered, uniform = _curves(_crossing_seeds())
    data = results.LossVsTokens(
        params=1000,
        eval_tokens=4096,
        allocations=(statistics.allocation_curve("t", "taper", tapered, uniform, params=1000),),
    )
    worse = _paired([0.02, 0.03, 0.04, 0.03, 0.03])
    lines = report.headline(data, {"t": worse})
    assert lines[0] == "## Verdict"
    text = "\n".join(lines)
    assert "WORSE than uniform" in text and "taper better in 0 of 5 seeds" in text
    assert "16,000 tokens (16.00 tokens/param)" in text
    assert "crosses zero at" in text and "95% bootstrap interval" in text
    better = _paired([-0.02, -0.04, -0.03, -0.03, -0.03])
    assert "the taper is better" in "\n".join(report.headline(data, {"t": better}))
    undecided = _paired([-0.02, 0.04])
    assert "no difference decided" in "\n".join(report.headline(data, {"t": undecided}))
    section = report.crossing_section(data)
    assert section[0] == "## Difference against tokens seen"
    rows = [ln for ln in section if ln.startswith("| ") and "tokens/param" not in ln]
    assert rows[0].startswith("| 1,000 |") and rows[-1].startswith("| 16,000 |")
    assert report.crossing_plot(data, tmp_path / report.CROSSING_PLOT)
    assert (tmp_path / report.CROSSING_PLOT).stat().st_size > 0


def test_table_rows_spread_in_log_tokens():
    tokens = [1000 * (i + 1) for i in range(64)]  # linear evaluations, as the trainer makes
    tapered, uniform = _curves({0: [-0.1] * 64, 1: [-0.2] * 64}, tokens=tokens)
    a = statistics.allocation_curve("t", "t", tapered, uniform, params=1000)
    rows = report.table_rows(a)
    assert len(rows) <= report.TABLE_POINTS
    assert rows[0].tokens == 1000 and rows[-1].tokens == 64000
    assert rows[1].tokens < 10_000  # log spacing: the early part is not skipped
