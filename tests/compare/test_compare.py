"""`taperlm compare`: end to end on a tiny model, resume, statistics, paper grids, bad input;
cells on several worker processes (the same numbers as one process), the CPUs it may use, clean
stops on Ctrl-C that name the command which resumes, and what each cell records of how it ran."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import assert_naming, raises_naming
from taperlm.analysis.stats import (
    Summary,
    paired_difference,
    pairwise_agreement,
    relative_ppl_change,
    spearman,
    summary,
    t_quantile,
)
from taperlm.cli import main
from taperlm.compare import cell as compare_cell
from taperlm.compare import execute
from taperlm.compare import results as compare_results
from taperlm.compare.grid import (
    PAPER_SWEEP,
    build_grid,
    controlled_allocations,
    parse_allocations,
    split_taper_list,
    sweep_allocations,
)
from taperlm.config import RunConfig, TrainConfig
from taperlm.config.presets import get_preset
from taperlm.errors import ConfigError
from taperlm.runtime import cpus

TINY = [
    "--preset",
    "transformer-tiny",
    "--set",
    "model.n_layers=3",
    "--set",
    "model.d_model=32",
    "--set",
    "model.n_heads=2",
    "--set",
    "model.mlp_width=64",
    "--set",
    "model.context_length=32",
    "--set",
    "train.seq_len=32",
    "--set",
    "train.micro_batch_size=2",
    "--set",
    "train.batch_tokens=64",
    "--set",
    "train.eval_tokens=64",
    "--set",
    "train.keep_checkpoints=2",
    "--set",
    "train.checkpoint_every=2",
    "--tokens",
    "256",
    "--val-tokens",
    "128",
    "--novelty-tokens",
    "96",
    "--threads",
    "1",
    "--jobs",
    "1",
    "--no-progress",
]
ALLOCS = ["--tapers", "uniform;late=cosine:0.5:1.5"]


def assert_delta_units(md: str) -> None:
    """Every Δ column of a report's tables names its unit (nats, %, or points): a difference in
    perplexity points once stood unlabelled next to percentages."""
    headers = [ln for i, ln in enumerate(md.splitlines()[:-1]) if ln.startswith("|")
               and md.splitlines()[i + 1].startswith("|---")]  # fmt: skip
    cells = [c.strip() for h in headers for c in h.strip("|").split("|") if "Δ" in c]
    assert cells, "no Δ column found"
    unitless = [c for c in cells if not any(u in c for u in ("nats", "%", "points"))]
    assert not unitless, f"Δ columns without a unit: {unitless}"


def _cli(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(args)
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    from taperlm.data.prepare import prepare

    root = tmp_path_factory.mktemp("cmpdata")
    rng = random.Random(0)
    words = "the cat dog runs fast slow over under a bird sings loud tree house river".split()
    text = "\n".join(
        " ".join(rng.choice(words) for _ in range(rng.randint(5, 12))) + "." for _ in range(600)
    )
    (root / "text.txt").write_text(text + "\n")
    prepare(str(root / "text.txt"), root / "data", "bpe:300", val_tokens=600, progress=False)
    return root / "data"


@pytest.fixture(scope="module")
def finished(data_dir, tmp_path_factory) -> tuple[Path, list[str], str]:
    out = tmp_path_factory.mktemp("cmp") / "out"
    args = ["compare", *TINY, *ALLOCS, "--seeds", "3", "--data", str(data_dir), "--out", str(out)]
    rc, _, stderr = _cli(args)
    assert rc == 0, stderr
    return out, args, stderr


def _report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


# ---------------------------------------------------------------------------------- end to end


def test_grid_runs_end_to_end(finished):
    out, _, stderr = finished
    # seed-major order: complete pairs exist as early as possible
    done = [
        line.split(":")[0].split("] ")[1] for line in stderr.splitlines() if line.startswith("[")
    ]
    assert done == ["uniform-s0", "late-s0", "uniform-s1", "late-s1", "uniform-s2", "late-s2"]
    for name in ("report.md", "report.json", "widths.png", "val_loss.png", "novelty.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert (out / "val_loss_diff.png").is_file()
    rep = _report(out)
    names = [a["name"] for a in rep["allocations"]]
    assert names == ["uniform", "late"]
    assert sorted(p.name for p in (out / "runs").iterdir()) == sorted(
        f"{a}-s{s}" for a in names for s in range(3)
    )
    for a in rep["allocations"]:
        assert a["val_loss"]["n"] == 3 and len(a["val_loss"]["values"]) == 3
        assert math.isclose(a["val_ppl"]["values"][0], math.exp(a["val_loss"]["values"][0]))
        assert a["tokens_per_s"]["mean"] > 0
        assert len(a["novelty"]["rho_mlp_per_layer"]) == 3
    # one budget: equal parameters and FLOPs/token, different widths
    a, b = rep["allocations"]
    assert a["params"] == b["params"] and a["flops_per_token"] == b["flops_per_token"]
    assert a["widths"] == [64, 64, 64] and b["widths"] != a["widths"]
    assert b["widths"][0] < b["widths"][-1]  # the wider-late mirror
    assert sum(b["widths"]) == sum(a["widths"])
    assert all(rep["checks"].values()), rep["checks"]
    # the model follows the data's tokenizer (a preset's 8192 vocab would waste rows)
    assert rep["base_config"]["model"]["vocab_size"] == 300
    md = (out / "report.md").read_text()
    assert "| uniform | `uniform` |" in md and "| late | `cosine:0.5:1.5` |" in md
    assert "Δ loss vs uniform, nats [95% CI]" in md and "(baseline)" in md
    assert_delta_units(md)
    assert "taperlm compare --preset transformer-tiny" in md
    assert "![widths](widths.png)" in md and "## Novelty" in md
    # the difference against tokens seen: report.json's curve, the verdict leading report.md
    from taperlm.compare.report import CROSSING_PLOT as PLOT_FILE
    from taperlm.compare.results import LossVsTokens

    vs_tokens = LossVsTokens.from_json(rep["loss_vs_tokens"])
    (late,) = vs_tokens.allocations
    assert late.name == "late" and late.seeds == (0, 1, 2)
    assert vs_tokens.params == a["params"] and late.points[-1].tokens == 256
    assert late.points[-1].per_seed == pytest.approx(
        [r["curve"][-1][1] - rep["runs"][f"uniform-s{s}"]["curve"][-1][1]
         for s, r in ((s, rep["runs"][f"late-s{s}"]) for s in range(3))]
    )  # fmt: skip
    assert md.index("## Verdict") < md.index("## Validation")
    assert "## Difference against tokens seen" in md and (out / PLOT_FILE).is_file()


def test_typed_records_read_back_the_files_they_came_from(finished):
    """report.json's summary and every result.json read into their typed records and written
    back give the same JSON, key order included (a rerun that finds a comparison done rewrites
    its report from these records)."""
    from taperlm.compare.results import ComparisonReport

    out = finished[0]
    rep = _report(out)
    again = ComparisonReport.from_json(rep, out).to_json()
    assert json.dumps(again) == json.dumps(rep)
    for cell in (out / "runs").iterdir():
        data = json.loads((cell / "result.json").read_text())
        assert json.dumps(compare_results.CellResult.from_json(data).to_json()) == json.dumps(data)


def test_kept_results_read_back_unchanged():
    """The kept token-axis cells (benchmarks/results/longrun_tokens_nano, written before the
    records were typed) read and write back to the same bytes' JSON."""
    kept = Path(__file__).resolve().parents[2] / "benchmarks/results/longrun_tokens_nano"
    paths = sorted(kept.glob("**/result.json"))
    assert paths
    for path in paths:
        data = json.loads(path.read_text())
        assert json.dumps(compare_results.CellResult.from_json(data).to_json()) == json.dumps(
            data
        ), path


