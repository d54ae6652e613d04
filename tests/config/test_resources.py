"""Class 4 of issue 26: resources are checked before they are spent.

Every size, depth and count -- each integer field of every config section and each integer
option of every command, found by introspection -- has a finite upper end a real model can
reach, so an absurd value (`model.n_layers=100000000` used to make `taperlm plan` grow to 20 GB
over ten minutes) is refused at once with its domain, and no count can overflow. The memory a
model needs (weights; for training also gradients and AdamW state) is computed from its config
and refused with the numbers before anything is allocated.
"""

from __future__ import annotations

import contextlib
import signal

import pytest

import test_domains as T
from conftest import raises_naming
from taperlm.cli import main as cli_main
from taperlm.config.presets import get_preset
from taperlm.errors import ResourceError
from taperlm.spec.domains import Number

ABSURD = 10**30  # beyond every integer domain, beyond int64 and a float's exact range
FAST_S = 60  # generous: the refusal takes well under a second; a walk into the work takes minutes


@contextlib.contextmanager
def deadline(seconds: int):
    """Fail (instead of hanging the suite) when the block runs past `seconds`."""

    def expire(signum, frame):
        raise TimeoutError(f"not refused within {seconds} s: the work started")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


INT_FIELDS = [(w, n, depth, d) for w, n, tp, depth, d in T.config_fields() if tp is int]
INT_OPTIONS = [
    (cmd, a) for cmd, a in T.numeric_options() if isinstance(a.type, Number) and a.type.kind is int
]


@pytest.mark.unit
def test_the_walks_see_the_sizes():
    names = {f"{w}.{n}" for w, n, _, _ in INT_FIELDS}
    assert {"model.n_layers", "model.d_model", "model.vocab_size", "train.tokens"} <= names
    assert {"model.titans.chunk_size", "model.hope.levels", "model.mlp_widths"} <= names
    assert {(c, a.option_strings[0]) for c, a in INT_OPTIONS} >= {
        ("prepare", "--shard-tokens"),
        ("eval", "--batch-size"),
        ("compare", "--jobs"),
    }


@pytest.mark.unit
@pytest.mark.parametrize(
    ("where", "name", "depth", "dom"), INT_FIELDS, ids=[f"{w}.{n}" for w, n, _, _ in INT_FIELDS]
)
def test_every_integer_field_has_a_finite_upper_end(where, name, depth, dom):
    assert dom is not None and dom.hi < float("inf") and dom.hi_closed, f"{where}.{name}: {dom}"
    assert dom.hi < 2**63  # an int64 holds every value inside


@pytest.mark.unit
@pytest.mark.parametrize(
    ("cmd", "action"), INT_OPTIONS, ids=[f"{c} {a.option_strings[0]}" for c, a in INT_OPTIONS]
)
def test_every_integer_option_has_a_finite_upper_end(cmd, action):
    dom = action.type.domain
    assert dom.hi < 2**63 and dom.hi_closed, f"{cmd} {action.option_strings[0]}: {dom.spec}"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("where", "name", "depth", "dom"), INT_FIELDS, ids=[f"{w}.{n}" for w, n, _, _ in INT_FIELDS]
)
def test_absurd_size_is_refused_fast(where, name, depth, dom, tmp_path, capsys):
    preset = T._preset_of(where)
    value, suffix = T._with_first_leaf(T._current(preset, where, name), depth, ABSURD)
    key = f"{where}.{name}"
    with deadline(FAST_S):
        rc = cli_main(["plan", "--preset", preset, "--set", f"{key}={T._yaml(value)}"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("taperlm plan: error: ") and err.count("\n") == 1, err
    assert f"{key}{suffix} must be <= {dom.hi:.0f}, got {ABSURD}\n" in err


@pytest.mark.unit
@pytest.mark.parametrize(
    ("cmd", "action"), INT_OPTIONS, ids=[f"{c} {a.option_strings[0]}" for c, a in INT_OPTIONS]
)
def test_absurd_count_option_is_refused_fast(cmd, action, tmp_path, capsys):
    option = action.option_strings[0]
    with deadline(FAST_S), T._no_exit():
        rc = cli_main([*T._required_argv(cmd, tmp_path / "w"), f"{option}={ABSURD}"])
    err = capsys.readouterr().err
    assert rc == 2, err
    dom = action.type.domain
    assert err == f"taperlm {cmd}: error: {option} must be <= {dom.hi:.0f}, got {ABSURD}\n"
    assert not (tmp_path / "w").exists()


@pytest.mark.unit
def test_issue_example_plan_with_a_hundred_million_layers(capsys):
    with deadline(FAST_S):
        rc = cli_main(["plan", "--preset", "transformer-tiny", "--set", "model.n_layers=100000000"])
    assert rc == 2
    assert "model.n_layers must be <= 1024, got 100000000" in capsys.readouterr().err


def test_a_model_too_large_to_train_is_refused_before_any_allocation(tmp_path, capsys, monkeypatch):
    """A 550B-parameter model (inside every domain) on this machine: refused with the numbers
    before the model is built (building it is made to fail) or the data is read."""
    import taperlm.training.model as training_model

    def never(*a, **k):
        raise AssertionError("the model was built before the memory check")

    monkeypatch.setattr(training_model, "build_on_meta", never)
    big = ["--set", "model.d_model=16384", "--set", "model.n_heads=128"]
    big += ["--set", "model.mlp_width=65536", "--set", "model.n_layers=128"]
    out = tmp_path / "run"
    with deadline(FAST_S):
        rc = cli_main(["train", "--preset", "transformer-tiny", *big, "--data", str(tmp_path / "d"),
                       "--out", str(out), "--no-progress"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("taperlm train: error: training this transformer model needs at least ")
    assert "B parameters x 16 bytes (weight, gradient, AdamW moments)" in line
    assert "GiB available; use a smaller model" in line
    assert not out.exists()


@pytest.mark.unit
def test_fsdp_shards_divide_the_floor():
    from taperlm.config.budget import memory_floor, total_params

    cfg = get_preset("transformer-440m")
    one, _ = memory_floor(cfg, training=True)
    eight, what = memory_floor(cfg, training=True, shards=8)
    assert one > 16 * total_params(cfg) and eight < one / 7 and "/ 8 shards" in what
    weights, _ = memory_floor(cfg)
    assert weights < one / 3


def test_building_a_model_checks_the_memory_it_needs(monkeypatch):
    """Every command that builds a model (eval, generate, export, novelty, compare workers, the
    trainer's whole-model paths) goes through TaperedLM: with less free memory than its weights
    it stops with the numbers; on the meta device nothing is checked."""
    import torch

    import taperlm.runtime.device as device
    from taperlm.models import TaperedLM

    cfg = get_preset("transformer-tiny")
    monkeypatch.setattr(device, "available_memory", lambda d="cpu": 1 << 20)
    with raises_naming(ResourceError, "transformer", "0.0 GiB", "cpu"):
        TaperedLM(cfg)
    with torch.device("meta"):
        TaperedLM(cfg)
    monkeypatch.setattr(device, "available_memory", lambda d="cpu": None)  # unknown: no check
    TaperedLM(cfg)


@pytest.mark.unit
def test_available_memory_reads_this_machine():
    from taperlm.runtime.device import available_memory

    have = available_memory("cpu")
    assert have is None or 0 < have < 2**50
    assert available_memory("mps") is None
