"""`train.loggers` / `--logger`: TensorBoard and W&B (offline) get every value of metrics.jsonl,
read back with their own readers; the config and per-layer widths at the start; a failing, hanging
or missing logger is a warning and the losses stay those of a run without loggers; a resumed run
continues the same logged run with no step twice; `compare` logs each cell as its own run of one
group. W&B never touches the network here: WANDB_MODE=offline, WANDB_DIR under tmp."""

from __future__ import annotations

import contextlib
import io
import math
import threading
import warnings
from pathlib import Path

import pytest
import torch

from conftest import assert_naming, raises_naming
from logger_readers import tb_scalars, tb_texts, wandb_runs
from taperlm.cli import main as cli_main
from taperlm.commands.common import logger_names
from taperlm.config import apply_overrides, run_config_from_dict, to_dict
from taperlm.config.presets import get_preset
from taperlm.errors import ConfigError, TrainingWarning
from taperlm.training import loggers as L
from taperlm.training.loop import train
from taperlm.training.metrics import read_metrics

SETS = [
    "model.n_layers=2",
    "model.d_model=32",
    "model.n_heads=2",
    "model.mlp_width=96",
    "model.vocab_size=512",
    "model.context_length=64",
    "model.taper=cosine:1.5:0.5",
    "train.seq_len=32",
    "train.micro_batch_size=4",
    "train.batch_tokens=256",
    "train.tokens=1536",  # 6 steps
    "train.warmup_tokens=256",
    "train.lr=0.003",
    "train.log_every=1",
    "train.eval_every=3",
    "train.eval_tokens=64",
    "train.checkpoint_every=3",
    "train.log_grads_every=2",
]
HAVE_TB = bool(__import__("importlib").util.find_spec("tensorboard"))
HAVE_WANDB = bool(__import__("importlib").util.find_spec("wandb"))
needs_tb = pytest.mark.skipif(not HAVE_TB, reason="needs the [tensorboard] extra")
needs_wandb = pytest.mark.skipif(not HAVE_WANDB, reason="needs the [wandb] extra")


def _offline(mp: pytest.MonkeyPatch, wandb_dir: Path) -> None:
    mp.setenv("WANDB_MODE", "offline")
    mp.setenv("WANDB_DIR", str(wandb_dir))
    mp.setenv("WANDB_SILENT", "true")
    for key in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):  # nothing under ~
        mp.setenv(key, str(wandb_dir / "wandb-home"))
    for key in ("WANDB_API_KEY", "WANDB_PROJECT", "WANDB_RUN_ID", "WANDB_RESUME"):
        mp.delenv(key, raising=False)


@pytest.fixture(autouse=True)
def _offline_wandb(tmp_path, monkeypatch):
    _offline(monkeypatch, tmp_path)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    import fault_harness

    root = tmp_path_factory.mktemp("logdata")
    (root / "c.txt").write_text(fault_harness.corpus_text(6000, 1), encoding="utf-8")
    out = root / "data"
    args = ["prepare", "--source", str(root / "c.txt"), "--tokenizer", "bpe:512", "--out", str(out)]
    assert cli_main(args) == 0
    return out


def _config(data_dir: Path, *extra: str):
    data = {"model": to_dict(get_preset("transformer-tiny", resolve=False))}
    apply_overrides(data, [*SETS, *extra])
    cfg = run_config_from_dict(data).resolve()
    cfg.data.dir = str(data_dir)
    return cfg


def _train_cli(data_dir: Path, out: Path, *flags: str) -> None:
    args = ["train", "--preset", "transformer-tiny", "--data", str(data_dir), "--out", str(out)]
    for s in SETS:
        args += ["--set", s]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert cli_main([*args, "--no-progress", *flags]) == 0, err.getvalue()


def _losses(run: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(run / "metrics.jsonl") if "loss" in r]