def test_paired_ci_matches_hand_computation(finished):
    rep = _report(finished[0])
    u, late = rep["allocations"]
    diffs = [
        late["per_seed"][str(s)]["val_loss"] - u["per_seed"][str(s)]["val_loss"] for s in range(3)
    ]
    m = sum(diffs) / 3
    sd = math.sqrt(sum((d - m) ** 2 for d in diffs) / 2)
    half = 4.302653 * sd / math.sqrt(3)
    d = late["diff_vs_uniform"]["val_loss"]
    assert d["n"] == 3 and d["per_seed"] == pytest.approx(diffs, abs=1e-12)
    assert d["mean"] == pytest.approx(m, abs=1e-12)
    assert d["ci"] == pytest.approx([m - half, m + half], rel=1e-6)
    assert d["t"] == pytest.approx(4.302653, abs=1e-6)


def test_same_seed_same_data_order_and_init_seed(finished):
    out = finished[0]
    rep = _report(out)
    runs = rep["runs"]
    for s in range(3):
        u, late = runs[f"uniform-s{s}"], runs[f"late-s{s}"]
        assert u["data_order"] == late["data_order"]
        assert u["data_order"]["first_ids"]  # recorded
    assert len({runs[f"uniform-s{s}"]["data_order"]["sha256"] for s in range(3)}) == 3
    # the trainer seeds init and data order from train.seed, which is the cell's seed
    from taperlm.config import load_run_config

    for s in range(3):
        a = load_run_config(out / "runs" / f"uniform-s{s}" / "config.yaml")
        b = load_run_config(out / "runs" / f"late-s{s}" / "config.yaml")
        assert a.train == b.train and a.train.seed == s
        assert a.data == b.data
        assert a.model.mlp_widths != b.model.mlp_widths


def test_second_invocation_retrains_nothing(finished):
    out, args, _ = finished
    watched = sorted(
        p
        for p in (out / "runs").rglob("*")
        if p.is_file() and p.suffix != ".png" and p.name != ".lock"  # the writer lock is touched
    )
    before = {p: p.stat().st_mtime_ns for p in watched}
    rc, _, stderr = _cli(args)
    assert rc == 0, stderr
    assert stderr.count(": cached;") == 6
    after = {p: p.stat().st_mtime_ns for p in watched}
    assert after == before


def test_plots_and_report_show_one_statistic_per_label(finished, monkeypatch):
    """novelty.png's legend gives the report's r (mean ± std over seeds of each seed's r, not
    the r of the seed-averaged curve) and its bands are spreads over seeds; the loss plots and
    the report say how many val tokens each curve point used, beside the table's count."""
    from taperlm.analysis import plots

    seen: dict[str, dict] = {}
    for name in ("plot_novelty", "plot_loss_curves", "plot_paired_differences"):
        original = getattr(plots, name)

        def record(*args, _name=name, _original=original, **kwargs):
            seen[_name] = {"args": args, **kwargs}
            return _original(*args, **kwargs)

        monkeypatch.setattr(plots, name, record)
    out, args, _ = finished
    rc, _, stderr = _cli(args)
    assert rc == 0, stderr
    rep = _report(out)
    md = (out / "report.md").read_text()

    nov = seen["plot_novelty"]
    assert nov["band"] == "±1 std over seeds" and "over seeds" in nov["r_title"]
    assert set(nov["r_labels"]) == {a["label"] for a in rep["allocations"]}
    for a in rep["allocations"]:
        for key in ("pearson_mlp", "pearson_block"):
            st = a["novelty"][key]
            per_seed = [
                r["novelty"][key] for r in rep["runs"].values() if r["allocation"] == a["label"]
            ]
            assert len(per_seed) == 3 and st["mean"] == pytest.approx(sum(per_seed) / 3)
            assert nov["r_labels"][a["label"]][key] == f"r={st['mean']:+.2f}±{st['std']:.2f}"
        novelty_row = next(
            ln
            for ln in md.split("## Novelty")[1].splitlines()
            if ln.startswith(f"| {a['label']} |")
        )
        for key in ("pearson_mlp", "pearson_block"):
            st = a["novelty"][key]
            assert f"{st['mean']:+.2f} ± {st['std']:.2f}" in novelty_row
    assert "r(rho_mlp, depth), mean ± std over seeds" in md

    eval_tokens = rep["meta"]["settings"]["eval_tokens"]
    val_tokens = rep["meta"]["settings"]["val_tokens"]
    assert eval_tokens != val_tokens  # else the check below could not tell them apart
    for name in ("plot_loss_curves", "plot_paired_differences"):
        title = seen[name]["title"]
        assert f"each point {eval_tokens:,} val tokens" in title
        assert f"final losses: {val_tokens:,}" in title
    assert f"{eval_tokens:,} val tokens per point, not the table's {val_tokens:,}" in md


def test_changed_eval_settings_reevaluate_without_training(finished):
    out, args, _ = finished
    ckpts = sorted((out / "runs").glob("*/checkpoints/step_*/manifest.json"))
    before = {p: p.stat().st_mtime_ns for p in ckpts}
    new = [*args]
    new[new.index("--novelty-tokens") + 1] = "64"
    rc, _, stderr = _cli(new)
    assert rc == 0, stderr
    assert stderr.count(": re-evaluated;") == 6
    assert {p: p.stat().st_mtime_ns for p in ckpts} == before
    assert _report(out)["allocations"][0]["novelty"]["tokens"] < 96
    rc, _, stderr = _cli(args)  # back to the fixture's settings for the other tests
    assert rc == 0 and stderr.count(": re-evaluated;") == 6


# Slow (three evaluations of the whole grid, ~40 s on 2 cores): the default lane proves the same
# property on the cells' keys, without training (test_resume_inputs.py::
# test_compare_cells_know_their_inputs_by_content_not_by_path).
@pytest.mark.slow
def test_same_novelty_text_at_another_path_keeps_cells_cached(finished, tmp_path):
    """Cells know their novelty text by content: the same file moved (a re-install, another
    ../shared) re-evaluates nothing; the fixture's own settings then re-evaluate again."""
    _, args, _ = finished
    first, moved = tmp_path / "a" / "novelty.txt", tmp_path / "b" / "elsewhere.txt"
    for path in (first, moved):
        path.parent.mkdir()
        path.write_text("the quick brown fox jumps over the lazy dog\n" * 400)
    rc, _, stderr = _cli([*args, "--novelty-data", str(first)])
    assert rc == 0 and stderr.count(": re-evaluated;") == 6, stderr
    rc, _, stderr = _cli([*args, "--novelty-data", str(moved)])
    assert rc == 0 and ": re-evaluated;" not in stderr and ": trained;" not in stderr, stderr
    rc, _, stderr = _cli(args)  # back to the fixture's settings for the other tests
    assert rc == 0 and stderr.count(": re-evaluated;") == 6


