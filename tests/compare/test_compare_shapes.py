"""The symmetric shapes run like every schedule: a tiny `taperlm compare` of uniform, bell and
hourglass trains every cell at the one budget with symmetric widths, and a bell cell exports to
Hugging Face (the same logits) and GGUF (its per-layer widths)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from taperlm.checkpoint.loading import load_run_model
from taperlm.spec.solver import solve_sizes
from taperlm.spec.taper import TaperSpec
from test_compare import TINY, _cli, data_dir  # noqa: F401 (fixture)

SHAPES = "uniform;bell;narrow=hourglass:0.8"


@pytest.fixture(scope="module")
def compared(data_dir, tmp_path_factory) -> Path:  # noqa: F811
    out = tmp_path_factory.mktemp("shapes") / "out"
    args = ["compare", *TINY, "--tapers", SHAPES, "--seeds", "1", "--data", str(data_dir)]
    rc, _, stderr = _cli([*args, "--out", str(out)])
    assert rc == 0, stderr
    return out


def test_a_compare_of_the_shapes_trains_every_cell_at_one_budget(compared):
    rep = json.loads((compared / "report.json").read_text())
    by_name = {a["name"]: a for a in rep["allocations"]}
    assert list(by_name) == ["uniform", "bell-0.5", "narrow"]  # a name made from the spec
    # TINY: 3 layers x 64; the bell's widths are the solver's, symmetric, widest in the middle
    assert (
        by_name["bell-0.5"]["widths"] == solve_sizes(TaperSpec.parse("bell"), 3, 64) == [48, 96, 48]
    )
    narrow = by_name["narrow"]["widths"]
    assert narrow == narrow[::-1] and narrow[1] < narrow[0]
    params = {a["params"] for a in rep["allocations"]}
    flops = {a["flops_per_token"] for a in rep["allocations"]}
    assert len(params) == len(flops) == 1
    assert all(rep["checks"].values()), rep["checks"]
    for a in rep["allocations"]:
        assert a["val_loss"]["n"] == 1 and a["val_loss"]["mean"] > 0
    md = (compared / "report.md").read_text()
    assert "| bell:0.5 | `bell:0.5` |" in md and "| narrow | `hourglass:0.8` |" in md


def test_a_bell_cell_exports_to_hugging_face_and_gguf(compared, tmp_path):
    transformers = pytest.importorskip("transformers")
    gguf = pytest.importorskip("gguf")

    run = compared / "runs" / "bell-0.5-s0"
    assert _cli(["export", str(run), "--out", str(tmp_path / "hf")])[0] == 0
    model, cfg = load_run_model(run)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", trust_remote_code=True)
    assert [b.mlp.width for b in hf.model.blocks] == cfg.model.mlp_widths == [48, 96, 48]
    x = torch.randint(0, cfg.model.vocab_size, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(hf(x).logits, model(x).logits, atol=1e-5, rtol=0)
    gguf_file = tmp_path / "bell.gguf"
    rc, _, err = _cli(["export", str(run), "--format", "gguf", "--out", str(gguf_file)])
    assert rc == 0, err
    fields = gguf.GGUFReader(gguf_file).fields
    key = next(k for k in fields if k.endswith(".feed_forward_length"))
    assert [int(v) for v in fields[key].contents()] == [48, 96, 48]
