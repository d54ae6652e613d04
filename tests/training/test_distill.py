"""Healing by distillation (`train.distill_from`) and starting from another run's weights
(`train.init_from`): the KL term against a reference and its gradient against autograd and the
closed form, the mix, a distilled run that resumes bit for bit, a resume with another teacher
refused, and the start weights loaded exactly."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import fault_harness
from conftest import TINY_RUN_SETS, raises_naming
from taperlm.checkpoint import store as ckpt
from taperlm.cli import main as cli_main
from taperlm.config import RunConfig, apply_overrides, run_config_from_dict, to_dict
from taperlm.config.presets import get_preset
from taperlm.data.loader import TokenBatches
from taperlm.errors import CheckpointError, ConfigError
from taperlm.models import TaperedLM
from taperlm.models.loss import distillation_kl
from taperlm.training.loop import Trainer, train
from taperlm.training.metrics import read_metrics

# ----------------------------------------------------------------------------------------------
# the loss


def _logits(seed: int, shape=(3, 5, 7), dtype=torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype) * 2


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.5])
def test_kl_value_and_gradient(temperature):
    s = _logits(0).requires_grad_(True)
    t = _logits(1)
    y = torch.randint(0, 7, (3, 5), generator=torch.Generator().manual_seed(2))
    y[0, :2] = -100  # ignored positions count neither in the mean nor in the gradient
    loss = distillation_kl(s, t, y, temperature)
    keep = (y != -100).reshape(-1)
    ls, lt = (z.reshape(-1, 7)[keep] / temperature for z in (s, t))
    ref = (
        F.kl_div(
            F.log_softmax(ls, -1), F.log_softmax(lt, -1), log_target=True, reduction="batchmean"
        )
        * temperature**2
    )
    torch.testing.assert_close(loss, ref)
    # the closed-form gradient: T (softmax(s/T) - softmax(t/T)) / N at kept positions, 0 elsewhere
    (grad,) = torch.autograd.grad(loss, s)
    n = int(keep.sum())
    want = torch.zeros(15, 7, dtype=torch.float64)
    want[keep] = temperature * (F.softmax(ls, -1) - F.softmax(lt, -1)).detach() / n
    torch.testing.assert_close(grad.reshape(-1, 7), want)
    assert torch.autograd.gradcheck(
        lambda z: distillation_kl(z, t, y, temperature), (s.detach().clone().requires_grad_(),)
    )


def test_kl_is_zero_for_the_teacher_itself_and_never_trains_it():
    t = _logits(3).requires_grad_(True)
    y = torch.zeros(3, 5, dtype=torch.long)
    loss = distillation_kl(t, t, y, 2.0)
    assert abs(float(loss.detach())) < 1e-12
    s = _logits(4).requires_grad_(True)
    distillation_kl(s, t, y, 1.0).backward()
    assert t.grad is None and s.grad is not None


# ----------------------------------------------------------------------------------------------
# runs

TINY = [
    *TINY_RUN_SETS,
    "train.tokens=1536",  # 6 steps
    "train.warmup_tokens=256",
    "train.lr=0.003",
    "train.log_every=1",
    "train.eval_every=3",
    "train.eval_tokens=128",
    "train.checkpoint_every=2",
    "train.keep_checkpoints=10",
]


def config(data_dir: Path, *overrides: str) -> RunConfig:
    data = {"model": to_dict(get_preset("transformer-tiny", resolve=False))}
    apply_overrides(data, [*TINY, *overrides])
    cfg = run_config_from_dict(data).resolve()
    cfg.data.dir = str(data_dir)
    return cfg


def losses(run: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(run / "metrics.jsonl") if "loss" in r]


def weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    return ckpt.load_model_state(run / "checkpoints" / ckpt.checkpoint_name(step))


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(data dir, teacher A, teacher B): two short runs of different seeds."""
    root = tmp_path_factory.mktemp("distill")
    src = root / "corpus.txt"
    src.write_text(fault_harness.corpus_text(12000, 0), encoding="utf-8")
    data = root / "data"
    assert (
        cli_main(["prepare", "--source", str(src), "--tokenizer", "bpe:512", "--out", str(data)])
        == 0
    )
    for name, seed in (("a", 0), ("b", 1)):
        train(config(data, f"train.seed={seed}", "train.tokens=1024"), root / name, progress=False)
    return data, root / "a", root / "b"


@pytest.fixture(scope="module")
def distilled(setup, tmp_path_factory) -> Path:
    """One uninterrupted distilled run (student seed 5, teacher A)."""
    data, a, _ = setup
    out = tmp_path_factory.mktemp("ref") / "run"
    train(
        config(data, "train.seed=5", f"train.distill_from={a}", "train.distill_temperature=2"),
        out,
        progress=False,
    )
    return out