def test_interrupted_cell_resumes_from_its_checkpoint(finished):
    out, args, _ = finished
    cell = out / "runs" / "late-s1"
    old = json.loads((cell / "result.json").read_text())
    # simulate a kill between steps 2 and 4: no result, no final checkpoint
    (cell / "result.json").unlink()
    shutil.rmtree(cell / "checkpoints" / "step_00000004")
    (cell / "checkpoints" / "latest").unlink(missing_ok=True)
    others = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*/result.json")}
    rc, _, stderr = _cli(args)
    assert rc == 0, stderr
    assert "late-s1: resumed;" in stderr and stderr.count(": cached;") == 5
    new = json.loads((cell / "result.json").read_text())
    assert new["train"]["resumed_from_step"] == 2
    # exact resume on CPU: the same model as the uninterrupted run
    assert new["val"]["loss"] == old["val"]["loss"]
    assert {p: p.stat().st_mtime_ns for p in others} == others


def test_changed_training_config_is_refused(finished):
    _, args, _ = finished
    new = [*args]
    new[new.index("--tokens") + 1] = "320"
    rc, _, stderr = _cli(new)
    assert rc == 2
    assert "different config" in stderr and "train.tokens" in stderr and "fresh --out" in stderr


# ---------------------------------------------------------------------------------- statistics


def test_t_quantiles():
    assert t_quantile(0.975, 2) == pytest.approx(4.302653, abs=1e-6)
    assert t_quantile(0.975, 4) == pytest.approx(2.776445, abs=1e-6)
    assert t_quantile(0.975, 1) == pytest.approx(12.706205, abs=1e-5)
    assert t_quantile(0.95, 10) == pytest.approx(1.812461, abs=1e-6)
    assert t_quantile(0.025, 4) == pytest.approx(-2.776445, abs=1e-6)
    assert t_quantile(0.975, 10_000) == pytest.approx(1.960201, abs=1e-5)


def test_summary_by_hand():
    s = summary([1.0, 2.0, 4.0])
    assert s == Summary(mean=7 / 3, std=math.sqrt(7 / 3), n=3, values=(1.0, 2.0, 4.0))
    assert s.to_json() == {"mean": 7 / 3, "std": math.sqrt(7 / 3), "n": 3, "values": [1, 2, 4]}
    assert Summary.from_json(s.to_json()) == s
    assert summary([5.0]).std is None and summary([]).mean is None


def test_paired_difference_by_hand():
    a = {0: 5.0, 1: 5.2, 2: 4.9, 3: 5.1, 4: 5.3, 9: 1.0}  # seed 9 has no partner
    b = {0: 5.1, 1: 5.25, 2: 5.0, 3: 5.1, 4: 5.35}
    d = paired_difference(a, b)
    diffs = [-0.1, -0.05, -0.1, 0.0, -0.05]
    m = sum(diffs) / 5
    sd = math.sqrt(sum((x - m) ** 2 for x in diffs) / 4)
    assert d.n == 5 and d.seeds == (0, 1, 2, 3, 4)
    assert d.ci == pytest.approx((m - 2.776445 * sd / 5**0.5, m + 2.776445 * sd / 5**0.5))
    assert d.excludes_zero is True
    one = paired_difference({0: 1.0}, {0: 2.0})
    assert one.mean == -1.0 and one.ci is None and one.t is None and one.excludes_zero is None
    # report.json's layout, read back to the same record
    assert list(d.to_json()) == [
        "seeds", "per_seed", "n", "mean", "std", "confidence", "t", "ci", "excludes_zero"
    ]  # fmt: skip
    assert d.to_json()["ci"] == list(d.ci)
    assert type(d).from_json(d.to_json()) == d and type(one).from_json(one.to_json()) == one


def test_rank_agreement():
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([3, 2, 1], [10, 20, 30]) == pytest.approx(-1.0)
    pw = pairwise_agreement({"a": 1, "b": 2, "c": 3}, {"a": 15.0, "b": 16.0, "c": 15.5})
    assert pw.pairs == 3 and pw.agree == 2 and pw.disagreeing_pairs == (("b", "c"),)
    assert pw.to_json()["disagreeing_pairs"] == [["b", "c"]]
    assert type(pw).from_json(pw.to_json()) == pw
    tie = pairwise_agreement({"a": 1, "b": 2}, {"a": 15.0, "b": 15.0})
    assert tie.pairs == 0 and tie.ties_in_reference == 1 and tie.fraction is None


# ---------------------------------------------------------------------------------- grids


def test_taper_lists():
    assert split_taper_list("uniform,groups:1.5,1.0,0.5,cosine") == [
        "uniform",
        "groups:1.5,1.0,0.5",
        "cosine",
    ]
    assert split_taper_list("uniform;custom:1.5,1,0.5; linear:1.25:0.75") == [
        "uniform",
        "custom:1.5,1,0.5",
        "linear:1.25:0.75",
    ]
    assert split_taper_list("early=groups:1.5,1.0,0.5,late=groups:0.5,1.0,1.5") == [
        "early=groups:1.5,1.0,0.5",
        "late=groups:0.5,1.0,1.5",
    ]
    allocs = parse_allocations(["cosine:1.5:0.5", "x=linear"])
    assert [a.name for a in allocs] == ["uniform", "cosine-1.5-0.5", "x"]  # uniform added
    assert allocs[1].paper_ppl == 14.44 and allocs[0].paper_ppl == 16.28


def _base(n_layers: int, mlp_width: int) -> RunConfig:
    model = get_preset("transformer-tiny", resolve=False)
    model.n_layers, model.mlp_width = n_layers, mlp_width
    return RunConfig(model=model.resolve(), train=TrainConfig(tokens=4096, batch_tokens=1024))


def test_paper_controlled_grid():
    allocs = controlled_allocations()
    assert [(a.name, a.paper_ppl) for a in allocs] == [
        ("uniform", 16.28),
        ("wider-early", 15.96),
        ("wider-middle", 16.61),
        ("wider-late", 17.29),
    ]
    grid = build_grid(_base(6, 352), allocs, [0, 1])
    w = {a.name: grid.budget[a.name].widths for a in allocs}
    assert w["uniform"] == [352] * 6
    assert w["wider-early"][0] == w["wider-early"][1] > w["wider-early"][2] == w["wider-early"][3]
    assert w["wider-early"][3] > w["wider-early"][4] == w["wider-early"][5]
    assert w["wider-late"] == w["wider-early"][::-1]
    assert max(w["wider-middle"]) == w["wider-middle"][2] == w["wider-middle"][3]
    assert len({grid.budget[a.name].params for a in allocs}) == 1
    assert len({grid.budget[a.name].flops_per_token for a in allocs}) == 1
    assert len(grid.cells) == 8 and {c.config.train.seed for c in grid.cells} == {0, 1}


def test_paper_sweep_grid():
    allocs = sweep_allocations()
    assert len(allocs) == 16 and allocs[0].is_uniform
    specs = {(a.spec.schedule, a.spec.start, a.spec.end): a.paper_ppl for a in allocs[1:]}
    assert len(specs) == 15
    for (start, end), row in PAPER_SWEEP.items():
        for sched, ppl in row.items():
            assert specs[(sched, start, end)] == ppl
    assert all(a.spec.steepness == 10.0 for a in allocs if a.spec.schedule == "sigmoid")
    grid = build_grid(_base(12, 512), allocs, [0])
    assert len({grid.budget[a.name].params for a in allocs}) == 1
    cos = grid.budget["cosine-1.5-0.5"].widths
    assert cos[0] == 768 and cos[-1] == 256


