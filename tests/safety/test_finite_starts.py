"""Class 2 of issue 63: finite or refused.

Every way a run starts from given weights -- `taperlm import` (one file or shards, and the
library's `write_start_run` behind it), `taperlm prune`'s source, `train --init-from`,
`train --distill-from`'s teacher, and continuing a run whose checkpoint holds such weights --
checks them for NaN/inf before anything is written: the refusal names the tensors and the file,
and the output folder is not created (or is left as it was).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import fault_harness as H
from conftest import assert_naming, raises_naming
from taperlm.checkpoint import store
from taperlm.checkpoint.loading import load_run_model
from taperlm.cli import main as cli_main
from taperlm.errors import CheckpointError
from taperlm.training.run_dir import write_start_run

transformers = pytest.importorskip("transformers")
transformers.utils.logging.disable_progress_bar()

from test_import import make_hf  # noqa: E402

# (taperlm name, HF name) of the tensors spoiled; one NaN, one inf
SPOILED = [
    ("blocks.0.mlp.w_out.weight", "model.layers.0.mlp.down_proj.weight", float("nan")),
    ("embed.weight", "model.embed_tokens.weight", float("inf")),
]


def _cli(argv: list, capsys) -> tuple[int, str]:
    rc = cli_main([str(a) for a in argv])
    return rc, capsys.readouterr().err


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, Path]:
    """A data dir, a trained run, and `bad`: that run's weights with a NaN and an inf, written
    as a run (as an older taperlm's import, or an edit, would leave it)."""
    root = tmp_path_factory.mktemp("finite")
    data = H.prepare_data(root / "d")
    run = root / "run"
    assert cli_main([*H.train_argv(data, run), "--stop-after-steps", "1"]) == 0
    model, cfg = load_run_model(run)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    for name, _, value in SPOILED:
        weights[name][0, 0] = value
    bad = root / "bad"
    with pytest.MonkeyPatch.context() as mp:  # the guard under test, switched off to make it
        mp.setattr(store, "require_finite", lambda *a, **k: None)
        write_start_run(bad, cfg, weights)
    assert not torch.isfinite(
        store.load_model_state(store.find_checkpoint(bad))[SPOILED[0][0]]
    ).all()
    return {"data": data, "run": run, "bad": bad, "root": root}


def _hf_with_nonfinite(folder: Path, data: Path, **save) -> Path:
    make_hf(folder, data, **save)
    model = transformers.LlamaForCausalLM.from_pretrained(folder)
    state = model.state_dict()
    with torch.no_grad():
        for _, hf_name, value in SPOILED:
            state[hf_name][0, 0] = value
    model.save_pretrained(folder, **save)
    return folder


@pytest.mark.parametrize("sharded", [False, True])
def test_import_refuses_nonfinite_weights_naming_tensor_and_file(world, tmp_path, capsys, sharded):
    save = {"max_shard_size": "20KB"} if sharded else {}
    folder = _hf_with_nonfinite(tmp_path / "hf", world["data"], **save)
    files = {}
    if sharded:
        index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
        files = {hf: folder / index[hf] for _, hf, _ in SPOILED}
        assert len(set(files.values())) == 2  # the two tensors sit in two shards
    else:
        files = {hf: folder / "model.safetensors" for _, hf, _ in SPOILED}
    out = tmp_path / "out"
    rc, err = _cli(["import", folder, "--out", out], capsys)
    assert rc == 2 and "NaN or inf" in err and "nothing was written" in err, err
    first = min(files.values())  # the shards are read in order: the first one's is named
    assert_naming(err, str(first), *[hf for hf, f in files.items() if f == first])
    assert not out.exists()


def test_write_start_run_refuses_nonfinite_weights(world, tmp_path):
    """The library's writer of a run from given weights (every import format ends there)."""
    model, cfg = load_run_model(world["run"])
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    for name, _, value in SPOILED:
        weights[name][1, 1] = value
    out = tmp_path / "out"
    with raises_naming(CheckpointError, f"the weights for {out}", *(n for n, _, _ in SPOILED)):
        write_start_run(out, cfg, weights)
    assert not out.exists()


# path -> command line; `out` must not appear, the weights' folder must stay as it was
def _paths(w: dict[str, Path], out: Path, own: Path) -> dict[str, tuple[str, list]]:
    bad, data = w["bad"], w["data"]
    step = ["--stop-after-steps", "1"]
    prune = ["--out", out, "--params", "0.75", "--params-of", "non-embedding",
             "--calibration-tokens", "256"]  # fmt: skip
    return {
        "prune": (f"the source {bad}", ["prune", bad, "--data", data, *prune]),
        "init-from": (f"train.init_from {store.find_checkpoint(bad)}",
                      ["train", "--init-from", bad, "--data", data, "--out", out,
                       "--no-progress", *step]),
        "distill-from": (f"train.distill_from {store.find_checkpoint(bad)}",
                         [*H.train_argv(data, out), "--distill-from", bad, *step]),
        "continue": (f"checkpoint {store.find_checkpoint(own)}",
                     ["train", "--out", own, "--data", data, "--no-progress", *step]),
    }  # fmt: skip


PATHS = ["prune", "init-from", "distill-from", "continue"]


@pytest.mark.parametrize("path", PATHS)
def test_starting_from_nonfinite_weights_is_refused(world, path, tmp_path, capsys):
    own = tmp_path / "own"
    shutil.copytree(world["bad"], own)
    out = tmp_path / "out"
    where, argv = _paths(world, out, own)[path]
    before, bad_before = H.snapshot(own), H.snapshot(world["bad"])
    rc, err = _cli(argv, capsys)
    assert rc == 2, err
    assert_naming(err, where, "NaN or inf", "nothing was written")
    named = [n for n, _, _ in SPOILED if n in err]
    # the trainer names the first tensor it finds (collectively, on every rank); the others all
    assert named == ([n for n, _, _ in SPOILED] if path != "continue" else ["embed.weight"])
    assert not out.exists()
    assert H.snapshot(own) == before and H.snapshot(world["bad"]) == bad_before


@pytest.mark.parametrize("path", PATHS)
def test_finite_weights_start_on_every_path(world, path, tmp_path, capsys):
    """The same paths from the finite run: they run (so the refusals above are the check's)."""
    own = tmp_path / "own"
    shutil.copytree(world["run"], own)
    out = tmp_path / "out"
    w = {**world, "bad": world["run"]}
    _, argv = _paths(w, out, own)[path]
    if path == "continue":
        argv = [*argv[:-1], "2"]  # one step past its checkpoint
    rc, err = _cli(argv, capsys)
    assert rc == 0, err
