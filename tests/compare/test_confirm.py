"""The confirmatory comparisons (`--paper confirm`, `--paper confirm-code`): each one command
builds exactly the pre-registered comparison (docs/compare.md, "The confirmatory comparison:
pre-registered"): the pair, the size, the tokens per parameter, the lr (fixed, or tuned as
`--paper tokens` tunes), fresh seeds never used at these points, the rule and its cap; a setting
that would change it is refused; the estimates in the docs are the code's. And `--first-seed`,
which gives the fresh seeds, for any comparison."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from conftest import raises_naming
from taperlm.cli import build_parser
from taperlm.compare import confirm, options
from taperlm.compare.comparison import check_options, reported_seeds
from taperlm.compare.grid import build_grid
from taperlm.compare.options import options_from, run_arguments
from taperlm.compare.tuning import TUNE_SEED_BASE
from taperlm.config import to_dict
from taperlm.config.loading import run_config_from_dict
from taperlm.errors import ConfigError, MalformedFileError

ROOT = Path(__file__).resolve().parents[2]
KEPT = ROOT / "benchmarks/results/longrun_tokens_micro"


def _opts(tmp_path: Path, *args: str):
    parsed = build_parser().parse_args(["compare", *args, "--out", str(tmp_path / "out")])
    return options_from(parsed)


def _kept_configs(point: str) -> dict[str, dict]:
    """cell -> the resolved config of every kept cell of a `--paper tokens` micro point."""
    return {
        p.parent.name: json.loads(p.read_text())["config"]
        for p in sorted((KEPT / point / "runs").glob("*/result.json"))
    }


def test_confirm_builds_the_micro_10_comparison_on_fresh_seeds(tmp_path):
    opts = _opts(tmp_path, "--paper", "confirm")
    sub = confirm.confirm_options(opts)
    allocs, provisional = check_options(sub)
    assert [a.spec.to_string() for a in allocs] == ["uniform", "cosine:0.75:1.25"]
    seeds = reported_seeds(sub)
    assert seeds == list(range(100, 115))
    assert (sub.stop.as_text(), sub.stop_alpha, sub.min_seeds, sub.stop_on) == (
        "decided", 0.05, 3, "each"
    )  # fmt: skip
    assert not sub.tune_lr and sub.data is None and sub.paper is None
    # the kept micro-10 point: its reported seeds were 0-4, its lr tuning's 10000-10001; the
    # fresh seeds share none of them
    kept = _kept_configs("micro-10579968")
    used = {c["train"]["seed"] for c in kept.values()}
    assert used == {0, 1, 2, 3, 4, TUNE_SEED_BASE, TUNE_SEED_BASE + 1}
    assert not used & set(seeds)
    # every cell trains as that point's did but for the seed (and where the data sits, and the
    # vocabulary, which is sized to the data when it is read)
    ref = kept["uniform-s0"]
    grid = build_grid(provisional, allocs, seeds)
    for alloc in ("uniform", "cosine-0.75-1.25"):
        # the kept config read as compare reads a kept cell's (by meaning: a field added since
        # has its default), as `resume_conflicts` does
        got = to_dict(grid.cell(alloc, 100).config)
        want = to_dict(run_config_from_dict(kept[f"{alloc}-s0"]))
        assert got["train"] == want["train"] | {"seed": 100}, alloc
        assert {k: v for k, v in got["model"].items() if k != "vocab_size"} == {
            k: v for k, v in want["model"].items() if k != "vocab_size"
        }, alloc
    assert ref["train"]["lr"] == 0.004 == provisional.train.lr
    assert provisional.train.tokens == 10_579_968
    # the report's reproducing command names the fresh seeds
    args = run_arguments(sub, len(seeds), provisional.train.tokens)
    assert args[:6] == ["--seeds", "15", "--first-seed", "100", "--tokens", "10579968"]
    assert "train.lr=0.004" in args


def test_confirm_code_tunes_uniform_on_the_code_corpus(tmp_path):
    (tmp_path / "code").mkdir()
    opts = _opts(tmp_path, "--paper", "confirm-code", "--data", str(tmp_path / "code"))
    sub = confirm.confirm_options(opts)
    allocs, provisional = check_options(sub)
    assert [a.spec.to_string() for a in allocs] == ["uniform", "cosine:0.75:1.25"]
    assert sub.data == tmp_path / "code" and sub.preset == "transformer-micro"
    assert provisional.train.tokens == 2_115_584  # 2 tokens per parameter at bpe:2048
    assert (sub.tune_lr, sub.tune_scope, sub.lr_grid_extend) == (True, "uniform", 3)
    assert not any(o.startswith("train.lr=") for o in sub.overrides)
    assert reported_seeds(sub) == list(range(100, 115))
    # the built-in micro-2 point's cells used seeds 0-4 (and 10000-10001 to tune) too, and its
    # cells trained as these will but for the seed and the lr (tuned on the code corpus first)
    kept = _kept_configs("micro-2115584")
    assert {c["train"]["seed"] for c in kept.values()} == {0, 1, 2, 3, 4, 10000, 10001}
    grid = build_grid(provisional, allocs, reported_seeds(sub))
    got, want = to_dict(grid.cell("uniform", 100).config)["train"], kept["uniform-s0"]["train"]
    assert got | {"seed": 0, "lr": want["lr"]} == want


@pytest.mark.parametrize(
    "args, named",
    [
        (["--paper", "confirm-code"], ("confirm-code", "code corpus", "--data DIR")),
        (["--paper", "confirm", "--data", "."], ("built-in corpus", "no --data")),
        (["--paper", "confirm", "--tapers", "uniform;cosine"], ("pre-registered", "--tapers")),
        (["--paper", "confirm", "--tokens", "1000"], ("pre-registered", "--tokens")),
        (["--paper", "confirm", "--first-seed", "7"], ("pre-registered", "--first-seed")),
        (["--paper", "confirm", "--tune-lr"], ("pre-registered", "--tune-lr")),
        (["--paper", "confirm", "--preset", "transformer-nano"], ("pre-registered", "--preset")),
        (["--paper", "confirm", "--seeds", "5"], ("--stop decided", "--seeds 15")),
        (["--paper", "confirm", "--stop", "fixed"], ("--stop decided", "exactly these")),
        (["--paper", "confirm", "--stop-alpha", "0.1"], ("--stop-alpha 0.05",)),
    ],
)
def test_what_would_change_the_pre_registration_is_refused(tmp_path, args, named):
    with raises_naming(ConfigError, *named):
        confirm.confirm_options(_opts(tmp_path, *args))


def test_the_same_rule_given_explicitly_is_accepted(tmp_path):
    args = ["--paper", "confirm", "--seeds", "15", "--stop", "decided", "--min-seeds", "3"]
    sub = confirm.confirm_options(_opts(tmp_path, *args))
    assert reported_seeds(sub) == list(range(100, 115))


def test_the_modes_are_registered_and_the_docs_state_their_times():
    from taperlm.compare import study

    # the modes declared confirmatory are the ones with a pre-registered point
    assert options.CONFIRM_MODES == tuple(confirm.CONFIRM_POINTS) == ("confirm", "confirm-code")
    assert all(study.studies()[m] is confirm.confirm_plan for m in options.CONFIRM_MODES)
    page = (ROOT / "docs/compare.md").read_text(encoding="utf-8")
    for mode in options.CONFIRM_MODES:
        at_most = confirm.confirm_hours(mode)
        at_three = confirm.confirm_hours(mode, seeds=3)
        assert f"`{mode}` | ≈ {at_three:.1f} h to ≈ {at_most:.1f} h" in page, mode


def test_first_seed_shifts_every_seed_and_is_checked(tmp_path):
    opts = _opts(tmp_path, "--preset", "transformer-tiny", "--seeds", "3", "--first-seed", "42")
    assert reported_seeds(opts) == [42, 43, 44]
    assert reported_seeds(dataclasses.replace(opts, first_seed=0)) == [0, 1, 2]
    huge = dataclasses.replace(opts, first_seed=2**32 - 2)
    with raises_naming(ConfigError, "--first-seed", "--seeds 3", "smaller --first-seed"):
        reported_seeds(huge)
    # tuning seeds (10000 on) must stay disjoint from the reported ones
    clash = dataclasses.replace(opts, first_seed=TUNE_SEED_BASE - 1, tune_lr=True)
    with raises_naming(ConfigError, "tuning seeds", "overlap"):
        check_options(clash)


# ----------------------------------------------------------------------------------------------
# the reading: a finished comparison's report.json read by the pre-registered rule

# a real comparison's report.json, for the shape of every field the reading touches
SHAPE = ROOT / "benchmarks/results/own_lr_nano_8tpp.json"


def _report(mode: str, per_seed: list[float], reason: str, ci: tuple[float, float]) -> dict:
    """`mode`'s report.json as its run would write it, with these paired differences (taper −
    uniform, seeds 100 on), the stop's reason and the anytime-valid interval at the last seed."""
    doc = json.loads(SHAPE.read_text())
    point = confirm.CONFIRM_POINTS[mode]
    n = len(per_seed)
    seeds = list(range(100, 100 + n))
    doc["base_config"]["model"] = _kept_configs("micro-10579968")["uniform-s0"]["model"]
    doc["base_config"]["train"]["tokens"] = confirm.budget_tokens("micro", point.tokens_per_param)
    doc["base_config"]["train"]["lr"] = 0.004 if point.lr else 0.002
    doc["lr_tuning"] = None if point.lr else {**doc["lr_tuning"], "scope": "uniform"}
    uni, taper = doc["allocations"]
    uni["label"], taper["label"] = "uniform", "cosine:0.75:1.25"
    mean = sum(per_seed) / n
    taper["diff_vs_uniform"]["val_loss"] = {
        "seeds": seeds, "per_seed": per_seed, "n": n, "mean": mean,
        "ci": [mean - 0.01, mean + 0.01],
    }  # fmt: skip
    step = {"n": n, "mean": mean, "half": (ci[1] - ci[0]) / 2, "ci": list(ci)}
    doc["stopping"] = {
        **doc["stopping"], "rule": "decided", "alpha": 0.05, "min_seeds": 3,
        "stop_on": "each", "cap": 15, "seeds_used": n, "stopped_at": n, "reason": reason,
        "sequence": [{"n": n, "comparisons": {"cosine:0.75:1.25": step}, "stops": True}],
    }  # fmt: skip
    return doc