# ---------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--tapers", "uniform;cosin:1.5:0.5"], "unknown taper schedule 'cosin'"),
        (["--seeds", "0"], "--seeds must be >= 1, got 0"),
        (["--paper", "controlled", "--tapers", "cosine"], "either --paper"),
        (["--tapers", "cosine;cosine"], "twice"),
        (["--eval-tasks", "piqa,nope"], "unknown task 'nope'"),
        (["--eval-tasks", "niah", "--eval-niah-lengths", "64"], "every length is longer"),
        (["--eval-tasks", "niah_single_1", "--eval-niah-lengths", "x"], "not a whole number"),
        (["--tokens", "16"], "train.tokens (16) is less than one batch"),
    ],
)
def test_bad_input(data_dir, tmp_path, extra, message):
    rc, _, stderr = _cli(
        ["compare", *TINY, "--data", str(data_dir), "--out", str(tmp_path), *extra]
    )
    assert rc == 2
    assert message in stderr
    assert "Traceback" not in stderr


def test_compare_options_are_declared_once(tmp_path):
    """Every option of `taperlm compare` is a CompareOptions field (parsed straight into it), and
    a value outside an option's declared domain fails the same way from Python as on the
    command line, before any work."""
    import argparse

    from taperlm.commands.compare import add_arguments
    from taperlm.compare.comparison import check_options
    from taperlm.compare.options import CompareOptions, declared_options, options_from

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    dests = {a.dest for a in parser._actions} - {"help"}
    fields = {f.name for f in dataclasses.fields(CompareOptions)}
    assert dests == fields
    defaults = options_from(parser.parse_args(["--out", str(tmp_path)]))
    assert defaults == CompareOptions(out=tmp_path)
    flags = {f.metadata["flag"] for f in declared_options()}
    assert {"--seeds", "--tokens", "--jobs", "--threads", "--novelty-tokens"} <= flags
    for name, bad, named in [  # the flag, its bound and the value given
        ("seeds", 0, ("--seeds", ">= 1", "got 0")),
        ("threads", 0, ("--threads", ">= 1", "got 0")),
        ("eval_limit", -1, ("--eval-limit", ">= 0", "got -1")),
        ("novelty_tokens", 1, ("--novelty-tokens", ">= 2", "got 1")),
    ]:
        with raises_naming(ConfigError, *named):
            check_options(CompareOptions(out=tmp_path, **{name: bad}))


def test_missing_data_dir(tmp_path):
    rc, _, stderr = _cli(
        ["compare", *TINY, "--data", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]
    )
    assert rc == 2
    assert "does not exist" in stderr and "taperlm prepare" in stderr


def test_default_corpus_missing_packages(tmp_path, monkeypatch):
    from taperlm.data import corpus

    monkeypatch.setenv("TAPERLM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(
        corpus, "DEFAULT_PARTS", (corpus.CorpusPart("nosuch-doc", "no/such/dir", "*.rst", "rst"),)
    )
    rc, _, stderr = _cli(["compare", *TINY, "--out", str(tmp_path / "o")])
    assert rc == 2
    assert "nosuch-doc" in stderr and "apt-get install" in stderr
    assert not any((tmp_path / "cache").glob("*/meta.json"))


def test_zero_shot_tasks(data_dir, tmp_path, shared_data):
    args = [
        "compare",
        *TINY,
        "--tapers",
        "uniform",
        "--seeds",
        "1",
        "--eval-tasks",
        "piqa,lambada_openai",
        "--eval-limit",
        "3",
        "--set",
        "model.context_length=512",  # room for PIQA's long solutions in a 300-id vocabulary
        "--eval-data",
        str(shared_data),
        "--data",
        str(data_dir),
        "--out",
        str(tmp_path / "o"),
    ]
    rc, _, stderr = _cli(args)
    assert rc == 0, stderr
    rep = _report(tmp_path / "o")
    row = rep["runs"]["uniform-s0"]["zero_shot"]
    assert row["tasks"]["piqa"]["n"] == 3 and 0 <= row["paper_row"]["PIQA"] <= 100
    assert row["chance"]["piqa"] is not None and row["chance"]["lambada_openai"] is None
    piqa = rep["allocations"][0]["zero_shot"]["PIQA"]
    assert piqa["at_chance"]  # 3 items cannot show skill
    md = (tmp_path / "o" / "report.md").read_text()
    assert "## Zero-shot" in md and "PIQA" in md and " †" in md


def test_niah_tasks(data_dir, tmp_path):
    """--eval-tasks accepts the NIAH tasks: a column per task and length after the zero-shot
    ones, lengths past the context skipped (here 1024 > 512)."""
    out = tmp_path / "o"
    args = ["compare", *TINY, "--tapers", "uniform", "--seeds", "1", "--eval-tasks"]
    args += ["niah_single_1", "--eval-niah-lengths", "512,1024", "--eval-limit", "2"]
    args += ["--set", "model.context_length=512", "--data", str(data_dir), "--out", str(out)]
    rc, _, stderr = _cli(args)
    assert rc == 0, stderr
    row = _report(out)["runs"]["uniform-s0"]["zero_shot"]
    assert row["tasks"]["niah_single_1"]["counts"] == {"512": 2}
    assert 0 <= row["paper_row"]["S-NIAH-1 512"] <= 100
    assert "S-NIAH-1 512" in (out / "report.md").read_text()


# ---------------------------------------------------------------------- parallel cells (--jobs)


def _with(args: list[str], values: dict[str, str]) -> list[str]:
    """`args` with the values of the given options replaced."""
    new = [*args]
    for option, value in values.items():
        new[new.index(option) + 1] = value
    return new


def _numbers(out: Path) -> dict:
    """Every number of every cell that must not depend on how the cells were run."""
    runs = _report(out)["runs"]
    return {
        name: {
            "val": r["val"],
            "curve": r["curve"],
            "train_loss": r["train"]["train_loss"],
            "novelty": r["novelty"]["layers"],
            "data_order": r["data_order"],
        }
        for name, r in runs.items()
    }


def test_two_workers_give_bit_identical_numbers(finished, tmp_path):
    """jobs=2 (two spawned worker processes) vs the fixture's jobs=1 (in-process): every loss,
    curve point and novelty value equal, and the report's tables equal."""
    out_1, args, _ = finished
    out_2 = tmp_path / "jobs2"
    rc, _, stderr = _cli(_with(args, {"--jobs": "2", "--out": str(out_2)}))
    assert rc == 0, stderr
    assert "6 cell(s) to run, 2 at a time" in stderr
    assert _numbers(out_2) == _numbers(out_1)
    rep_1, rep_2 = _report(out_1), _report(out_2)
    for a, b in zip(rep_1["allocations"], rep_2["allocations"]):
        assert a["val_loss"] == b["val_loss"] and a["diff_vs_uniform"] == b["diff_vs_uniform"]
    # how each cell ran is recorded, and the report says so
    assert rep_2["execution"]["jobs"] == [2] and rep_2["execution"]["consistent"]
    (setting,) = rep_2["execution"]["settings"]
    assert setting["threads"] == 1 and setting["device"] == "cpu"
    assert setting["train_steps"] == 6 * 4 and len(setting["cells"]) == 6
    sessions = [
        json.loads(line)
        for line in (out_2 / "runs" / "late-s1" / "sessions.jsonl").read_text().splitlines()
    ]
    assert [s["phase"] for s in sessions] == ["train", "evaluate"]
    assert sessions[0]["jobs"] == 2 and sessions[0]["threads"] == 1
    # --jobs and --threads change the speed, never the numbers: not in the reproducing command
    assert "--jobs" not in rep_2["meta"]["command"] and "--threads" not in rep_2["meta"]["command"]


