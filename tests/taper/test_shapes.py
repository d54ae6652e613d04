"""Shapes beyond monotone: the bell (wide middle) and the hourglass (narrow middle) as schedules
of their own (formula, exact budget, exact symmetry, middle max/min, strength 0 = uniform,
refusals), in `taperlm plan` and YAML; and OpenELM's FFN widening as the linear schedule."""

from __future__ import annotations

import itertools
import json
import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from conftest import raises_naming
from taperlm.cli import main
from taperlm.config import from_dict
from taperlm.errors import TaperError
from taperlm.spec.solver import solve_sizes
from taperlm.spec.taper import TaperSpec, bump_profile, describe, multipliers

pytestmark = pytest.mark.unit

SHAPES = ["bell", "hourglass"]


def test_formula_at_five_layers():
    """b = (1 + cos(pi |2l - 4| / 4)) / 2 = 0, 1/2, 1, 1/2, 0 (mean 0.4); r = 1 +- s (b - 0.4)."""
    assert bump_profile(5) == pytest.approx([0, 0.5, 1, 0.5, 0], abs=1e-15)
    assert multipliers(TaperSpec.parse("bell:0.5"), 5) == pytest.approx([0.8, 1.05, 1.3, 1.05, 0.8])
    assert multipliers(TaperSpec.parse("hourglass:0.5"), 5) == pytest.approx(
        [1.2, 0.95, 0.7, 0.95, 1.2]
    )
    # the strength is the multiplier difference between the middle and the ends
    r = multipliers(TaperSpec.parse("bell:0.8"), 9)
    assert r[4] - r[0] == pytest.approx(0.8)
    assert bump_profile(1) == [0.0] and bump_profile(2) == [0.0, 0.0]


@settings(max_examples=150, deadline=None)
@given(
    shape=st.sampled_from(SHAPES),
    strength=st.floats(0, 1.99),
    n_layers=st.integers(1, 64),
    baseline_steps=st.integers(4, 300),
    multiple_of=st.sampled_from([1, 16, 64]),
)
# an hourglass whose middle rounds to no step at an odd depth: the pairs alone cannot meet an odd
# budget, so the middle takes a step (a fresh clone's run found these)
@example(shape="hourglass", strength=1.75, n_layers=7, baseline_steps=5, multiple_of=1)
@example(shape="hourglass", strength=1.75, n_layers=21, baseline_steps=5, multiple_of=1)
def test_exact_symmetric_and_peaked_where_the_shape_says(
    shape, strength, n_layers, baseline_steps, multiple_of
):
    spec = TaperSpec.parse(f"{shape}:{strength!r}", multiple_of=multiple_of)
    r = multipliers_or_refusal(spec, n_layers)
    if r is None:
        return
    assert math.fsum(r) / n_layers == pytest.approx(1.0, abs=1e-12)
    assert r == r[::-1]  # exactly symmetric in floating point
    baseline = baseline_steps * multiple_of
    w = solve_sizes(spec, n_layers, baseline, zero_ok=True)
    assert sum(w) == n_layers * baseline
    # a width of 0 (attention only) only where the multiplier rounds to no step (such a layer
    # may also be given a step to meet the budget, as in the per-layer solver)
    assert all(x % multiple_of == 0 for x in w)
    assert all(x > 0 or ri * baseline / multiple_of < 0.5 for x, ri in zip(w, r))
    assert w == w[::-1]  # the solver keeps the pairs equal
    half = w[: (n_layers + 1) // 2]  # from the end layers in to the middle
    steps = list(itertools.pairwise(half))
    if shape == "bell":
        assert all(a <= b for a, b in steps) and max(w) == half[-1] and min(w) == w[0]
    else:
        assert all(a >= b for a, b in steps) and min(w) == half[-1] and max(w) == w[0]
    # every width within a few steps of its ideal value
    assert max(abs(x - ri * baseline) for x, ri in zip(w, r)) <= 2 * multiple_of + 1e-6


def multipliers_or_refusal(spec: TaperSpec, n_layers: int) -> list[float] | None:
    """The multipliers, or None after checking the refusal of an hourglass whose middle would go
    below 0 at this depth (its message names the largest strength there, which does work)."""
    try:
        return multipliers(spec, n_layers)
    except TaperError as err:
        assert spec.schedule == "hourglass" and ">= 0" in str(err)
        limit = float(str(err).rsplit("at most ", 1)[1])
        assert spec.bump > limit - 1e-3
        ok = TaperSpec(schedule="hourglass", bump=limit * (1 - 1e-3))
        assert min(multipliers(ok, n_layers)) >= 0
        return None


@settings(max_examples=60, deadline=None)
@given(shape=st.sampled_from(SHAPES), n_layers=st.integers(1, 64), steps=st.integers(1, 300))
def test_strength_zero_is_uniform(shape, n_layers, steps):
    spec = TaperSpec.parse(f"{shape}:0")
    assert multipliers(spec, n_layers) == [1.0] * n_layers
    assert solve_sizes(spec, n_layers, steps * 16) == [steps * 16] * n_layers


def test_bell_and_hourglass_mirror_each_other_about_uniform():
    for n_layers in (3, 6, 7, 24):
        bell = multipliers(TaperSpec.parse("bell:0.7"), n_layers)
        glass = multipliers(TaperSpec.parse("hourglass:0.7"), n_layers)
        assert [a + b for a, b in zip(bell, glass)] == pytest.approx([2.0] * n_layers)


def test_widths_of_the_440m_shape():
    """24 layers x 3072: symmetric, the two middle layers widest (bell) and narrowest (hourglass)."""
    bell = solve_sizes(TaperSpec.parse("bell"), 24, 3072)
    glass = solve_sizes(TaperSpec.parse("hourglass"), 24, 3072)
    for w in (bell, glass):
        assert sum(w) == 24 * 3072 and w == w[::-1]
    assert bell[11] == max(bell) and bell[0] == min(bell)
    assert glass[11] == min(glass) and glass[0] == max(glass)
    # ends at 1 - 0.5 * mean(b) = 1 - 0.5 * 23/48 of 3072 = 2336 (rounded to steps of 16)
    assert bell[0] == 2336 and glass[0] == 3808


def test_an_odd_total_over_an_even_depth_is_still_exact():
    """A KV taper's MLP total can be odd in steps over an even depth: equal pairs cannot hold it;
    the general solver meets the budget, the pairs within one step."""
    w = solve_sizes(TaperSpec.parse("bell"), 6, 256, total=6 * 256 + 16)
    assert sum(w) == 6 * 256 + 16
    assert max(abs(a - b) for a, b in zip(w, w[::-1])) == 16


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("bell:2", ("bell", "[0, 2)", "2.0", "0 is uniform")),
        ("hourglass:-0.1", ("hourglass", "[0, 2)", "-0.1")),
        ("bell:nan", ("bell", "[0, 2)", "nan")),
        ("bell:inf", ("bell", "[0, 2)", "inf")),
        ("bell:wide", ("'bell:wide'", "'wide'")),
        ("hourglass:0.5:1", ("'hourglass:0.5:1'", "hourglass:STRENGTH")),
    ],
)
def test_out_of_range_strengths_are_refused(text, named):
    with raises_naming(TaperError, *named):
        TaperSpec.parse(text)