CONFIRMED = ([-0.05, -0.04, -0.06, 0.01], "decided", (-0.09, -0.01))
REFUTED = ([0.03, 0.02, 0.04], "decided", (0.001, 0.06))
UNDECIDED = ([0.01, -0.01] * 7 + [0.0], "cap", (-0.02, 0.02))


@pytest.mark.parametrize("mode", ["confirm", "confirm-code"])
@pytest.mark.parametrize(
    "case, verdict, says",
    [
        (CONFIRMED, "confirmed", "beats uniform"),
        (REFUTED, "refuted", "is worse than"),
        (UNDECIDED, "not confirmed", "15 fresh seeds do not decide a difference"),
    ],
)
def test_the_reading_is_the_rule_s(mode, case, verdict, says):
    per_seed, reason, ci = case
    o = confirm.read_outcome(_report(mode, per_seed, reason, ci), mode)
    assert o.verdict == verdict and o.anytime_ci == ci and o.n == len(per_seed)
    assert o.seeds[0] == 100 and o.better_in == sum(d < 0 for d in per_seed)
    sentence = confirm.outcome_sentence(o)
    assert says in sentence and f"better in {o.better_in} of {o.n}" in sentence
    assert ("code corpus" in sentence) == (mode == "confirm-code")
    (row,) = confirm.outcome_table([o])[2:]
    assert f"**{verdict}**" in row and f"{o.mean:+.4f}" in row