def test_machine_load_changes_no_number(finished, tmp_path, monkeypatch):
    """What a loaded (slower) machine changes is when a minute has passed, so which steps get a
    timed checkpoint: a checkpoint after every step gives the very numbers of the fixture's run
    (saving a checkpoint reads the training state and never perturbs it)."""
    out_1, args, _ = finished
    monkeypatch.setattr(compare_cell, "CHECKPOINT_SECONDS", 0.0)  # "a minute" passes every step
    timed = []
    clock = compare_cell.CheckpointClock.__call__

    def counting(self, step, total):
        action = clock(self, step, total)
        timed.append(action == "checkpoint")
        return action

    monkeypatch.setattr(compare_cell.CheckpointClock, "__call__", counting)
    out_2 = tmp_path / "loaded"
    rc, _, stderr = _cli(_with(args, {"--out": str(out_2)}))
    assert rc == 0, stderr
    assert sum(timed) == 6 * 2  # steps 1 and 3 of every cell (2 and 4 are periodic)
    assert _numbers(out_2) == _numbers(out_1)


def test_mixed_settings_are_reported(finished, tmp_path):
    """A cell whose sessions ran with different thread counts is named in the report."""
    from taperlm.compare.report import _execution_lines
    from taperlm.compare.statistics import execution

    out, _, _ = finished
    rep = _report(out)
    results = {name: compare_results.CellResult.from_json(r) for name, r in rep["runs"].items()}
    first = results["uniform-s0"]
    first.sessions = [
        dataclasses.replace(first.sessions[0], threads=2, to_step=2),
        dataclasses.replace(first.sessions[0], from_step=2, to_step=4),
    ]

    grid = SimpleNamespace(cells=[SimpleNamespace(name=n) for n in results])
    ex = execution(grid, results)
    assert not ex.consistent
    lines = "\n".join(_execution_lines(ex))
    assert "different settings" in lines and "2 torch thread(s)" in lines
    assert "uniform-s0" in lines


# ---------------------------------------------------------------------------------------- CPUs


def test_usable_cpus_follow_affinity_and_quota():
    four = lambda: {0, 1, 2, 3}  # noqa: E731
    assert cpus.usable_cpus(affinity=four, cgroup_quota=lambda: None) == 4
    assert cpus.usable_cpus(affinity=four, cgroup_quota=lambda: 2.5) == 2
    assert cpus.usable_cpus(affinity=four, cgroup_quota=lambda: 0.5) == 1


def _sampled(busy: list[float], own: list[float], times: list[float]) -> dict:
    """busy_cpus' probes: /proc/stat, our own CPU time and the clock read in sequence, sleeping
    instantly."""
    b, o, t = iter(busy), iter(own), iter(times)
    return dict(
        busy_seconds=lambda: next(b),
        own_seconds=lambda: next(o),
        clock=lambda: next(t),
        sleep=lambda s: None,
    )


def test_busy_cpus_subtract_our_own_use():
    """Other processes' CPU time over the sample counts; our own does not."""
    probes = _sampled([0.0, 10.0], [0.0, 4.0], [100.0, 104.0])
    assert cpus.busy_cpus(4.0, samples=1, **probes) == pytest.approx(1.5)  # (10 - 4) / 4 s


def test_a_blip_is_not_a_job():
    """A steady job shows in every part of the sample, a blip in one: the least part counts, so
    a short burst of another process (a shell command) does not halve the cells at a time."""
    # 3 parts of 0.4 s: a burst of 0.7 CPU-s in the first, then 0.1 CPU-s in each
    probes = _sampled([0.0, 0.7, 0.8, 0.9], [0.0] * 4, [0.0, 0.4, 0.8, 1.2])
    assert cpus.busy_cpus(1.2, samples=3, **probes) == pytest.approx(0.25)
    probes = _sampled([0.0, 0.4, 0.8, 1.2], [0.0] * 4, [0.0, 0.4, 0.8, 1.2])
    assert cpus.busy_cpus(1.2, samples=3, **probes) == pytest.approx(1.0)  # a job on one core
    assert [cpus.taken_cpus(b) for b in (0.0, 0.5, 0.74, 0.75, 1.0, 1.6, 1.8)] == [
        0,
        0,
        0,
        1,
        1,
        1,
        2,
    ]


@pytest.mark.parametrize(
    "usable, busy, threads, cells, want",
    [
        (2, 0.0, 1, 15, 2),  # an idle 2-core box: two cells at a time
        (2, 0.5, 1, 15, 2),  # half a core used by others: still two
        (2, 1.0, 1, 15, 1),  # another job on one core: never oversubscribe
        (2, 2.3, 1, 15, 1),  # fully busy: still one
        (64, 0.4, 1, 15, 15),  # a workstation: every cell at once
        (64, 0.0, 4, 15, 15),
        (8, 0.0, 4, 15, 2),  # threads x jobs <= idle cores
        (8, 0.0, 1, 3, 3),  # never more workers than cells left
    ],
)
def test_default_jobs_never_oversubscribe(usable, busy, threads, cells, want, capsys):
    from taperlm.compare.execute import choose_jobs
    from taperlm.compare.options import CompareOptions

    grid = SimpleNamespace(cells=[SimpleNamespace(name=f"c{i}") for i in range(cells)])
    settings = compare_cell.EvalSettings()
    jobs = choose_jobs(
        CompareOptions(out=Path("x"), threads=threads),
        grid,
        Path("x"),
        settings,
        # this machine: `usable` CPUs, `busy` of them kept busy by others, no cell done yet
        idle_cpus=lambda: cpus.idle_cpus(usable_cpus=lambda: usable, busy_cpus=lambda s: busy),
        cell_state=lambda cell, run_dir, settings: ("train", None),
    )
    assert jobs == want
    assert jobs * threads <= max(usable - cpus.taken_cpus(busy), threads)
    assert "--jobs N to override" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ stopping


def test_checkpoint_clock():
    """A cell checkpoints when a minute has passed since its last checkpoint (the trainer's
    own periodic ones count) and stops once asked."""
    now = [0.0]
    stop = [False]
    clock = compare_cell.CheckpointClock(
        checkpoint_every=10, stop=lambda: stop[0], clock=lambda: now[0]
    )
    actions = []
    for step in range(1, 31):
        now[0] += 7.0  # 7 s a step
        actions.append(clock(step, 30))
    saved = [i + 1 for i, a in enumerate(actions) if a == "checkpoint"]
    # periodic at 10, 20, 30; timed ones 60+ s after the last checkpoint of either kind
    assert saved == [9, 19, 29]
    stop[0] = True
    assert clock(31, 40) == "stop"


