"""Schedules: a new schedule is one record. The example of docs/tapers.md ("Adding a schedule"),
run as written, registers a toy `step` schedule that then parses, writes its canonical string and
YAML mapping, resolves to exact widths, and runs through `taperlm plan` as the MLP, head and KV
taper; unregistered after, it is gone again."""

from __future__ import annotations

import json

import pytest

from conftest import import_docs_example, raises_naming
from taperlm.cli import main
from taperlm.config import from_dict
from taperlm.errors import TaperError
from taperlm.spec.solver import solve_sizes
from taperlm.spec.taper import SCHEDULES, TaperSpec, describe, multipliers, register_schedule

pytestmark = pytest.mark.unit

BUILT_IN = "uniform, cosine, linear, sigmoid, bell, hourglass, groups, custom, novelty"


@pytest.fixture
def step_schedule(tmp_path, monkeypatch):
    """The docs' module, imported from a file (its last line registers `step`); unregistered after."""
    try:
        import_docs_example(
            "tapers.md", "## Adding a schedule", "step_schedule", tmp_path, monkeypatch
        )
        yield SCHEDULES["step"]
    finally:
        SCHEDULES.pop("step", None)


def test_toy_schedule_from_the_docs_is_a_whole_schedule(step_schedule):
    spec = TaperSpec.parse("Step:1.25:0.75")
    assert (spec.schedule, spec.start, spec.end, spec.multiple_of) == ("step", 1.25, 0.75, 16)
    assert spec.to_string() == "step:1.25:0.75" and TaperSpec.parse(spec.to_string()) == spec
    assert TaperSpec.parse("step").to_string() == "step:1.5:0.5"  # the endpoint defaults
    assert describe(spec) == "step 1.25 -> 0.75"
    assert multipliers(spec, 5) == [1.25, 1.25, 1.0, 0.75, 0.75]
    # exact budget, pinned ends, monotone order kept by the solver
    widths = solve_sizes(spec, 6, 352)
    assert widths == [448, 432, 416, 272, 272, 272] and sum(widths) == 6 * 352
    # the YAML mapping reads back to the same spec, checked by its own record
    assert spec.to_dict() == {"schedule": "step", "multiple_of": 16, "start": 1.25, "end": 0.75}
    assert from_dict(TaperSpec, spec.to_dict()) == spec
    with raises_naming(TaperError, "step", "start", ">= 0", "-1.0"):
        TaperSpec(schedule="step", start=-1.0).validate()
    with raises_naming(TaperError, "'step:1.5'", "step:START:END"):
        TaperSpec.parse("step:1.5")
    with raises_naming(TaperError, "'stairs'", f"{BUILT_IN}, step "):  # the new one is offered
        TaperSpec.parse("stairs")
    with raises_naming(ValueError, "'step'"):
        register_schedule(step_schedule)


def test_toy_schedule_runs_through_plan(step_schedule, capsys):
    assert (
        main(["plan", "--preset", "transformer-tiny", "--taper", "step:1.25:0.75", "--json"]) == 0
    )
    plan = json.loads(capsys.readouterr().out)
    assert plan["taper_spec"] == "step:1.25:0.75"
    assert plan["mlp_widths"] == solve_sizes(TaperSpec.parse("step:1.25:0.75"), 6, 352)
    assert plan["params_difference"] == plan["flops_difference"] == 0
    # the head and KV tapers speak the same spec language
    args = ["--taper", "step", "--head-taper", "step", "--kv-taper", "step:1.0:0.5"]
    assert main(["plan", "--preset", "transformer-tiny", *args]) == 0
    out = capsys.readouterr().out
    # each taper's line describes the toy schedule in its own terms
    assert "taper: step 1.5 -> 0.5" in out
    assert "head taper: step 1.5 -> 0.5" in out
    assert "KV taper: step 1 -> 0.5" in out


def test_built_in_schedules_only_without_the_toy():
    assert ", ".join(SCHEDULES) == BUILT_IN
    with pytest.raises(TaperError) as err:
        TaperSpec.parse("step:1.25:0.75")
    assert str(err.value) == (
        f"unknown taper schedule 'step' in 'step:1.25:0.75'; choose one of {BUILT_IN} "
        "(e.g. cosine:1.5:0.5, groups:1.5,1.0,0.5, custom:4224,3840,..., novelty:pilot)"
    )


# Per schedule, a spec whose multipliers ask for a zero MLP width at (layers, baseline) with steps
# of 16: where a multiplier x baseline rounds to 0 steps. novelty is measured (its widths come from
# a run, not a formula) and uniform never asks for one.
ASKS_FOR_ZERO = {
    "cosine": ("cosine:2:0", 4, 64),
    "linear": ("linear:2:0", 4, 64),
    "sigmoid": ("sigmoid:2:0", 4, 64),
    "bell": ("bell:1.9", 6, 16),
    "hourglass": ("hourglass:1.9", 6, 64),
    "groups": ("groups:1.5,1.5,0", 6, 64),
    "custom": ("custom:1.5,1.5,1,0", 4, 64),
}


def test_every_schedule_gives_a_zero_mlp_width_where_it_asks_for_one():
    """docs/tapers.md, "Zero widths": a layer whose multiplier rounds to 0 steps is attention
    only, whichever schedule asked (groups and the symmetric shapes are solved by whole units:
    that path once refused a zero the per-layer solver gives). The budget stays exact, the
    layers the schedule gave a width keep one, and sizes that may not be 0 (heads) still refuse."""
    formula = set(SCHEDULES) - {"uniform", "novelty"}
    assert set(ASKS_FOR_ZERO) == formula, "a new schedule: add the spec that asks for a zero"
    for name, (text, layers, baseline) in ASKS_FOR_ZERO.items():
        spec = TaperSpec.parse(text)
        asked = [round(r * baseline / 16) == 0 for r in multipliers(spec, layers)]
        assert any(asked), name
        widths = solve_sizes(spec, layers, baseline, zero_ok=True)
        assert sum(widths) == layers * baseline, name
        assert [w == 0 for w in widths] == asked, (name, widths)
        with pytest.raises(TaperError, match=r"rounds to 0|>= 1|positive"):
            solve_sizes(spec, layers, baseline)