def _set(doc: dict, path: str, value) -> None:
    *head, last = path.split(".")
    for key in head:
        doc = doc[int(key)] if isinstance(doc, list) else doc[key]
    doc[last] = value


# Every field the reading checks, changed to what another run would have: each is refused by
# name, never read as the pre-registered comparison.
NOT_THE_RUN = [
    ("allocations.1.label", "cosine:1.5:0.5", "allocations"),
    ("allocations.0.label", "cosine:0.75:1.25", "allocations"),
    ("base_config.train.tokens", 2_115_584, "tokens a run"),
    ("base_config.model.d_model", 64, "is not transformer-micro"),
    ("base_config.model.n_layers", 12, "is not transformer-micro"),
    ("base_config.train.lr", 0.008, "lr 0.004"),
    ("lr_tuning", {"scope": "each"}, "untuned"),
    ("stopping.rule", "fixed", "stopping rule"),
    ("stopping.alpha", 0.1, "stopping rule"),
    ("stopping.min_seeds", 2, "stopping rule"),
    ("stopping.cap", 20, "stopping rule"),
    ("stopping.stop_on", "all", "stopping rule"),
    ("stopping.seeds_used", 5, "seeds"),
    ("allocations.1.diff_vs_uniform.val_loss.seeds", [0, 1, 2, 3], "seeds"),
    ("stopping.sequence", [], "no interval"),
    ("stopping.reason", "cap", "not by its rule"),  # stopped by the cap at 4 of 15 seeds
]


