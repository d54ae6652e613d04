"""The warmup-stable-decay LR schedule and its cooldown branches: the LR before a run's decay
does not depend on its length, and a branch started from a longer run's checkpoint is, bit for
bit, the shorter run trained from step 0 (tiny models on a tiny prepared corpus)."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
import torch

import fault_harness
from conftest import TINY_RUN_SETS
from taperlm.checkpoint import store as ckpt
from taperlm.cli import main as cli_main
from taperlm.config import RunConfig, apply_overrides, run_config_from_dict, to_dict
from taperlm.config.presets import get_preset
from taperlm.config.train import LRScheduleName
from taperlm.errors import ConfigError
from taperlm.training.loop import train
from taperlm.training.metrics import read_metrics
from taperlm.training.optim import SCHEDULE_KINDS, LRKind, LRSchedule
from taperlm.training.run_dir import BRANCH_FILE, branch_step

TINY = [
    *TINY_RUN_SETS,
    "train.warmup_tokens=512",  # 2 steps
    "train.lr=0.003",
    "train.log_every=1",
    "train.eval_every=0",
    "train.eval_tokens=256",
    "train.keep_checkpoints=20",
    "train.schedule=wsd",
    "train.decay_fraction=0.25",
]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("wsddata")
    src = root / "corpus.txt"
    src.write_text(fault_harness.corpus_text(12000, 0), encoding="utf-8")
    out = root / "data"
    rc = cli_main(["prepare", "--source", str(src), "--tokenizer", "bpe:512", "--out", str(out)])
    assert rc == 0
    return out


def config(data_dir: Path, steps: int, *overrides: str) -> RunConfig:
    data = {"model": to_dict(get_preset("transformer-tiny", resolve=False))}
    apply_overrides(data, [*TINY, f"train.tokens={steps * 256}", *overrides])
    cfg = run_config_from_dict(data).resolve()
    cfg.data.dir = str(data_dir)
    return cfg


def weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    return ckpt.load_model_state(run / "checkpoints" / ckpt.checkpoint_name(step))


def test_wsd_schedule_shape():
    s = LRSchedule(1.0, 2, 10, 0.1, "warmup_stable_decay", 4)
    assert s.decay_start == 6
    assert [s(i) for i in range(10)] == pytest.approx(
        [0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 0.775, 0.55, 0.325, 0.1]
    )
    assert s(30) == pytest.approx(0.1)  # flat after the end
    assert s.state_dict()["kind"] == "warmup_stable_decay" and s.state_dict()["decay_steps"] == 4


def test_wsd_lr_before_the_decay_does_not_depend_on_the_length(data_dir):
    """Every budget's LR agrees with the longest run's up to its own decay start, and its decay
    is decay_fraction of its steps (rounded up), ending at the floor."""
    longest = config(data_dir, 400)
    long_s = LRSchedule.from_config(longest.train, 400)
    for steps in (3, 8, 17, 40, 123, 400):
        cfg = config(data_dir, steps)
        s = LRSchedule.from_config(cfg.train, steps)
        assert s.decay_steps == min(-(-steps // 4), steps - 2)
        assert branch_step(cfg) == s.decay_start == steps - s.decay_steps
        assert [s(i) for i in range(s.decay_start)] == [long_s(i) for i in range(s.decay_start)]
        assert s(steps - 1) == pytest.approx(0.1 * 0.003)
        assert s(s.decay_start) < 0.003


def test_cosine_is_the_default_and_has_no_branch(data_dir):
    cfg = config(data_dir, 8, "train.schedule=cosine")
    assert LRSchedule.from_config(cfg.train, 8).kind == "warmup_cosine"
    with pytest.raises(ConfigError, match=r"train\.schedule: wsd"):
        branch_step(cfg)


def test_branch_equals_the_run_trained_directly(data_dir, tmp_path):
    """A 16-step WSD run checkpointed every 2 steps; the 8-step budget's branch from its step-6
    checkpoint (8 - ceil(8/4) = 6: the decay start) equals the 8-step run trained from step 0,
    weights and final loss, bit for bit; the long run's own later weights do not (its LR stays
    at the plateau), so the comparison can tell them apart. The branch then resumes from its own
    checkpoints and refuses a step inside its decay or a config that differs in more than
    train.tokens."""
    long_run, direct, branched = tmp_path / "long", tmp_path / "direct", tmp_path / "branch"
    train(config(data_dir, 16, "train.checkpoint_every=2"), long_run, progress=False)
    res_direct = train(config(data_dir, 8, "train.checkpoint_every=4"), direct, progress=False)
    short = config(data_dir, 8, "train.checkpoint_every=4")
    assert branch_step(short) == 6
    res = train(short, branched, progress=False, branch=(long_run, 6))
    assert res.finished and res.step == 8
    a, b = weights(direct, 8), weights(branched, 8)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert res.train_loss == res_direct.train_loss
    assert any(not torch.equal(a[k], v) for k, v in weights(long_run, 8).items())
    assert json.loads((branched / BRANCH_FILE).read_text())["step"] == 6
    steps = [r["step"] for r in read_metrics(branched / "metrics.jsonl") if "loss" in r]
    assert steps == [7, 8]  # the branch's own steps; 1-6 are the long run's
    # resumable: again with the same arguments trains nothing more and keeps the result
    again = train(short, branched, progress=False, branch=(long_run, 6))
    assert again.step == 8 and torch.equal(weights(branched, 8)[next(iter(a))], a[next(iter(a))])
    with pytest.raises(ConfigError, match="decay starts at step 6"):
        train(short, tmp_path / "late", progress=False, branch=(long_run, 8))
    other = config(data_dir, 8, "train.lr=0.002")
    with pytest.raises(ConfigError, match=r"differs in more than train.tokens.*lr"):
        train(other, tmp_path / "other", progress=False, branch=(long_run, 6))
    cosine = config(data_dir, 8, "train.schedule=cosine")
    with pytest.raises(ConfigError, match=r"train\.schedule: wsd"):
        train(cosine, tmp_path / "cos", progress=False, branch=(long_run, 6))


def test_train_budgets_gives_every_budget_as_if_trained_alone(data_dir, tmp_path):
    """train_budgets with 6, 10 and 16 steps: one 16-step WSD run stopped at each branch step,
    a branch per shorter budget; every budget's final weights equal that budget trained from
    step 0, and a second call trains nothing more (every budget done)."""
    from taperlm.training.cooldowns import budget_dir, train_budgets

    run = config(data_dir, 16, "train.checkpoint_every=4", "train.keep_checkpoints=1")
    budgets = [6 * 256, 10 * 256, 16 * 256]
    res = train_budgets(run, budgets, tmp_path / "chain", progress=False)
    assert sorted(res) == budgets and all(r.finished for r in res.values())
    for tokens in budgets:
        alone = tmp_path / f"alone-{tokens}"
        train(config(data_dir, tokens // 256, "train.checkpoint_every=4"), alone, progress=False)
        steps = tokens // 256
        a, b = weights(alone, steps), weights(budget_dir(tmp_path / "chain", tokens), steps)
        assert all(torch.equal(a[k], b[k]) for k in a), tokens
        if tokens < 16 * 256:  # a branch: only its decay was trained (not a run from step 0)
            here = budget_dir(tmp_path / "chain", tokens)
            k = branch_step(config(data_dir, steps))
            assert json.loads((here / BRANCH_FILE).read_text())["step"] == k
            trained = [r["step"] for r in read_metrics(here / "metrics.jsonl") if "loss" in r]
            assert trained == list(range(k + 1, steps + 1))
    # the long run kept only its newest checkpoint, yet every branch found its step
    assert [s for s, _ in ckpt.list_checkpoints(budget_dir(tmp_path / "chain", 16 * 256))] == [16]
    again = train_budgets(run, budgets, tmp_path / "chain", progress=False)
    assert {t: r.step for t, r in again.items()} == {t: t // 256 for t in budgets}
    with pytest.raises(ConfigError, match=r"train\.schedule: wsd"):
        train_budgets(config(data_dir, 16, "train.schedule=cosine"), budgets, tmp_path / "c")


def test_every_lr_schedule_name_has_its_shape():
    """train.schedule's closed set (`LRScheduleName`) and the schedule shapes the trainer knows
    (`optim.SCHEDULE_KINDS`, typed by `LRKind`) are the same sets: a new name fails here until
    the trainer has its shape."""
    assert tuple(SCHEDULE_KINDS) == typing.get_args(LRScheduleName)
    assert set(SCHEDULE_KINDS.values()) == set(typing.get_args(LRKind))
    for name in SCHEDULE_KINDS:
        run = RunConfig(model=get_preset("transformer-nano"))
        run.train.schedule = name
        assert LRSchedule.from_config(run.train, 10).kind == SCHEDULE_KINDS[name]
