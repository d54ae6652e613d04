"""benchmarks/pretrained_prune.py's pure parts, without the model package: the width step of
each size (256 where the mean width allows it, else the largest power of two that divides it),
the shapes at SmolLM2-135M's size (30 layers of width 1536), the ones pruning cannot reach
refused with the reason, and the paired summary of finished cells."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from taperlm.config import ModelConfig
from taperlm.spec.taper import TaperSpec

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        import pretrained_prune

        yield pretrained_prune
    finally:
        sys.path.remove(str(BENCH))


def smollm2_shape() -> ModelConfig:
    """SmolLM2-135M's shape as `taperlm import` reads it (a small vocabulary: it changes nothing
    the MLP widths depend on)."""
    return ModelConfig(
        family="transformer", vocab_size=64, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3,
        mlp_width=1536, taper=TaperSpec.parse("uniform", multiple_of=1), context_length=2048,
    ).resolve()  # fmt: skip


@pytest.mark.parametrize(
    "mean, step", [(768, 256), (1536, 256), (1152, 128), (1000, 8), (7, 1), (384, 128)]
)
def test_the_width_step_is_256_where_the_size_allows(bench, mean, step):
    assert bench.mlp_multiple(mean) == step
    assert mean % step == 0 and (step == 256 or mean % (2 * step))


def test_shapes_at_smollm2_size(bench):
    src = smollm2_shape()
    rho = [0.1 + 0.02 * i for i in range(30)]  # novelty rising with depth
    plan = bench.plan(src, [0.5, 0.75], rho, "source")
    assert set(plan) == {f"{f}/{s}" for f in (0.5, 0.75) for s in bench.SHAPES}
    for f, mean, step in ((0.5, 768, 256), (0.75, 1152, 128)):
        for shape in bench.SHAPES:
            entry = plan[f"{f}/{shape}"]
            if "refused" in entry:
                continue
            widths = entry["config"].mlp_widths
            assert entry["multiple_of"] == step and entry["mean_width"] == mean
            assert sum(widths) == 30 * mean, (f, shape)  # the exact budget
            assert all(w % step == 0 and 0 < w <= 1536 for w in widths), (f, shape, widths)
        assert set(plan[f"{f}/uniform"]["config"].mlp_widths) == {mean}
        cos = plan[f"{f}/widening"]["config"].mlp_widths
        assert cos == sorted(cos) and cos[0] < cos[-1]  # widening: narrow first
    narrowing = plan["0.5/cosine"]["config"].mlp_widths
    assert narrowing == sorted(narrowing, reverse=True) and narrowing[0] > narrowing[-1]
    # 1.5 x 1152 in the first layer is more than the source's 1536 units: refused, with why
    assert "refused" in plan["0.75/cosine"] and "1536" in plan["0.75/cosine"]["refused"]
    assert "config" in plan["0.5/novelty"]
    assert "not measured" in bench.plan(src, [0.5], None, "source")["0.5/novelty"]["refused"]


def test_finished_cells_pair_each_shape_with_the_uniform_prune(bench, tmp_path):
    cells = tmp_path / "cells"
    cells.mkdir()
    for shape in ("uniform", "widening"):
        (cells / f"prune-0.5-{shape}.json").write_text(json.dumps({"after_prune": {}}))
    losses = {"uniform": [3.0, 3.2, 3.1], "widening": [2.9, 3.0, 3.05]}
    for shape, vals in losses.items():
        for s, v in enumerate(vals):
            cell = {"healed": {"val_loss": v}}
            (cells / f"heal-0.5-{shape}-s{s}.json").write_text(json.dumps(cell))
    out = bench.finished(tmp_path)
    diff = out["0.5/widening"]["healed_vs_uniform"]
    assert diff["mean"] == pytest.approx(sum(a - b for a, b in zip(*losses.values())) / 3 * -1)
    assert out["0.5/uniform"]["healed_vs_uniform"]["mean"] == 0


def test_the_docs_table_is_the_results_own(bench):
    """docs/compress.md's table of the measurement before pruning is what the committed results
    JSON renders to (the script prints it)."""
    repo = BENCH.parent
    data = json.loads((repo / "benchmarks/results/pretrained_prune.json").read_text())
    doc = (repo / "docs/compress.md").read_text(encoding="utf-8")
    block = doc.split("<!-- pretrained_prune:baseline -->\n")[1].split("\n<!-- /pretrained_prune")[
        0
    ]
    assert block == bench.baseline_markdown(data)
    assert data["import"]["quantization"] == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    assert data["baseline"]["settings"]["limit"] == 200 and data["baseline"]["val_tokens"] == 16_384


def test_a_cell_is_bound_by_the_settings_its_numbers_depend_on(bench, tmp_path):
    """The measurement's cells (baseline, after pruning) depend on the measurement settings only:
    one written while heal's settings were recorded with them is reused with other healing
    settings; a change in what it measured (or a heal cell's own settings) refuses, naming the
    file, and nothing is recomputed."""
    args = bench.argparse.Namespace(
        val_tokens=16_384, limit=200, seq_len=1024, calibration_tokens=16_384,
        heal_tokens=65_536, heal_batch_tokens=4096, heal_lr=1e-4, distill_mix=0.5,
        distill_temperature=1.0,
    )  # fmt: skip
    measure = bench.cell_settings(args)
    assert set(measure) == set(bench.MEASURE_SETTINGS) < set(bench.HEAL_SETTINGS)
    (tmp_path / "cells").mkdir()
    older = measure | {"heal_tokens": 32_768, "heal_lr": 1e-4}  # recorded before the split
    path = tmp_path / "cells" / "prune-0.5-uniform.json"
    path.write_text(json.dumps({"after_prune": {"val_loss": 3.0}, "settings": older}))

    def never():
        raise AssertionError("a finished cell was recomputed")

    assert bench.cached(tmp_path, "prune-0.5-uniform", never, measure)["after_prune"]
    for key in bench.MEASURE_SETTINGS:
        other = measure | {key: measure[key] * 2}
        with pytest.raises(SystemExit, match=r"prune-0\.5-uniform\.json"):
            bench.cached(tmp_path, "prune-0.5-uniform", never, other)
    heal = bench.cell_settings(args, bench.HEAL_SETTINGS)
    path = tmp_path / "cells" / "heal-0.5-uniform-s0.json"
    path.write_text(json.dumps({"healed": {}, "settings": heal}))
    for key in set(bench.HEAL_SETTINGS) - set(bench.MEASURE_SETTINGS):
        with pytest.raises(SystemExit, match=r"heal-0\.5-uniform-s0\.json"):
            bench.cached(tmp_path, "heal-0.5-uniform-s0", never, heal | {key: heal[key] * 2})


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--heal-tokens", "8192"], "2 step(s)"),
        (["--heal-batch-tokens", "1000"], "not a whole number"),
        (["--heal-batch-tokens", "512"], "not a whole number"),
    ],
)
def test_a_healing_of_too_few_steps_is_refused_before_any_work(bench, tmp_path, capsys, argv, says):
    work = tmp_path / "work"
    with pytest.raises(SystemExit):
        bench.main(["--work", str(work), *argv])
    assert says in capsys.readouterr().err and not work.exists()


def _tasks(acc: float) -> dict:
    """Two tasks' results as `measure` records them (PIQA's acc, BoolQ's acc)."""
    return {
        name: {"metrics": {"acc": acc}, "stderr": {"acc": 0.01}, "n": 200}
        for name in ("piqa", "boolq")
    }


def test_the_pruned_table_has_a_row_per_cell_in_shape_order(bench):
    """The table after pruning: the source first, then per fraction the shapes in SHAPES'
    order, each with its widths, loss, change from before, task columns and their mean; a shape
    pruning cannot reach says why; shapes not measured yet have no row."""
    data = {
        "config": {"mlp_width": 1536},
        "baseline": {"val_loss": 2.5, "tasks": _tasks(0.6)},
        "pruned": {
            "0.5/cosine": {
                "mlp_widths": [1280, 768, 512],
                "multiple_of": 256,
                "after_prune": {"val_loss": 3.25, "tasks": _tasks(0.5)},
            },
            "0.5/uniform": {
                "mlp_widths": [768, 768, 768],
                "multiple_of": 256,
                "after_prune": {"val_loss": 3.5, "tasks": _tasks(0.4)},
            },
            "0.5/novelty": {"refused": "the widths round below one step"},
        },
    }
    lines = bench.pruned_markdown(data).splitlines()
    assert lines[0].startswith("| fraction | shape | MLP widths | val loss | Δ vs before | PIQA")
    assert lines[0].endswith("| mean |")
    assert (
        lines[2]
        == "| 1 | before pruning | 1,536 (every layer) | 2.5000 |  | 60.0 ± 1.0 | 60.0 ± 1.0 | 60.0 |"
    )
    assert (
        lines[3]
        == "| 0.5 | uniform | 768 -> 768 (step 256) | 3.5000 | +1.0000 | 40.0 ± 1.0 | 40.0 ± 1.0 | 40.0 |"
    )
    assert lines[4].startswith("| 0.5 | cosine | 1,280 -> 512 (step 256) | 3.2500 | +0.7500 |")
    assert lines[5] == "| 0.5 | novelty | not reached: the widths round below one step |"
    assert len(lines) == 6


def test_the_docs_pruned_table_is_the_results_own(bench):
    """Once the committed results hold pruned models, docs/compress.md's table after pruning is
    what they render to."""
    repo = BENCH.parent
    data = json.loads((repo / "benchmarks/results/pretrained_prune.json").read_text())
    if not data.get("pruned"):
        pytest.skip("no pruned model measured in the committed results yet")
    doc = (repo / "docs/compress.md").read_text(encoding="utf-8")
    block = doc.split("<!-- pretrained_prune:pruned -->\n")[1].split("\n<!-- /pretrained_prune")[0]
    assert block == bench.pruned_markdown(data)


def _cell(after: float, healed: dict[int, float]) -> dict:
    return {
        "after_prune": {"val_loss": after},
        "healed": {s: {"val_loss": v} for s, v in healed.items()},
    }


def test_the_model_exported_is_the_best_healed_at_the_strongest_pruning(bench):
    """The smallest fraction only; the mean over the seeds every shape there has (a seed only
    one shape has is left out: here it would make uniform win); the same after JSON (seed keys
    become text); without healing, the lowest loss right after pruning."""
    pruned = {
        "0.5/uniform": _cell(3.9, {0: 3.50, 1: 3.50, 2: 2.00}),
        "0.5/cosine": _cell(3.7, {0: 3.40, 1: 3.45}),
        "0.5/widening": {"refused": "layer 0 needs more units"},
        "0.75/uniform": _cell(3.1, {0: 3.00, 1: 3.00}),  # lower, but not the strongest pruning
    }
    key, why, healed = bench.best_pruned({"pruned": pruned})
    assert key == "0.5/cosine" and "seeds [0, 1]" in why and "3.4250" in why and healed
    assert bench.best_pruned(json.loads(json.dumps({"pruned": pruned})))[0] == "0.5/cosine"
    for cell in pruned.values():
        cell["healed"] = {}
    key, why, healed = bench.best_pruned({"pruned": pruned})
    assert key == "0.5/cosine" and "right after pruning" in why and not healed
    pruned["0.5/uniform"]["after_prune"]["val_loss"] = 3.6
    assert bench.best_pruned({"pruned": pruned})[0] == "0.5/uniform"


def test_the_healed_table_pairs_each_shape_with_uniform_over_shared_seeds(bench, tmp_path):
    """The table after healing, from cells as `finished` reads them: a row per healed shape in
    SHAPES' order (none for one not healed yet), the mean healed loss and zero-shot accuracy,
    and their paired differences from the uniform prune over the seeds both have, with a 95% t
    interval (n=3: t = 4.303); the figure draws from the same data."""
    import math

    cells = tmp_path / "cells"
    cells.mkdir()
    losses = {"uniform": [3.50, 3.40, 3.45], "cosine": [3.30, 3.25, 3.20]}
    accs = {"uniform": [0.40, 0.40, 0.40], "cosine": [0.41, 0.43, 0.42]}
    for shape, widths in (("uniform", [768] * 3), ("cosine", [1280, 768, 256])):
        prune = {"mlp_widths": widths, "multiple_of": 256,
                 "after_prune": {"val_loss": 4.0, "tasks": _tasks(0.3)}}  # fmt: skip
        (cells / f"prune-0.5-{shape}.json").write_text(json.dumps(prune))
        for s, (loss, acc) in enumerate(zip(losses[shape], accs[shape])):
            healed = {"healed": {"val_loss": loss, "tasks": _tasks(acc)}}
            (cells / f"heal-0.5-{shape}-s{s}.json").write_text(json.dumps(healed))
    (cells / "prune-0.5-widening.json").write_text(
        json.dumps({"mlp_widths": [256, 768, 1280], "multiple_of": 256,
                    "after_prune": {"val_loss": 5.0, "tasks": _tasks(0.2)}})
    )  # fmt: skip
    data = {
        "config": {"mlp_width": 1536},
        "baseline": {"val_loss": 2.5, "tasks": _tasks(0.6)},
        "pruned": bench.finished(tmp_path),
    }
    data = json.loads(json.dumps(data))  # as committed: seed keys are text
    lines = bench.healed_markdown(data).splitlines()
    assert lines[0].startswith("| fraction | shape | seeds | val loss after pruning |")
    assert len(lines) == 4  # header, rule, uniform, cosine (widening is not healed)
    assert lines[2] == "| 0.5 | uniform | 0, 1, 2 | 4.0000 | 3.4500 |  | 40.0 |  |"
    d = [-0.20, -0.15, -0.25]
    sd = math.sqrt(sum((x + 0.2) ** 2 for x in d) / 2)
    half = 4.302652729911275 * sd / math.sqrt(3)
    lo, hi = -0.2 - half, -0.2 + half
    assert lines[3] == (
        f"| 0.5 | cosine | 0, 1, 2 | 4.0000 | 3.2500 | -0.2000 [{lo:+.4f}, {hi:+.4f}] | 42.0 | "
        "+2.0 [-0.5, +4.5] |"  # points: 1, 3, 2 (sd 1)
    )
    png = bench.figure(data, tmp_path / "fig.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_docs_healed_table_and_export_are_the_results_own(bench):
    """Once the committed results hold healed models, docs/compress.md's table after healing is
    what they render to, the figure it shows exists, and the export it states is the results'."""
    repo = BENCH.parent
    data = json.loads((repo / "benchmarks/results/pretrained_prune.json").read_text())
    if not any(cell.get("healed") for cell in data.get("pruned", {}).values()):
        pytest.skip("no healed model in the committed results yet")
    doc = (repo / "docs/compress.md").read_text(encoding="utf-8")
    block = doc.split("<!-- pretrained_prune:healed -->\n")[1].split("\n<!-- /pretrained_prune")[0]
    assert block == bench.healed_markdown(data)
    assert (
        "](img/pretrained_prune.png)" in doc and (repo / "docs/img/pretrained_prune.png").is_file()
    )
    export = data["export"]
    assert export["shape"] == bench.best_pruned(data)[0]
    assert (
        export["block_configs"]["same_weights"]
        and export["block_configs"]["max_abs_logit_diff"] == 0
    )
    assert f"`{export['shape']}`" in doc