@pytest.mark.parametrize("path, value, named", NOT_THE_RUN)
def test_a_report_that_is_not_the_pre_registered_run_is_refused(path, value, named):
    doc = _report("confirm", *CONFIRMED)
    confirm.read_outcome(doc, "confirm")  # as run, it reads
    _set(doc, path, value)
    with raises_naming(MalformedFileError, "not the pre-registered --paper confirm", named):
        confirm.read_outcome(doc, "confirm", "x/report.json")


def test_an_interval_that_contradicts_its_reason_is_refused():
    """Decided with 0 inside the interval, or the cap with 0 outside it: not the rule's stop."""
    per_seed, _, _ = CONFIRMED
    for reason, ci in (("decided", (-0.05, 0.01)), ("cap", (-0.05, -0.01))):
        doc = _report("confirm", per_seed if reason == "decided" else UNDECIDED[0], reason, ci)
        with raises_naming(MalformedFileError, "not by its rule"):
            confirm.read_outcome(doc, "confirm")
    # confirm-code's lr must have been tuned for uniform first
    doc = _report("confirm-code", *CONFIRMED)
    doc["lr_tuning"] = None
    with raises_naming(MalformedFileError, "tuned first"):
        confirm.read_outcome(doc, "confirm-code")


def test_conclude_appends_the_reading_once(tmp_path, capsys):
    """report.md gains the reading after the comparison's own text, once however often the
    run is resumed; a report the rule cannot read leaves report.md as it was and says why."""
    doc = _report("confirm", *CONFIRMED)

    class Finished:  # the two paths and the object a finished ComparisonReport gives
        md_path, json_path = tmp_path / "report.md", tmp_path / "report.json"

        def to_json(self):
            return doc

    Finished.md_path.write_text("# the comparison\n\nits tables\n")
    for _ in range(2):
        confirm.conclude(Finished(), "confirm")  # type: ignore[arg-type]
    text = Finished.md_path.read_text()
    assert text.startswith("# the comparison\n\nits tables\n\n## The pre-registered reading\n")
    assert text.count(confirm.OUTCOME_HEADING) == 1 and "**confirmed**" in text
    assert "Confirmed: at micro, 10 tokens per parameter" in capsys.readouterr().err
    doc["stopping"]["rule"] = "fixed"
    Finished.md_path.write_text("# another\n")
    confirm.conclude(Finished(), "confirm")  # type: ignore[arg-type]
    assert Finished.md_path.read_text() == "# another\n"
    assert "no pre-registered reading" in capsys.readouterr().err