def test_ctrl_c_stops_at_the_next_step_and_names_the_command(data_dir, tmp_path, monkeypatch):
    """In-process (jobs=1): the first Ctrl-C lets the running cell finish its step, checkpoint
    and stop; the message names the exact command; rerunning it resumes that cell."""
    out = tmp_path / "o"
    args = [
        "compare", *TINY, *ALLOCS, "--seeds", "1", "--set", "train.checkpoint_every=100",
        "--data", str(data_dir), "--out", str(out),
    ]  # fmt: skip
    real_step = execute.GridDisplay.step
    sent = []

    def step(self, slot, cell, step, total, loss):
        real_step(self, slot, cell, step, total, loss)
        if cell.name == "late-s0" and step == 1 and not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(execute.GridDisplay, "step", step)
    rc, _, stderr = _cli(args)
    assert rc == 130
    assert "stopping" in stderr and "late-s0 stopped at step 1/4 (checkpointed)" in stderr
    assert f"run the same command again:\n  {shlex.join(['taperlm', *args])}" in stderr
    ckpts = sorted(p.name for p in (out / "runs" / "late-s0" / "checkpoints").glob("step_*"))
    assert ckpts == ["step_00000001"]
    assert (out / "runs" / "uniform-s0" / "result.json").is_file()
    assert not (out / "runs" / "late-s0" / "result.json").exists()
    monkeypatch.setattr(execute.GridDisplay, "step", real_step)
    rc, _, stderr = _cli(args)
    assert rc == 0, stderr
    assert "uniform-s0: cached;" in stderr and "late-s0: resumed;" in stderr
    result = json.loads((out / "runs" / "late-s0" / "result.json").read_text())
    assert result["train"]["resumed_from_step"] == 1
    assert [(s["phase"], s["from_step"], s.get("to_step")) for s in result["sessions"]] == [
        ("train", 0, 1),
        ("train", 1, 4),
        ("evaluate", 4, None),
    ]


