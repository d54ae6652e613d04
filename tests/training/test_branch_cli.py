"""`taperlm train --branch-from RUN --tokens N`: a WSD run's cooldown branch from the command
line. Its result is, bit for bit, the budget's branch from `train_budgets` and the budget trained
from step 0; every refusal names the option and the fix; the source run dir is never written
(tiny models on a tiny prepared corpus)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
import torch

import fault_harness
from conftest import TINY_RUN_SETS
from taperlm.checkpoint import store as ckpt
from taperlm.cli import main as cli_main
from taperlm.config import RunConfig, apply_overrides, run_config_from_dict, save_yaml, to_dict
from taperlm.config.presets import get_preset
from taperlm.training.cooldowns import budget_dir, train_budgets
from taperlm.training.loop import train
from taperlm.training.metrics import read_metrics
from taperlm.training.run_dir import BRANCH_FILE, branch_step

STEP = 256  # train.batch_tokens of TINY_RUN_SETS
TINY = [
    *TINY_RUN_SETS,
    "train.warmup_tokens=512",  # 2 steps
    "train.lr=0.003",
    "train.log_every=1",
    "train.eval_every=0",
    "train.eval_tokens=256",
    "train.checkpoint_every=4",
    "train.keep_checkpoints=20",
    "train.schedule=wsd",
    "train.decay_fraction=0.25",
]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("branchdata")
    src = root / "corpus.txt"
    src.write_text(fault_harness.corpus_text(12000, 0), encoding="utf-8")
    out = root / "data"
    rc = cli_main(["prepare", "--source", str(src), "--tokenizer", "bpe:512", "--out", str(out)])
    assert rc == 0
    return out


def config(data_dir: Path, steps: int, *overrides: str) -> RunConfig:
    data = {"model": to_dict(get_preset("transformer-tiny", resolve=False))}
    apply_overrides(data, [*TINY, f"train.tokens={steps * STEP}", *overrides])
    cfg = run_config_from_dict(data).resolve()
    cfg.data.dir = str(data_dir)
    return cfg


@pytest.fixture(scope="module")
def source(data_dir, tmp_path_factory) -> Path:
    """The stable phase of a 16-step WSD run (decay from step 12), stopped at step 12 as a user
    would stop a long run meant for branches: checkpoints at steps 4, 8 and 12."""
    out = tmp_path_factory.mktemp("branchsrc") / "long"
    res = train(config(data_dir, 16), out, progress=False, stop_after=12)
    assert res.step == 12 and [s for s, _ in ckpt.list_checkpoints(out)] == [4, 8, 12]
    return out


def files_digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    return ckpt.load_model_state(run / "checkpoints" / ckpt.checkpoint_name(step))


def losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run / "metrics.jsonl") if "loss" in r}


def branch_cli(source: Path, out: Path, *extra: str) -> int:
    return cli_main(["train", "--branch-from", str(source), "--out", str(out), "--no-progress",
                     *extra])  # fmt: skip


def test_cli_branch_is_train_budgets_branch_and_the_direct_run(data_dir, source, tmp_path, capsys):
    """The 8-step budget (decay from step 6) branched by the CLI from the source's newest
    checkpoint at or before step 6 (step 4: it trains plateau steps 5-6, then its decay 7-8)
    has the weights and per-step losses of train_budgets' 8-step branch and of the 8-step run
    trained from step 0; a rerun continues its own checkpoints (nothing more to train); the
    source's files are unchanged, byte for byte. An --out that already holds another run is
    refused."""
    before = files_digest(source)
    out = tmp_path / "branch"
    assert branch_cli(source, out, "--tokens", str(8 * STEP)) == 0
    assert json.loads((out / BRANCH_FILE).read_text())["step"] == 4
    assert branch_step(config(data_dir, 8)) == 6
    assert sorted(losses(out)) == [5, 6, 7, 8]  # its own steps; 1-4 are the source's

    chain = tmp_path / "chain"
    got = train_budgets(config(data_dir, 16), [8 * STEP, 16 * STEP], chain, progress=False)
    direct = tmp_path / "direct"
    res_direct = train(config(data_dir, 8), direct, progress=False)
    mine = weights(out, 8)
    for other in (weights(budget_dir(chain, 8 * STEP), 8), weights(direct, 8)):
        assert mine.keys() == other.keys() and all(torch.equal(mine[k], other[k]) for k in mine)
    assert got[8 * STEP].train_loss == res_direct.train_loss
    for step in (7, 8):  # the decay: trained by all three
        assert losses(out)[step] == losses(budget_dir(chain, 8 * STEP))[step]
        assert losses(out)[step] == losses(direct)[step]
    # the comparison can tell states apart: the source's own step-8 weights (plateau LR) differ
    assert any(not torch.equal(mine[k], v) for k, v in weights(source, 8).items())

    assert branch_cli(source, out, "--tokens", str(8 * STEP)) == 0  # rerun: done already
    assert sorted(losses(out)) == [5, 6, 7, 8]
    assert all(torch.equal(mine[k], v) for k, v in weights(out, 8).items())
    assert files_digest(source) == before
    # a branch continues only as a branch of its own source; a plain run is no branch at all
    other = tmp_path / "other"
    other.mkdir()
    save_yaml(config(data_dir, 16), other / "config.yaml")
    capsys.readouterr()
    assert branch_cli(other, out, "--tokens", str(8 * STEP)) == 2
    assert f"is a cooldown branch of {source.resolve()}, not of {other}" in capsys.readouterr().err
    assert branch_cli(source, direct, "--tokens", str(8 * STEP)) == 2
    assert "not a cooldown branch (no branch.json); give a new --out" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("no tokens", r"--branch-from .* needs --tokens N"),
        ("not a run", r"--branch-from .* is no run dir \(it has no config\.yaml\)"),
        ("cosine", r"--branch-from .*train\.schedule 'cosine'.*--set train\.schedule=wsd"),
        ("no checkpoint", r"--branch-from .* has no checkpoint yet; train it"),
        ("pruned", r"no checkpoint at or before step 3.*steps 4, 8, 12.*larger budget"),
        (
            "past the plateau",
            r"--tokens 6,144: its decay would start at step 18, after.*"
            r"stable phase ends \(step 12 of 16.*at most 4,096",
        ),
        (
            "in the warmup",
            r"--tokens 256: shorter than the source's warmup \(2 steps.*"
            r"give --tokens at least 512",
        ),
        ("other config", r"differs in more.*train\.lr.*drop the options.*--tokens"),
        ("out is the source", r"--out .* is the same path as --branch-from"),
    ],
)
def test_cli_branch_refusals(case, expected, data_dir, source, tmp_path, capsys):
    """Each refusal: exit 2, one message naming the option and what to do, no --out written,
    and the source's files unchanged."""
    before = files_digest(source)
    out = tmp_path / "branch"
    src, extra = source, ["--tokens", str(8 * STEP)]
    if case == "no tokens":
        extra = []
    elif case == "not a run":
        src = tmp_path / "empty"
        src.mkdir()
    elif case in ("cosine", "no checkpoint"):
        src = tmp_path / "config-only"
        src.mkdir()
        schedule = "cosine" if case == "cosine" else "wsd"
        save_yaml(config(data_dir, 16, f"train.schedule={schedule}"), src / "config.yaml")
    elif case == "pruned":
        extra = ["--tokens", str(4 * STEP)]  # decay from step 3; the oldest checkpoint is 4
    elif case == "past the plateau":
        extra = ["--tokens", str(24 * STEP)]
    elif case == "in the warmup":
        extra = ["--tokens", str(STEP)]
    elif case == "other config":
        extra += ["--set", "train.lr=0.002"]
    elif case == "out is the source":
        out = source
    capsys.readouterr()
    assert branch_cli(src, out, *extra) == 2
    err = capsys.readouterr().err
    assert err.startswith("taperlm train: error: ")
    assert re.search(expected, err.replace("\n", " ")), err
    assert out == source or not out.exists()
    assert files_digest(source) == before