def _expected(run: Path) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} of metrics.jsonl as the loggers should show it."""
    want: dict[str, dict[int, float]] = {}
    for rec in read_metrics(run / "metrics.jsonl"):
        for tag, value in L.scalars(rec).items():
            want.setdefault(tag, {})[rec["step"]] = value
    return want


@pytest.fixture(scope="module")
def plain_run(data_dir, tmp_path_factory) -> Path:
    """The same run without loggers."""
    out = tmp_path_factory.mktemp("plain") / "run"
    _train_cli(data_dir, out)
    return out


@pytest.fixture(scope="module")
def logged_run(data_dir, tmp_path_factory) -> Path:
    """The run with both loggers (those installed), through `taperlm train --logger`; W&B's
    files in RUN/wandb (WANDB_DIR)."""
    names = [n for n, ok in (("tensorboard", HAVE_TB), ("wandb", HAVE_WANDB)) if ok]
    if not names:
        pytest.skip("needs the [tensorboard] or [wandb] extra")
    out = tmp_path_factory.mktemp("logged") / "run"
    with pytest.MonkeyPatch.context() as mp:
        _offline(mp, out)
        _train_cli(data_dir, out, "--logger", ",".join(names))
    return out


def test_metrics_record_per_layer_gradient_norms(plain_run):
    recs = [r for r in read_metrics(plain_run / "metrics.jsonl") if "layer_grad_norm" in r]
    assert [r["step"] for r in recs] == [2, 4, 6]  # train.log_grads_every=2
    for r in recs:
        assert len(r["layer_grad_norm"]) == len(r["layer_mlp_grad_norm"]) == 2
        # a block's norm includes its MLP's; all blocks together are below the global norm
        assert all(b >= m > 0 for b, m in zip(r["layer_grad_norm"], r["layer_mlp_grad_norm"]))
        step = next(
            x
            for x in read_metrics(plain_run / "metrics.jsonl")
            if x.get("loss") and x["step"] == r["step"]
        )
        assert math.hypot(*r["layer_grad_norm"]) <= step["grad_norm"] + 1e-6


def test_layer_grad_norms_by_hand():
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.blocks = torch.nn.ModuleList(
        torch.nn.ModuleDict({"mlp": torch.nn.Linear(3, 4), "mixer": torch.nn.Linear(3, 3)})
        for _ in range(3)
    )
    model.head = torch.nn.Linear(3, 2)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    got = L.layer_grad_norms(model.named_parameters(), 3, sharded=False)
    for i, block in enumerate(model.blocks):
        allg = torch.cat([p.grad.flatten() for p in block.parameters()])
        mlp = torch.cat([p.grad.flatten() for p in block["mlp"].parameters()])
        assert got["layer_grad_norm"][i] == pytest.approx(float(allg.norm()), rel=1e-6)
        assert got["layer_mlp_grad_norm"][i] == pytest.approx(float(mlp.norm()), rel=1e-6)


@needs_tb
def test_tensorboard_shows_every_value_of_metrics_jsonl(logged_run, plain_run):
    want = _expected(logged_run)
    got = tb_scalars(logged_run / "tensorboard")
    assert set(got) == set(want)
    for tag in ("train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "val/loss"):
        assert tag in got
    assert "grad_norm/layer_01" in got and "grad_norm/mlp_00" in got
    for tag, series in want.items():
        assert got[tag].keys() == series.keys(), tag
        for step, value in series.items():  # TensorBoard keeps float32
            assert got[tag][step] == pytest.approx(value, rel=1e-6, abs=1e-30), (tag, step)
    assert _losses(logged_run) == _losses(plain_run)  # logging changes no number
    texts = tb_texts(logged_run / "tensorboard")
    cfg = run_config_from_dict(
        __import__("yaml").safe_load((logged_run / "config.yaml").read_text())
    )
    layers = next(t for k, t in texts.items() if k.startswith("layers"))
    for i, width in enumerate(cfg.model.mlp_widths):
        assert f"| {i} | {width} | 2 | 2 |" in layers
    config = next(t for k, t in texts.items() if k.startswith("config"))
    assert "mlp_widths" in config and "cosine" in config


@needs_wandb
def test_wandb_offline_run_holds_every_value_of_metrics_jsonl(logged_run):
    (run,) = wandb_runs(logged_run / "wandb")
    state = L.read_state(logged_run)
    assert run.run_id == state["wandb"]["id"] and state["wandb"]["last_step"] == 6
    assert (run.name, run.group, run.project) == ("run", "", "taperlm")
    cfg = run_config_from_dict(
        __import__("yaml").safe_load((logged_run / "config.yaml").read_text())
    )
    assert run.config["model"]["mlp_widths"] == cfg.model.mlp_widths
    assert [r["mlp_width"] for r in run.config["layers"]] == cfg.model.mlp_widths
    assert [r["heads"] for r in run.config["layers"]] == [2, 2]
    want = _expected(logged_run)
    rows = {r["_step"]: r for r in run.rows}
    assert sorted(rows) == list(range(1, 7)) and len(rows) == len(run.rows)
    for tag, series in want.items():
        for step, value in series.items():
            assert rows[step][tag] == value, (tag, step)  # JSON: exact


class _Failing:
    """A logger that raises at its second record."""

    def __init__(self, info):
        self.n = 0

    def log(self, step, values):
        self.n += 1
        if self.n == 2:
            raise OSError(28, "No space left on device")

    def flush(self):
        pass

    def close(self):
        pass


class _BadStart:
    def __init__(self, info):
        raise RuntimeError("cannot reach the server")


def _warned(record: list[warnings.WarningMessage]) -> str:
    return "\n".join(str(w.message) for w in record if issubclass(w.category, TrainingWarning))


@pytest.mark.parametrize(
    "backend, message",
    [
        (_Failing, "the tensorboard logger failed at step 2 (OSError"),
        (_BadStart, "the tensorboard logger could not start (RuntimeError: cannot reach"),
        (None, "tensorboard is not installed (pip install 'taperlm[tensorboard]')"),
    ],
)
def test_a_failing_logger_warns_and_training_goes_on(
    data_dir, tmp_path, plain_run, monkeypatch, backend, message
):
    if backend is None:
        real = L.importlib.util.find_spec
        monkeypatch.setattr(
            L.importlib.util, "find_spec", lambda n, *a: None if n == "tensorboard" else real(n)
        )
    else:
        monkeypatch.setitem(L.BACKENDS, "tensorboard", backend)
        monkeypatch.setitem(L.PACKAGES, "tensorboard", "json")  # a stand-in: nothing to import
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        res = train(
            _config(data_dir, "train.loggers=[tensorboard]"), tmp_path / "r", progress=False
        )
    assert res.finished
    text = _warned(record)
    assert message in text and "training goes on without it" in text, text
    assert _losses(tmp_path / "r") == _losses(plain_run)


def test_a_hanging_logger_never_holds_training(data_dir, tmp_path, plain_run, monkeypatch):
    release = threading.Event()

    class Hanging(_Failing):
        def log(self, step, values):
            release.wait(60)  # e.g. wandb stuck on the network

    monkeypatch.setitem(L.BACKENDS, "tensorboard", Hanging)
    monkeypatch.setitem(L.PACKAGES, "tensorboard", "json")
    monkeypatch.setattr(L, "QUEUE_RECORDS", 2)
    monkeypatch.setattr(L, "CLOSE_SECONDS", 0.5)
    try:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            res = train(
                _config(data_dir, "train.loggers=[tensorboard]"), tmp_path / "r", progress=False
            )
    finally:
        release.set()
    assert res.finished and _losses(tmp_path / "r") == _losses(plain_run)
    text = _warned(record)
    assert "not keeping up" in text and "did not finish within 0 s" in text, text


def _crash_after(step: int):
    def on_step(done: int, total: int, loss: float):
        if done == step:
            raise RuntimeError("crash")  # after steps past the last checkpoint were logged
        return None

    return on_step


@pytest.mark.skipif(not (HAVE_TB and HAVE_WANDB), reason="needs the [tensorboard,wandb] extras")
def test_resumed_run_continues_the_same_logged_run_without_repeats(data_dir, tmp_path, plain_run):
    cfg = _config(data_dir, "train.loggers=[tensorboard,wandb]")
    out = tmp_path / "r"
    with pytest.raises(RuntimeError, match="crash"):
        train(cfg, out, progress=False, on_step=_crash_after(5))  # checkpoint at 3, logged to 5
    first = wandb_runs(tmp_path / "wandb")
    assert [r["_step"] for r in first[0].rows] == [1, 2, 3, 4, 5]
    before = tb_scalars(out / "tensorboard")
    assert sorted(before["train/loss"]) == [1, 2, 3, 4, 5]

    res = train(cfg, out, progress=False)  # resumes from step 3
    assert res.finished and _losses(out) == _losses(plain_run)
    assert len(list((out / "tensorboard").iterdir())) == 2  # one folder, a file per session
    want, got = _expected(out), tb_scalars(out / "tensorboard")  # each step once (asserted)
    assert set(got) == set(want)
    for tag, series in want.items():
        assert got[tag].keys() == series.keys(), tag
        for step, value in series.items():
            assert got[tag][step] == pytest.approx(value, rel=1e-6, abs=1e-30), (tag, step)

    runs = wandb_runs(tmp_path / "wandb")
    assert len(runs) == 2 and runs[0].run_id == runs[1].run_id  # one W&B run, resumed
    steps = [r["_step"] for run in runs for r in run.rows]
    assert steps == [1, 2, 3, 4, 5, 6]  # steps 4, 5 (redone) not sent twice
    rows = {r["_step"]: r for run in runs for r in run.rows}
    for tag, series in want.items():
        for step, value in series.items():
            if tag != "train/tokens_per_s":  # timing differs between the two sessions
                assert rows[step][tag] == value, (tag, step)


def test_logger_option_and_field(data_dir):
    assert logger_names(None) is None
    assert logger_names([["tensorboard", "wandb"], ["tensorboard"]]) == ["tensorboard", "wandb"]
    assert logger_names([["none"]]) == []
    with raises_naming(ConfigError, "--logger none"):
        logger_names([["none"], ["wandb"]])
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit):
        cli_main(["train", "--preset", "transformer-tiny", "--out", "x", "--logger", "tensorbord"])
    assert_naming(err.getvalue(), "'tensorbord'", "tensorboard", "wandb", "none")
    with raises_naming(ConfigError, "train.loggers[0]", "tensorboard, wandb", "'mlflow'"):
        _config(data_dir, "train.loggers=[mlflow]")


def test_compare_puts_its_runs_in_one_group(tmp_path):
    from taperlm.compare.options import CompareOptions
    from taperlm.compare.recipe import base_config

    def group(out: Path, *sets: str, loggers=("wandb",)) -> tuple[list[str], str]:
        opts = CompareOptions(out=out, preset="transformer-tiny", overrides=list(sets))
        opts.loggers = list(loggers) if loggers is not None else None
        t = base_config(opts, None, None).train
        return t.loggers, t.log_group

    loggers, name = group(tmp_path / "cmp")
    assert loggers == ["wandb"] and name.startswith("cmp-") and len(name) == len("cmp-") + 6
    assert group(tmp_path / "cmp")[1] == name  # the same folder, the same group
    assert group(tmp_path / "x" / "cmp")[1] != name  # another comparison, another group
    assert group(tmp_path / "cmp", "train.log_group=mine") == (["wandb"], "mine")
    assert group(tmp_path / "cmp", loggers=None) == ([], "")  # no logger: no group
    assert group(tmp_path / "cmp", "train.loggers=[tensorboard]", loggers=None)[0] == [
        "tensorboard"
    ]


@pytest.mark.slow
@needs_wandb
def test_compare_logs_each_cell_as_its_own_run_in_one_group(tmp_path):
    from taperlm.data.prepare import prepare
    from test_compare import ALLOCS, TINY

    (tmp_path / "t.txt").write_text("the cat runs over the tree and the bird sings.\n" * 300)
    prepare(str(tmp_path / "t.txt"), tmp_path / "data", "bpe:300", val_tokens=600, progress=False)
    args = ["compare", *TINY, *ALLOCS, "--seeds", "1", "--tokens", "128", "--set",
            "train.checkpoint_every=100"]  # fmt: skip
    out = tmp_path / "cmp"
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = cli_main(
            [*args, "--data", str(tmp_path / "data"), "--out", str(out), "--logger", "wandb"]
        )
    assert rc == 0, err.getvalue()
    runs = wandb_runs(tmp_path / "wandb")
    assert sorted(r.name for r in runs) == ["late-s0", "uniform-s0"]
    assert len({r.group for r in runs}) == 1 and runs[0].group.startswith("cmp-")
    assert len({r.run_id for r in runs}) == 2
    for r in runs:  # each run's values are its cell's
        cell = out / "runs" / r.name
        want = {
            rec["step"]: rec["loss"]
            for rec in read_metrics(cell / "metrics.jsonl")
            if "loss" in rec
        }
        assert {row["_step"]: row["train/loss"] for row in r.rows if "train/loss" in row} == want
