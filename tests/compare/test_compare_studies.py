"""A new `taperlm compare` mode is one study function: a toy study registered here (two token
budgets of the same pair of allocations, and a report of the difference at each) runs through
the same skeleton as every built-in mode, with nothing else added anywhere."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from taperlm.cli import build_parser
from taperlm.compare import study
from taperlm.compare.options import PAPER_MODES, CompareOptions, options_from
from taperlm.compare.study import COMPARISON, Part, StudyPlan, StudyProgress
from taperlm.files.io import atomic_write_json, atomic_write_text
from test_compare import ALLOCS, TINY, data_dir  # noqa: F401 (fixture)


def toy_study(opts: CompareOptions) -> StudyPlan:
    """The toy study: the tapers of --tapers at 128 and 192 tokens, each its own comparison,
    and OUT/report.json with the paired difference at each budget."""
    parts = []
    for tokens in (128, 192):
        sub = dataclasses.replace(opts, paper=None, tokens=tokens, out=opts.out / f"t{tokens}")
        parts.append(Part(f"t{tokens}", sub, "budget", f"{tokens} tokens"))

    def report(done: StudyProgress) -> tuple[Path, Path]:
        diffs = {
            key: rep.summary.allocations[1].diff_vs_uniform.val_loss.mean
            for key, rep in done.reports.items()
        }
        doc = {"done": len(done.reports), "total": done.total, "diffs": diffs}
        atomic_write_json(opts.out / "report.json", doc)
        atomic_write_text(opts.out / "report.md", f"# toy\n\n{diffs}\n")
        return opts.out / "report.md", opts.out / "report.json"

    return StudyPlan(parts, report, mode="toy", folder="toy folder")


def test_every_mode_is_a_registered_study():
    """The registry holds the plain comparison and exactly --paper's choices, in their order."""
    assert list(study.studies()) == [COMPARISON, *PAPER_MODES]


def test_a_toy_study_is_one_registered_function(data_dir, tmp_path, monkeypatch, capsys):  # noqa: F811
    monkeypatch.setattr(study, "REGISTERED", {})  # registered for this test
    study.study("toy")(toy_study)
    out = tmp_path / "toy"
    args = build_parser().parse_args(
        ["compare", *TINY, *ALLOCS, "--seeds", "2", "--data", str(data_dir), "--out", str(out)]
    )
    opts = dataclasses.replace(options_from(args), paper="toy")
    _, js = study.run_study(opts)
    doc = json.loads(js.read_text())
    assert doc["done"] == doc["total"] == 2 and set(doc["diffs"]) == {"t128", "t192"}
    for key in ("t128", "t192"):  # each part a complete comparison of its own
        sub = json.loads((out / key / "report.json").read_text())
        assert sub["meta"]["settings"]["tokens"] == int(key[1:])
        assert sub["allocations"][1]["diff_vs_uniform"]["val_loss"]["mean"] == doc["diffs"][key]
    err = capsys.readouterr().err
    assert "taperlm compare --paper toy: budget 1/2: 128 tokens into" in err
    # the skeleton's resume: a rerun trains nothing and rewrites the same report
    study.run_study(opts)
    assert json.loads(js.read_text()) == doc
    assert "trained" not in capsys.readouterr().err


def test_a_single_comparison_s_closing_reading_sees_its_finished_report(
    data_dir,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    """`StudyPlan.conclude` (the pre-registered modes' reading) is called once per run with the
    finished comparison's report, on a resume too, after report.json is written."""
    seen = []

    def with_reading(opts: CompareOptions) -> StudyPlan:
        def conclude(report) -> None:
            seen.append(json.loads(report.json_path.read_text())["stopping"]["seeds_used"])

        sub = dataclasses.replace(opts, paper=None)
        return StudyPlan([Part("", sub)], mode="read", conclude=conclude)

    monkeypatch.setattr(study, "REGISTERED", {})
    study.study("read")(with_reading)
    args = build_parser().parse_args(
        ["compare", *TINY, *ALLOCS, "--seeds", "2", "--data", str(data_dir), "--out",
         str(tmp_path / "c")]
    )  # fmt: skip
    opts = dataclasses.replace(options_from(args), paper="read")
    for _ in range(2):
        study.run_study(opts)
    assert seen == [2, 2]