def test_distilled_run_resumes_bit_identically(setup, distilled, tmp_path):
    data, a, _ = setup

    def cfg() -> RunConfig:
        return config(
            data, "train.seed=5", f"train.distill_from={a}", "train.distill_temperature=2"
        )

    out = tmp_path / "run"
    first = train(cfg(), out, progress=False, stop_after=3)
    assert first.step == 3
    shutil.rmtree(out / "checkpoints" / ckpt.checkpoint_name(3))  # resume from step 2
    assert train(cfg(), out, progress=False).step == 6
    assert losses(out) == losses(distilled)
    for k, v in weights(distilled, 6).items():
        assert torch.equal(weights(out, 6)[k], v), k
    # and the teacher mattered: the plain run of the same seed trains differently
    plain = train(config(data, "train.seed=5"), tmp_path / "plain", progress=False)
    assert plain.step == 6 and losses(tmp_path / "plain") != losses(distilled)


def test_mix_zero_is_the_plain_lm_loss_bit_for_bit(setup, tmp_path):
    data, a, _ = setup
    plain = train(config(data, "train.seed=5", "train.tokens=512"), tmp_path / "p", progress=False)
    mixed = config(
        data, "train.seed=5", "train.tokens=512", f"train.distill_from={a}", "train.distill_mix=0"
    )
    train(mixed, tmp_path / "m", progress=False)
    assert plain.step == 2 and losses(tmp_path / "m") == losses(tmp_path / "p")


def test_mix_one_trains_on_the_kl_alone(setup, tmp_path):
    """With distill_mix 1 the first step's loss is T^2 KL(teacher || student) of the student's
    initial weights on the first micro-batches, computed here independently."""
    data, a, _ = setup
    cfg = config(
        data,
        "train.seed=7",
        "train.tokens=256",
        f"train.distill_from={a}",
        "train.distill_mix=1",
        "train.distill_temperature=1.5",
    )
    trainer = Trainer(cfg, tmp_path / "k")
    try:
        student = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        teacher, accum = trainer.teacher.model, trainer.accum
        result = trainer.fit(progress=False)
    finally:
        trainer.close()
    t = cfg.train
    loader = TokenBatches(data, "train", t.seq_len, t.micro_batch_size, seed=t.seed)
    batches = [next(loader) for _ in range(accum)]
    model = TaperedLM(cfg.model)
    model.load_state_dict(student)
    want = 0.0
    with torch.no_grad():
        for x, y in batches:
            want += float(distillation_kl(model(x).logits, teacher(x).logits, y, 1.5)) / len(
                batches
            )
    assert result.step == 1 and losses(tmp_path / "k")[0] == pytest.approx(want, rel=1e-5)


def test_resume_with_another_teacher_or_none_is_refused(setup, tmp_path):
    data, a, b = setup
    out = tmp_path / "run"
    train(config(data, f"train.distill_from={a}"), out, progress=False, stop_after=2)
    with raises_naming(CheckpointError, str(out), "train.distill_from", "fresh --out"):
        train(config(data, f"train.distill_from={b}"), out, progress=False)
    with raises_naming(CheckpointError, str(out), "no teacher", "train.distill_from"):
        train(config(data), out, progress=False)
    # the same teacher, moved elsewhere (the path is a runtime setting): it resumes
    moved = tmp_path / "a-moved"
    shutil.copytree(a, moved)
    assert train(config(data, f"train.distill_from={moved}"), out, progress=False).step == 6


def test_a_teacher_of_another_vocabulary_is_refused(setup, tmp_path):
    data, _, _ = setup
    other = tmp_path / "other"
    train(config(data, "model.vocab_size=600", "train.tokens=256"), other, progress=False)
    with raises_naming(ConfigError, "train.distill_from", "vocabulary", "(600)"):
        train(config(data, f"train.distill_from={other}"), tmp_path / "s", progress=False)


def test_init_from_loads_the_weights_exactly(setup, tmp_path):
    data, a, _ = setup
    trainer = Trainer(config(data, "train.seed=9", f"train.init_from={a}"), tmp_path / "i")
    try:
        got = trainer.model.state_dict()
    finally:
        trainer.close()
    want = ckpt.load_model_state(ckpt.find_checkpoint(a))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    with raises_naming(ConfigError, "train.init_from", "model.mlp_width"):
        Trainer(config(data, "model.mlp_width=64", f"train.init_from={a}"), tmp_path / "j")


def test_cli_init_from_uses_its_config_and_distill_from(setup, tmp_path, capsys):
    data, a, _ = setup
    out = tmp_path / "healed"
    argv = [
        "train",
        "--init-from",
        str(a),
        "--distill-from",
        str(a),
        "--out",
        str(out),
        "--set",
        "train.tokens=512",
        "--no-progress",
    ]
    assert cli_main(argv) == 0
    saved = run_config_from_dict(__import__("yaml").safe_load((out / "config.yaml").read_text()))
    assert saved.train.init_from == str(a.resolve()) == saved.train.distill_from
    assert saved.model.mlp_widths == config(data).model.mlp_widths