@pytest.mark.slow
def test_ctrl_c_with_workers(data_dir, tmp_path):
    """Two worker processes, SIGINT to the whole process group as a terminal sends it: every
    worker checkpoints and exits, no process is left, the message names the command, and the
    same command then finishes the grid with the same numbers as one uninterrupted process.
    (~1 min on 2 cores)"""
    out = tmp_path / "o"
    args = [
        "compare", *TINY, *ALLOCS, "--seeds", "1", "--tokens", "64000", "--set",
        "train.checkpoint_every=100000", "--jobs", "2", "--data", str(data_dir), "--out", str(out),
    ]  # fmt: skip
    cmd = [sys.executable, "-m", "taperlm.cli", *args]
    proc = subprocess.Popen(
        cmd, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    metrics = [out / "runs" / c / "metrics.jsonl" for c in ("uniform-s0", "late-s0")]
    deadline = time.monotonic() + 120
    while not all(m.is_file() for m in metrics) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "stopped at step" in stderr and "run the same command again" in stderr
    assert _group_gone(proc.pid), "a worker survived the interrupt"
    for cell in ("uniform-s0", "late-s0"):
        assert list((out / "runs" / cell / "checkpoints").glob("step_*")), cell
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count(": resumed;") == 2
    ref = tmp_path / "ref"
    rc, _, stderr = _cli(_with(args, {"--jobs": "1", "--out": str(ref)}))
    assert rc == 0, stderr
    assert _numbers(out) == _numbers(ref)


def _group_gone(pgid: int, wait_s: float = 10.0) -> bool:
    """Whether every process of the group has exited (within `wait_s`)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_train_ctrl_c_message_names_the_command():
    import argparse

    from taperlm.cli import _interrupted
    from taperlm.commands.common import resume_command

    argv = ["train", "--preset", "x", "--resume", "never", "--out", "r"]
    assert resume_command("train", argv) == "taperlm train --preset x --resume auto --out r"
    msg = _interrupted(argparse.Namespace(_command="compare"), ["compare", "--out", "c"])
    assert "saved" in msg and "taperlm compare --out c" in msg
    assert (
        _interrupted(argparse.Namespace(_command="plan"), ["plan"]) == "taperlm plan: interrupted"
    )


# ---------------------------------------------------------------------------------- beyond the paper


def test_allocation_syntax_with_heads_and_novelty():
    texts = split_taper_list("uniform,cosine+heads:groups:1.5,1.0,0.5,heads:cosine,novelty:pilot")
    assert texts == ["uniform", "cosine+heads:groups:1.5,1.0,0.5", "heads:cosine", "novelty:pilot"]
    allocs = parse_allocations([*texts, "both=cosine:1.5:0.5+heads:cosine:1.25:0.75"])
    by = {a.name: a for a in allocs}
    assert list(by) == [
        "uniform",
        "cosine-1.5-0.5-heads-groups-1.5-1.0-0.5",
        "heads-cosine-1.5-0.5",
        "novelty-pilot-0.5",
        "both",
    ]
    heads_only = by["heads-cosine-1.5-0.5"]
    assert heads_only.spec.is_uniform and not heads_only.is_uniform
    assert by["both"].head_taper.to_string() == "cosine:1.25:0.75" and by["both"].spec.start == 1.5
    assert by["both"].spec_string == "cosine:1.5:0.5+heads:cosine:1.25:0.75"
    assert by["both"].paper_ppl is None  # the paper tapers no heads
    assert by["novelty-pilot-0.5"].needs_pilot
    for bad, named in [  # the --tapers item and the part of it at fault
        ("cosine+heads:", ("'cosine+heads:'", "uniform, cosine")),
        ("cosine+heads:cosine+heads:linear", ("'cosine+heads:cosine+heads:linear'", "+heads:")),
        ("heads:novelty:pilot", ("'heads:novelty:pilot'", "novelty", "MLP")),
        ("pilot=cosine", ("'pilot'", "pilot runs")),
    ]:
        with raises_naming(ConfigError, *named):
            parse_allocations([bad])


def test_novelty_pilot_and_head_taper_grid(data_dir, tmp_path):
    from taperlm.spec.solver import solve_sizes
    from taperlm.spec.taper import TaperSpec, rho_mlp_of

    out = tmp_path / "out"
    tapers = "uniform;novelty:pilot;both=cosine+heads:cosine"
    args = ["compare", *TINY, "--tapers", tapers, "--seeds", "2", "--data", str(data_dir)]
    rc, _, stderr = _cli([*args, "--out", str(out)])
    assert rc == 0, stderr
    runs = out / "runs"
    assert {"pilot-s0", "pilot-s1"} <= {p.name for p in runs.iterdir()}
    rep = _report(out)
    for seed in (0, 1):
        pilot = json.loads((runs / f"pilot-s{seed}" / "result.json").read_text())
        assert pilot["config"]["train"]["tokens"] == 64 and pilot["config"]["train"]["seed"] == seed
        assert pilot["config"]["model"]["taper"]["schedule"] == "uniform"
        rho = rho_mlp_of(pilot["novelty"])
        cell = json.loads((runs / f"novelty-pilot-0.5-s{seed}" / "result.json").read_text())
        taper = cell["config"]["model"]["taper"]
        assert taper["rho_mlp"] == rho and taper["source"] == f"runs/pilot-s{seed}"
        spec = TaperSpec(schedule="novelty", rho_mlp=rho, strength=0.5)
        assert cell["config"]["model"]["mlp_widths"] == solve_sizes(spec, 3, 64)
        both = json.loads((runs / f"both-s{seed}" / "result.json").read_text())
        assert both["config"]["model"]["layer_heads"] == [3, 2, 1]
        assert both["config"]["model"]["mlp_widths"] == [96, 64, 32]
        assert rep["pilot"]["per_seed"][str(seed)]["rho_mlp"] == rho
    entries = {a["name"]: a for a in rep["allocations"]}
    assert len({a["params"] for a in entries.values()}) == 1
    assert len({a["flops_per_token"] for a in entries.values()}) == 1
    assert entries["both"]["heads"] == [3, 2, 1] and entries["uniform"]["heads"] == [2, 2, 2]
    assert set(entries["novelty-pilot-0.5"]["widths_by_seed"]) == {"0", "1"}
    assert all(rep["checks"].values()), rep["checks"]
    assert rep["pilot"]["tokens"] == 64 and rep["pilot"]["fraction_of_run"] == 0.25
    md = (out / "report.md").read_text()
    assert_naming(md, "64", "25%")  # the pilot's cost (report.json's "pilot", checked above)
    assert "| both | `cosine:1.5:0.5+heads:cosine:1.5:0.5` |" in md
    assert "--pilot-tokens 64" in md
    # a second invocation reuses the pilots and every cell
    rc, _, stderr = _cli([*args, "--out", str(out)])
    assert rc == 0, stderr
    assert "trained" not in stderr and stderr.count(": cached;") == 2 + 3 * 2


# ---------------------------------------------------------------------------------- --paper families

# TINY without the preset: --paper families builds every family from its own preset.
FAMILY_TINY = TINY[2:]


def test_paper_families_end_to_end(data_dir, tmp_path):
    out = tmp_path / "fam"
    args = ["compare", "--paper", "families", "--families", "transformer,titans-mag"]
    args += [*FAMILY_TINY, "--tokens", "128", "--seeds", "2", "--data", str(data_dir)]
    args += ["--set", "model.titans.window=16", "--out", str(out)]  # a Titans-only option
    rc, _, stderr = _cli(args)
    assert rc == 0, stderr
    for name in ("report.md", "report.json", "families.png"):
        assert (out / name).stat().st_size > 0, name
    rep = _report(out)
    fams = rep["families"]
    assert [f["preset"] for f in fams] == ["transformer-micro", "titans-mag-micro"]
    for f in fams:
        sub = _report(out / f["preset"])  # each family is a complete comparison of its own
        assert [a["name"] for a in sub["allocations"]] == ["uniform", "cosine-1.5-0.5"]
        assert sub["base_config"]["model"]["family"] == f["family"]
        # the family's exact budget: equal params and FLOPs/token, different widths
        u, t = sub["allocations"]
        assert u["params"] == t["params"] == f["params"]
        assert u["flops_per_token"] == t["flops_per_token"] == f["flops_per_token"]
        assert t["widths"][0] > u["widths"][0] > t["widths"][-1]
        assert f["checks"]["budget_equal"] and all(sub["checks"].values())
        d = f["diff_val_loss"]
        assert d["n"] == 2 and math.isclose(
            f["relative_ppl_change"]["mean"], 100 * math.expm1(d["mean"])
        )
        assert d["per_seed"] == pytest.approx(
            [t["per_seed"][s]["val_loss"] - u["per_seed"][s]["val_loss"] for s in ("0", "1")]
        )
        assert f["paper_760m"]["uniform"]["Wiki ppl"] in (21.86, 21.58)
        assert sub["stopping"]["stop_on"] == "each" and sub["stopping"]["cap"] == 2
    titans = _report(out / "titans-mag-micro")["base_config"]["model"]
    assert titans["titans"]["window"] == 16 and titans["titans"]["variant"] == "mag"
    assert "titans" not in _report(out / "transformer-micro")["base_config"]["model"]
    assert fams[0]["params"] != fams[1]["params"]  # each family keeps its own budget
    md = (out / "report.md").read_text()
    assert "taperlm compare --paper families --preset-size micro" in md
    assert_delta_units(md)
    assert "| **Transformer++** |" in md and "| **Titans (titans-mag)** |" in md
    assert "21.42 (-2.01%)" in md and "20.77 (-3.75%)" in md  # the paper's 760M changes
    assert "![paired perplexity change per family](families.png)" in md
    # a second invocation trains nothing and rebuilds the same table
    rc, _, stderr = _cli(args)
    assert rc == 0 and "trained" not in stderr, stderr
    assert _report(out)["families"][1]["diff_val_loss"] == fams[1]["diff_val_loss"]
    # report.json is the table's records' layout: it reads back as them and they write it
    from taperlm.compare.families import FamilyMeta, FamilyRow, FamilyTable, RelativeChange

    meta = FamilyMeta.from_json(rep["meta"])
    assert meta.to_json() == rep["meta"] and FamilyMeta.from_json(meta.to_json()) == meta

    table = FamilyTable.from_json(rep)
    assert table.to_json() == {k: v for k, v in rep.items() if k != "meta"}
    assert FamilyTable.from_json(table.to_json()) == table
    for row in table.families:
        assert FamilyRow.from_json(row.to_json()) == row
        rel = row.relative_ppl_change
        assert rel is not None and RelativeChange.from_json(rel.to_json()) == rel


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--paper", "families", "--preset", "transformer-tiny"], "--preset-size"),
        (["--paper", "families", "--families", "transformer,nope"], ("--families", "'nope'")),
        (["--paper", "families", "--preset-size", "huge"], ("--preset-size", "'huge'")),
        (["--preset-size", "small"], ("--preset-size", "--paper families")),
        (
            ["--paper", "families", "--families", "transformer", "--set", "model.hope.levels=2"],
            ("model.hope.levels", "hope"),
        ),
        (["--paper", "families", "--tapers", "uniform;cosine"], ("--paper", "--tapers")),
    ],
)
def test_paper_families_bad_input(data_dir, tmp_path, extra, message):
    args = ["compare", *FAMILY_TINY, "--data", str(data_dir), "--out", str(tmp_path), *extra]
    rc, _, stderr = _cli(args)
    assert rc == 2, stderr
    assert_naming(stderr, *((message,) if isinstance(message, str) else message))
    assert "Traceback" not in stderr
    assert not any(tmp_path.iterdir())  # nothing trained or written


def test_paper_sizes_train_with_the_paper_recipe(tmp_path):
    from taperlm.compare.options import CompareOptions
    from taperlm.compare.recipe import base_config

    cfg = base_config(CompareOptions(out=tmp_path, preset="gated-760m"), None, None)
    t = cfg.train
    assert (t.seq_len, t.batch_tokens, t.lr, t.weight_decay) == (4096, 524288, 4e-4, 0.1)
    # 50B tokens, rounded up to whole 524,288-token steps (95,368 of them)
    assert t.tokens == 95_368 * 524_288 and cfg.model.d_model == 1536
    opts = CompareOptions(out=tmp_path, preset="transformer-440m", overrides=["train.lr=1e-3"])
    assert base_config(opts, None, None).train.lr == 1e-3  # --set still wins
    tiny = base_config(CompareOptions(out=tmp_path, preset="hope-tiny"), None, None)
    assert (tiny.train.seq_len, tiny.train.lr) == (128, 2e-3)  # compare's CPU defaults
    # ... with a family's own stable learning rate (Titans), unless --set gives one
    titans = base_config(CompareOptions(out=tmp_path, preset="titans-mac-tiny"), None, None)
    assert (titans.train.seq_len, titans.train.lr) == (128, 1e-3)
    opts = CompareOptions(out=tmp_path, preset="titans-mag-tiny", overrides=["train.lr=3e-3"])
    assert base_config(opts, None, None).train.lr == 3e-3
    assert (
        base_config(CompareOptions(out=tmp_path, preset="titans-mag-440m"), None, None).train.lr
        == 4e-4
    )


def test_default_seeds_depend_on_the_mode(tmp_path):
    """The main job's seeds are sized to its 15 minutes; a named model's comparison keeps its
    15; a paper grid (16 allocations) or the family table would take hours on a CPU at those:
    --paper modes default to fewer; an explicit --seeds always wins."""
    from taperlm.compare.options import DEFAULT_SEEDS, MODEL_SEEDS, PAPER_MODE_SEEDS, CompareOptions

    assert MODEL_SEEDS > PAPER_MODE_SEEDS and DEFAULT_SEEDS > PAPER_MODE_SEEDS
    assert CompareOptions(out=tmp_path).seeds == DEFAULT_SEEDS
    assert CompareOptions(out=tmp_path, preset="transformer-micro").seeds == MODEL_SEEDS
    for mode in ("controlled", "sweep", "families"):
        assert CompareOptions(out=tmp_path, paper=mode).seeds == PAPER_MODE_SEEDS
        assert CompareOptions(out=tmp_path, paper=mode, seeds=2).seeds == 2
    assert CompareOptions(out=tmp_path, seeds=3).seeds == 3


def test_cpu_recipe_model_settings_apply_to_small_presets_only(tmp_path):
    """compare's init_std is part of its CPU recipe: every small preset of every family gets
    it; a config file's model section, --set and the paper's sizes keep their own."""
    from taperlm.compare.options import CompareOptions
    from taperlm.compare.recipe import COMPARE_MODEL, base_config
    from taperlm.config.presets import preset_families

    init = COMPARE_MODEL.init_std
    assert init != 0.02  # else this test could not tell the two apart
    for prefix in preset_families():
        for size in ("micro", "tiny", "small"):
            cfg = base_config(CompareOptions(out=tmp_path, preset=f"{prefix}-{size}"), None, None)
            assert cfg.model.init_std == init, (prefix, size)
            assert (cfg.train.batch_tokens, cfg.train.micro_batch_size) == (1024, 8)
        cfg = base_config(CompareOptions(out=tmp_path, preset=f"{prefix}-440m"), None, None)
        assert cfg.model.init_std == 0.02, prefix
    opts = CompareOptions(out=tmp_path, overrides=["model.init_std=0.03"])
    assert base_config(opts, None, None).model.init_std == 0.03
    config = tmp_path / "model.yaml"
    config.write_text(
        "model:\n  family: transformer\n  d_model: 64\n  n_layers: 2\n"
        "  n_heads: 2\n  mlp_width: 128\n  vocab_size: 256\n"
    )
    assert (
        base_config(CompareOptions(out=tmp_path, config=config), None, None).model.init_std == 0.02
    )


def test_no_skill_accuracy_and_chance_marks():
    from taperlm.compare.families import verdict
    from taperlm.evaluation.registry import TaskData
    from taperlm.evaluation.suite import at_chance, chance_columns, no_skill_accuracy

    docs = [{"goal": "g", "sol1": "a", "sol2": "b", "label": y} for y in (0, 0, 0, 1)]
    assert no_skill_accuracy(TaskData("piqa", "multiple_choice", docs, "local")) == 0.75
    docs = [{"query": "q", "choices": ["a", "b", "c", "d"], "label": y} for y in (0, 1, 2, 3)]
    assert no_skill_accuracy(TaskData("hellaswag", "multiple_choice", docs, "local")) == 0.25
    assert no_skill_accuracy(TaskData("lambada_openai", "loglikelihood", [], "local")) is None
    assert chance_columns({"piqa": 0.5, "lambada_openai": None, "hellaswag": 0.25}) == {
        "PIQA": 50.0,
        "Hella": 25.0,
    }
    # 200 items at 50%: the upper 95% bound is 56.93%
    assert at_chance(56.9, 50.0, 200) and not at_chance(57.0, 50.0, 200)
    assert at_chance(40.0, 50.0, 200)  # below chance is no skill either
    assert math.isclose(relative_ppl_change(math.log(0.9)), -10.0)
    diff = paired_difference({0: 1.0, 1: 2.0}, {0: 0.0, 1: 0.0})
    assert verdict(dataclasses.replace(diff, ci=(-0.03, -0.01))) == "better"
    assert verdict(dataclasses.replace(diff, ci=(0.01, 0.03))) == "worse"
    assert verdict(dataclasses.replace(diff, ci=(-0.01, 0.01))) == "undecided"
    assert verdict(paired_difference({0: 1.0}, {0: 0.0})) == "undecided (one seed)"


def test_paper_mode_plots_ours_beside_the_paper(data_dir, tmp_path):
    out = tmp_path / "ctl"
    args = ["compare", *TINY, "--paper", "controlled", "--seeds", "1", "--data", str(data_dir)]
    rc, _, stderr = _cli([*args, "--tokens", "128", "--out", str(out)])  # 3 layers: 1 per group
    assert rc == 0, stderr
    md = (out / "report.md").read_text()
    assert (out / "paper.png").stat().st_size > 0 and "![against the paper](paper.png)" in md
    assert "sweep.png" not in md  # the sweep's own plot only in the sweep
    # the sweep plot: one line per schedule against the start ratio, the paper's dotted
    from taperlm.compare.report import _sweep_plot

    rows = [("cosine:1.5:0.5", -1.0, -2.0, 0.0), ("cosine:1.25:0.75", -0.5, None, None)]
    rows += [("sigmoid:1.5:0.5:10.0", 0.5, 0.0, 1.0)]
    ref = {"cosine:1.5:0.5": -11.3, "cosine:1.25:0.75": -6.8, "sigmoid:1.5:0.5:10.0": -1.0}
    from taperlm.spec.taper import TaperSpec

    specs = {label: TaperSpec.parse(label) for label, *_ in rows}
    _sweep_plot(specs, rows, ref, tmp_path / "sweep.png")
    assert (tmp_path / "sweep.png").stat().st_size > 0


def test_niah_prose_is_part_of_the_evaluation_settings(tmp_path):
    """S-NIAH-2/3 cells record their prose in the settings that decide re-evaluation (cells of
    an older prose are evaluated again); grids without them keep their old settings."""
    from taperlm.compare.cell import EvalSettings
    from taperlm.compare.comparison import eval_settings
    from taperlm.compare.options import CompareOptions

    niah = eval_settings(CompareOptions(out=tmp_path, eval_tasks="niah")).to_dict()
    assert niah["niah_haystack"] == "python-docs" and niah["eval_data"] is None
    assert EvalSettings(**niah).niah_haystack == "python-docs"
    plain = eval_settings(CompareOptions(out=tmp_path, eval_tasks="niah_single_1")).to_dict()
    assert "niah_haystack" not in plain