def test_an_hourglass_too_strong_for_its_depth_is_refused_naming_the_limit():
    """At 3 layers the middle multiplier is 1 - s (1 - 1/3): below 0 past s = 1.5."""
    with raises_naming(TaperError, "hourglass:1.9", "layer 1 of 3", ">= 0", "at most 1.5"):
        solve_sizes(TaperSpec.parse("hourglass:1.9"), 3, 256)
    with raises_naming(TaperError, "hourglass:1.5", "layer 1", "rounds to 0", "strength"):
        solve_sizes(TaperSpec.parse("hourglass:1.5"), 3, 256)  # 0 exactly: no MLP is refused
    with raises_naming(TaperError, "hourglass:1.9", "layers 11 and 12", "rounds to 0"):
        solve_sizes(TaperSpec.parse("hourglass:1.9"), 24, 256)  # 0.02 x 256 < half a step
    w = solve_sizes(TaperSpec.parse("hourglass:1.9"), 24, 3072)  # 0.02 x 3072 = 4 steps: fine
    assert w == w[::-1] and w[11] == min(w) > 0 and sum(w) == 24 * 3072


def test_monotone_true_is_refused_for_a_symmetric_shape():
    spec = TaperSpec.parse("bell")
    spec.monotone = True
    with raises_naming(TaperError, "bell:0.5", "not monotone"):
        solve_sizes(spec, 6, 256)


@pytest.mark.parametrize("text", ["bell", "bell:0", "bell:1.25", "hourglass:0.3", "hourglass"])
def test_spec_string_yaml_and_label(text):
    spec = TaperSpec.parse(text)
    assert TaperSpec.parse(spec.to_string()) == spec
    assert spec.to_dict() == {"schedule": spec.schedule, "multiple_of": 16, "bump": spec.bump}
    assert from_dict(TaperSpec, spec.to_dict()) == spec
    assert describe(spec).startswith(f"{spec.schedule} {spec.bump:g} (")
    assert TaperSpec.parse("bell").bump == 0.5


@pytest.mark.parametrize("shape", ["bell", "hourglass:0.8"])
def test_plan_resolves_the_shapes_at_the_exact_budget(shape, capsys):
    assert main(["plan", "--preset", "transformer-tiny", "--taper", shape, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["mlp_widths"] == solve_sizes(TaperSpec.parse(shape), 6, 352)
    assert plan["params_difference"] == plan["flops_difference"] == 0
    assert plan["taper_spec"] == TaperSpec.parse(shape).to_string()
    # the head taper speaks the same language
    assert main(["plan", "--preset", "transformer-micro", "--taper", shape, "--head-taper",
                 "bell:0.7"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "head taper: bell 0.7 (wide middle)" in out and "budget matched" in out


# ----------------------------------------------------------------------------------------------
# OpenELM's FFN widening: the linear schedule


OPENELM_FFN = "linear:0.2222222222222222:1.7777777777777777"  # docs/tapers.md


def test_openelm_ffn_scaling_is_the_linear_schedule():
    """OpenELM's layer-wise scaling gives layer i of N an FFN multiplier (of d_model)
    beta_i = 0.5 + (4.0 - 0.5) i / (N - 1): linear, eightfold from first to last. At the uniform
    model's budget that is the linear schedule from 2/9 to 16/9 (mean 1, ratio 8)."""
    for n_layers in (2, 6, 16, 24, 36):
        beta = [0.5 + 3.5 * i / (n_layers - 1) for i in range(n_layers)]
        mean = sum(beta) / n_layers
        r = multipliers(TaperSpec.parse(OPENELM_FFN), n_layers)
        assert r == pytest.approx([b / mean for b in beta], rel=1e-12)
    w = solve_sizes(TaperSpec.parse(OPENELM_FFN), 24, 3072)
    assert sum(w) == 24 * 3072 and w == sorted(w) and w[-1] / w[0] == pytest.approx(8, rel=0.02)