def test_a_committed_reading_reaches_plan_s_advice(tmp_path):
    """A finished check's report.json committed under its RESULT_FILES name joins the packaged
    measurements (benchmarks/ratio_measurements.py) as the point's confirmation, and `taperlm
    plan`'s advice at that point reads it; a report the rule refuses stops the build."""
    import shutil
    import sys

    from taperlm.spec.ratio_advice import advice

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import ratio_measurements
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    results = ROOT / "benchmarks/results"
    for path in [results / "scaling_report.json", *results.glob("longrun_*.json")]:
        shutil.copy(path, tmp_path / path.name)
    doc = _report("confirm", *UNDECIDED)
    (tmp_path / confirm.RESULT_FILES["confirm"]).write_text(json.dumps(doc))
    built = ratio_measurements.build(tmp_path)
    (check,) = built["confirmations"]
    assert (check["point"], check["verdict"], check["corpus"]) == (
        "micro-10579968", "not confirmed", "built-in"
    )  # fmt: skip
    a = advice(1_058_016, 10_579_968, built)
    assert a["nearest"][0]["point"] == "micro-10579968"
    assert a["nearest"][0]["status"] == "undecided"
    assert "(taperlm compare --paper confirm): not confirmed" in a["verdict"]
    doc["stopping"]["cap"] = 20
    (tmp_path / confirm.RESULT_FILES["confirm"]).write_text(json.dumps(doc))
    with raises_naming(MalformedFileError, "not the pre-registered"):
        ratio_measurements.build(tmp_path)


def test_a_check_under_way_is_read_in_seed_order_from_its_cells(tmp_path):
    """The interim reading: the seeds both arms have finished, from 100 in order (a gap ends
    the sequence: the rule reads seeds in order), no interval before 3, and decided when the
    anytime-valid interval excludes 0, as the rule would stop."""
    import shutil

    kept = ROOT / "benchmarks/results" / confirm.RESULT_FILES["confirm"].removesuffix(".json")
    if not kept.is_dir():
        pytest.skip("no kept cells of --paper confirm")
    runs = tmp_path / "runs"
    shutil.copytree(kept / "runs", runs)
    full = confirm.interim(runs)
    assert full.seeds[0] == 100 and len(full.seeds) >= 3 and full.anytime_ci is not None
    shutil.rmtree(runs / "cosine-0.75-1.25-s102")  # a gap at the third seed
    gap = confirm.interim(runs)
    assert gap.seeds == (100, 101) and gap.anytime_ci is None and not gap.decided
    assert "no interval before 3 seeds" in confirm.interim_sentence(gap)
    shutil.rmtree(runs / "uniform-s100")
    assert confirm.interim_sentence(confirm.interim(runs)) == "under way: no seed finished yet"
    # the same differences shifted to one sign and tightened: decided
    shutil.rmtree(runs)
    shutil.copytree(kept / "runs", runs)
    for seed in full.seeds:
        path = runs / f"cosine-0.75-1.25-s{seed}" / "result.json"
        doc = json.loads(path.read_text())
        uniform = json.loads((runs / f"uniform-s{seed}" / "result.json").read_text())
        doc["val"]["loss"] = uniform["val"]["loss"] + 0.05 + 0.001 * (seed % 2)
        path.write_text(json.dumps(doc))
    shifted = confirm.interim(runs)
    assert shifted.decided == (len(full.seeds) >= 3) and shifted.anytime_ci[0] > 0
    assert "decided, its report not committed yet" in confirm.interim_sentence(shifted)
