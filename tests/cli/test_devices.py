"""Class 8 of issue 16: device and resource errors are one clear line, never torch's traceback.

Devices: every command that takes a device (found by walking the parsers for `--device`, plus
`train.device` of train and compare) is given each kind of bad device -- a name torch does not
know, a malformed index, a kind taperlm does not run on, CUDA where there is none, and a CUDA
index beyond the devices present (with one GPU simulated). Resources: an allocation that cannot
be served while starting a run, in the middle of training, while loading a model and inside
a command's own work.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import fault_harness as H
from conftest import assert_naming
from taperlm.checkpoint import store as ckpt
from taperlm.cli import COMMANDS, build_parser, subcommand_parser
from taperlm.cli import main as cli_main


def _device_commands() -> list[str]:
    parser = build_parser()
    return [
        c
        for c in COMMANDS
        if any("--device" in a.option_strings for a in subcommand_parser(parser, c)._actions)
    ]


BAD_DEVICES = {
    "unknown_name": ("gpu", "is not a device; use auto, cpu, cuda or cuda:N"),
    "malformed_index": ("cuda:x", "is not a device"),
    "unsupported_kind": ("meta", "taperlm runs on cpu, cuda or mps"),
    "no_cuda": ("cuda", "no CUDA device is available"),
    "index_beyond_count": ("cuda:7", "there is no such CUDA device (available: cpu, cuda)"),
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("devices")
    data = H.prepare_data(root / "data")
    run = root / "run"
    assert cli_main([*H.train_argv(data, run), "--stop-after-steps", "2"]) == 0
    return data, run


def _one_gpu(monkeypatch) -> None:
    """Pretend one CUDA device is present (the checks only ask torch how many there are)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


CASES = [(c, k) for c in [*_device_commands(), "train", "compare"] for k in BAD_DEVICES]


@pytest.mark.parametrize(("cmd", "kind"), CASES, ids=[f"{c}-{k}" for c, k in CASES])
def test_bad_device_is_one_clear_line(cmd, kind, trained, tmp_path, capsys, monkeypatch):
    data, run = trained
    device, needle = BAD_DEVICES[kind]
    if kind == "index_beyond_count":
        _one_gpu(monkeypatch)
    elif kind == "no_cuda":  # also on a machine with a GPU
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "out"
    if cmd in ("train", "compare"):
        if kind != "no_cuda":  # train.device's declared domain refuses the name itself
            needle = f"train.device must be one of auto, cpu, cuda, got {device!r}"
        base = H.train_argv(data, out) if cmd == "train" else H.compare_argv(data, out)
        argv = [*base, "--set", f"train.device={device}"]
    else:
        extra = {
            "novelty": ["--data", str(H.HERE)],
            "allocate": ["--data", str(H.HERE)],  # measures the run's novelty first
            "eval": ["--tasks", "val"],
            "prune": ["--out", str(out)],
        }.get(cmd, [])
        source = ["--from"] if cmd == "allocate" else []
        argv = [cmd, *source, str(run), "--device", device, *extra]
    before = H.snapshot(run)
    rc = cli_main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith(f"taperlm {cmd}: error: ") and err.count("\n") == 1, err
    assert needle in err, err
    assert not out.exists() and H.snapshot(run) == before


HUGE = ("model.vocab_size=16777216", "model.d_model=131072")  # 4.5e12 parameters


def test_a_run_that_needs_more_memory_than_there_is(trained, tmp_path, capsys, monkeypatch):
    """A size that cannot be allocated, where the free memory is unknown (so the up-front
    check cannot refuse it): one line naming the allocation and what to change, and no run
    dir left behind."""
    import taperlm.runtime.device

    monkeypatch.setattr(taperlm.runtime.device, "available_memory", lambda device="cpu": None)
    data, _ = trained
    out = tmp_path / "run"
    rc = cli_main(H.train_argv(data, out, *HUGE))
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    # what ran out (the run starting, on cpu, this model), the allocator's words, the fix
    assert_naming(err, "memory", "starting the run", "cpu", "transformer", "can't allocate memory")
    assert "smaller model" in err
    assert not out.exists()


def test_a_run_that_cannot_fit_is_refused_before_allocating(trained, tmp_path, capsys):
    """The same run where the free memory is known: refused with the numbers before anything
    is allocated (tests/config/test_resources.py proves the order)."""
    data, _ = trained
    out = tmp_path / "run"
    rc = cli_main(H.train_argv(data, out, *HUGE))
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert re.search(
        r"error: training this transformer model needs at least [\d,.]+ GiB \([\d,.]+B "
        r"parameters x 16 bytes \(weight, gradient, AdamW moments\) \+ \d+ MiB RoPE tables\) "
        r"but cpu has [\d,.]+ GiB available; use a smaller model",
        err,
    ), err
    assert not out.exists()


def test_out_of_memory_in_the_middle_of_training(trained, tmp_path, capsys, monkeypatch):
    """The device runs out of memory at step 3 (simulated with torch's own error type): the
    error names the step and the fix, and the checkpoints before it are intact."""
    from taperlm.training import loop

    data, _ = trained
    real = loop.Trainer.forward_backward

    def forward_backward(self, batches):
        if self.step + 1 == 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return real(self, batches)

    monkeypatch.setattr(loop.Trainer, "forward_backward", forward_backward)
    out = tmp_path / "run"
    rc = cli_main(H.train_argv(data, out))
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert_naming(err, "step 3", "cpu", "CUDA out of memory", "20.00 GiB")
    assert_naming(err, "train.micro_batch_size", "step_00000002")
    assert [s for s, _ in ckpt.list_checkpoints(out)] == [1, 2]


@pytest.mark.parametrize("cmd", ["eval", "generate", "novelty", "export"])
def test_loading_a_model_too_large_for_memory(cmd, trained, tmp_path, capsys, monkeypatch):
    """Building the model of a run fails to allocate: every command that loads one says so."""
    import taperlm.models

    _, run = trained
    real = taperlm.models.TaperedLM.__init__

    def huge(self, cfg):
        real(self, cfg)
        torch.empty(10**13)  # the CPU allocator refuses at once

    monkeypatch.setattr(taperlm.models.TaperedLM, "__init__", huge)
    argv = {
        "eval": ["eval", str(run), "--tasks", "val", "--device", "cpu"],
        "generate": ["generate", str(run), "--device", "cpu"],
        "novelty": ["novelty", str(run), "--data", str(H.HERE), "--device", "cpu"],
        "export": ["export", str(run), "--out", str(tmp_path / "e")],
    }[cmd]
    if cmd == "export":
        pytest.importorskip("transformers")
    rc = cli_main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert_naming(err, "memory", "can't allocate memory")


def test_out_of_memory_inside_a_command_is_one_line(trained, capsys, monkeypatch):
    """Any other allocation failure under the CLI (here: scoring) is still one line."""
    from taperlm.evaluation import suite

    def boom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(suite, "run_val", boom)
    _, run = trained
    rc = cli_main(["eval", str(run), "--tasks", "val", "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1, err
    assert_naming(err, "CUDA out of memory", "2.00 GiB", "--batch-size")
