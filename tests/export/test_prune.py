"""`taperlm prune`: exact widths and budgets after pruning, the top-scored units kept, the pruned
model equal to the source with those rows and columns selected, and the result a normal run
(eval, generate, export, novelty, train continue it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import fault_harness
from conftest import raises_naming, tiny_config
from taperlm.checkpoint.loading import load_run_model
from taperlm.cli import main as cli_main
from taperlm.compress import prune as P
from taperlm.compress.importance import SCORES, UnitStats, collect, top_units, unit_scores
from taperlm.config import apply_overrides, run_config_from_dict, to_dict
from taperlm.config.budget import total_params
from taperlm.config.presets import get_preset
from taperlm.errors import ConfigError
from taperlm.models import TaperedLM
from taperlm.spec.solver import solve_sizes
from taperlm.spec.taper import TaperSpec
from taperlm.training.loop import train

SHAPES = ["uniform", "cosine:1.5:0.5", "linear:1.25:0.75", "groups:1.5,1.0,0.5"]


def _source(seed: int = 0, **kw) -> TaperedLM:
    torch.manual_seed(seed)
    return TaperedLM(tiny_config(n_layers=6, mlp_width=256, **kw)).eval()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    ("params", "of"), [(0.5, "non-embedding"), (0.6, "total"), (110_000, "total")]
)
def test_widths_and_budget_are_exact(shape, params, of):
    """The pruned config's widths are the exact solver's at baseline W (multiple_of steps), its
    parameters those of the uniform model of width W (budget, numel), nearest the target."""
    src = tiny_config(n_layers=6, mlp_width=256)
    width = P.target_width(src, params, of)
    spec = TaperSpec.parse(shape)
    cfg = P.pruned_config(src, width, spec)
    assert width % spec.multiple_of == 0
    assert cfg.mlp_widths == solve_sizes(spec, 6, width) and sum(cfg.mlp_widths) == 6 * width
    uniform = P.pruned_config(src, width, TaperSpec.parse("uniform"))
    assert total_params(cfg) == total_params(uniform) == TaperedLM(cfg).num_params()
    # nearest: no other multiple of multiple_of is closer to the target
    have = P.counted_params(src, of)
    target = params * have if params < 1 else params
    step = spec.multiple_of
    got = P.counted_params(cfg, of)
    for other in (width - step, width + step):
        if other > 0:
            alt = P.counted_params(P.pruned_config(src, other, TaperSpec.parse("uniform")), of)
            assert abs(got - target) <= abs(alt - target)
    # everything but the MLP widths is the source's
    assert {
        k: v for k, v in to_dict(cfg).items() if k not in ("mlp_width", "mlp_widths", "taper")
    } == {k: v for k, v in to_dict(src).items() if k not in ("mlp_width", "mlp_widths", "taper")}


def test_sizes_that_cannot_be_pruned_are_refused():
    src = tiny_config(n_layers=6, mlp_width=256)
    with raises_naming(ConfigError, "--params 1e+09", f"{total_params(src):,}"):
        P.target_width(src, 10**9)
    with raises_naming(ConfigError, "--params 0.01", "--params-of non-embedding"):
        P.target_width(src, 0.01)  # the embeddings alone are more
    width = P.target_width(src, 0.95, "non-embedding")
    with raises_naming(ConfigError, "--taper cosine:1.9:0.1", "layer 0", "256", "--params"):
        P.pruned_config(src, width, TaperSpec.parse("cosine:1.9:0.1"))


def test_unit_scores_follow_their_definitions():
    a = torch.tensor([[1.0, -2.0, 0.0], [3.0, 2.0, 0.5], [-1.0, 0.0, 0.5]])
    stats = UnitStats.zeros(3)
    stats.add(a[:2])
    stats.add(a[2:])
    mlp = _source().blocks[0].mlp
    with torch.no_grad():
        mlp.w_out.weight.copy_(torch.arange(32 * 256, dtype=torch.float32).reshape(32, 256) / 1000)
    stats = UnitStats(
        *(
            torch.cat((t, torch.zeros(253, dtype=torch.float64)))
            for t in (stats.abs_sum, stats.sum, stats.sq_sum)
        ),
        count=3,
    )
    col = mlp.w_out.weight.double().norm(dim=0)[:3]
    x = a.double()
    torch.testing.assert_close(unit_scores(stats, mlp, "act")[:3], x.abs().mean(0))
    torch.testing.assert_close(unit_scores(stats, mlp, "flap")[:3], x.var(0) * col**2)
    torch.testing.assert_close(unit_scores(stats, mlp, "weight_act")[:3], x.norm(dim=0) * col)


def test_collect_records_each_layers_hidden_activations():
    model = _source()
    x = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    stats = collect(model, [x])
    seen = []
    h = model.embed(x)
    for block in model.blocks:  # the reference: the block's own computation, step by step
        h = h + block.mixer(block.mixer_norm(h))
        gate, up = block.mlp.w_in(block.mlp_norm(h)).chunk(2, dim=-1)
        seen.append(F.silu(gate) * up)
        h = h + block.mlp.w_out(seen[-1])
    for s, a in zip(stats, seen):
        assert s.count == 32
        torch.testing.assert_close(s.abs_sum, a.detach().abs().double().sum((0, 1)))
        torch.testing.assert_close(s.sq_sum, a.detach().double().pow(2).sum((0, 1)))


@pytest.mark.parametrize("score", SCORES)
def test_kept_units_are_the_top_scored_and_the_model_is_the_selection(score):
    model = _source()
    x = torch.randint(0, 64, (4, 32), generator=torch.Generator().manual_seed(2))
    stats = collect(model, [x])
    src_cfg = model.config
    cfg = P.pruned_config(
        src_cfg, P.target_width(src_cfg, 0.5, "non-embedding"), TaperSpec.parse("cosine:1.5:0.5")
    )
    pruned = P.prune(model, cfg, stats, score)
    for layer, (keep, width) in enumerate(zip(pruned.keep, cfg.mlp_widths)):
        scores = unit_scores(stats[layer], model.blocks[layer].mlp, score).tolist()
        ranked = sorted(range(len(scores)), key=lambda j: (-scores[j], j))
        assert keep.tolist() == sorted(ranked[:width])  # the top `width`, in the source's order
        assert min(scores[j] for j in keep.tolist()) >= max(
            (scores[j] for j in range(len(scores)) if j not in set(keep.tolist())), default=-1
        )
        assert pruned.model.blocks[layer].mlp.width == width
    # the reference: the source's own forward with each MLP's dropped units masked to zero
    masks = []
    for keep, block in zip(pruned.keep, model.blocks):
        m = torch.zeros(block.mlp.width)
        m[keep] = 1.0
        masks.append(
            block.mlp.w_out.register_forward_pre_hook(lambda mod, args, m=m: (args[0] * m,))
        )
    try:
        with torch.no_grad():
            ref = model(x).logits
    finally:
        for h in masks:
            h.remove()
    with torch.no_grad():
        got = pruned.model(x).logits
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    # and every tensor but the MLPs' is the source's, bit for bit
    src_state, state = model.state_dict(), pruned.model.state_dict()
    for k, v in state.items():
        if ".mlp." not in k:
            assert torch.equal(v, src_state[k]), k


def test_top_units_breaks_ties_by_index():
    assert top_units(torch.tensor([1.0, 3.0, 3.0, 0.0, 3.0]), 2).tolist() == [1, 2]


# ----------------------------------------------------------------------------------------------
# the command: a normal run dir

TINY = [
    "model.n_layers=4",
    "model.d_model=32",
    "model.n_heads=2",
    "model.mlp_width=256",
    "model.vocab_size=512",
    "model.context_length=64",
    "train.seq_len=32",
    "train.micro_batch_size=4",
    "train.batch_tokens=256",
    "train.tokens=2048",
    "train.warmup_tokens=256",
    "train.lr=0.003",
    "train.eval_tokens=128",
    "train.checkpoint_every=0",
]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> tuple[Path, Path]:
    """(data dir, a trained 8-step uniform run)."""
    root = tmp_path_factory.mktemp("prune")
    src = root / "corpus.txt"
    src.write_text(fault_harness.corpus_text(12000, 0), encoding="utf-8")
    data = root / "data"
    assert (
        cli_main(["prepare", "--source", str(src), "--tokenizer", "bpe:512", "--out", str(data)])
        == 0
    )
    d = {"model": to_dict(get_preset("transformer-tiny", resolve=False))}
    apply_overrides(d, TINY)
    cfg = run_config_from_dict(d).resolve()
    cfg.data.dir = str(data)
    train(cfg, root / "base", progress=False)
    return data, root / "base"


def test_prune_writes_a_normal_run(base, tmp_path, capsys):
    _, run = base
    out = tmp_path / "pruned"
    argv = [
        "prune",
        str(run),
        "--out",
        str(out),
        "--params",
        "0.5",
        "--params-of",
        "non-embedding",
        "--taper",
        "cosine:1.5:0.5",
        "--calibration-tokens",
        "512",
        "--json",
    ]
    assert cli_main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    model, cfg = load_run_model(out)
    src, src_cfg = load_run_model(run)
    width = P.target_width(src_cfg.model, 0.5, "non-embedding")
    assert cfg.model.mlp_widths == solve_sizes(TaperSpec.parse("cosine:1.5:0.5"), 4, width)
    assert [b.mlp.width for b in model.blocks] == cfg.model.mlp_widths
    assert model.num_params() == total_params(cfg.model) == report["total_params"]
    record = json.loads((out / "prune.json").read_text())
    for layer, keep in enumerate(record["kept_units"]):
        w_in = src.state_dict()[f"blocks.{layer}.mlp.w_in.weight"]
        gate, up = w_in.chunk(2)
        assert torch.equal(model.blocks[layer].mlp.w_in.weight, torch.cat((gate[keep], up[keep])))
        assert torch.equal(
            model.blocks[layer].mlp.w_out.weight, src.blocks[layer].mlp.w_out.weight[:, keep]
        )
    assert report["val_loss"] > 0 and report["source_val_loss"] > 0
    # every command reads it like any run
    assert cli_main(["eval", str(out), "--tasks", "val"]) == 0
    assert (
        cli_main(["generate", str(out), "--prompt", "the", "--max-new-tokens", "3", "--seed", "0"])
        == 0
    )
    assert cli_main(["novelty", str(out), "--tokens", "64", "--seq-len", "32", "--json"]) == 0
    assert cli_main(["export", str(out), "--out", str(tmp_path / "hf")]) == 0
    capsys.readouterr()
    assert cli_main(["train", "--out", str(out), "--no-progress", "--stop-after-steps", "1"]) == 0
    assert "step 1/8" in capsys.readouterr().out
    # healed from it, then pruned again: the new run starts afresh (no start weights, no teacher)
    healed, again = tmp_path / "healed", tmp_path / "again"
    argv = ["train", "--init-from", str(out), "--distill-from", str(run), "--out", str(healed)]
    assert cli_main([*argv, "--set", "train.tokens=256", "--no-progress"]) == 0
    argv = ["prune", str(healed), "--out", str(again), "--taper", "cosine:1.5:0.5"]
    assert cli_main([*argv, "--params", "0.8", "--params-of", "non-embedding"]) == 0
    _, cfg = load_run_model(again)
    assert cfg.train.init_from == cfg.train.distill_from == ""


def test_prune_to_the_measured_novelty(base, tmp_path, capsys):
    _, run = base
    out = tmp_path / "novelty"
    argv = [
        "prune",
        str(run),
        "--out",
        str(out),
        "--params",
        "0.6",
        "--params-of",
        "non-embedding",
        "--taper",
        "novelty",
        "--calibration-tokens",
        "512",
        "--score",
        "flap",
    ]
    assert cli_main(argv) == 0
    _, cfg = load_run_model(out)
    spec = cfg.model.taper
    assert spec.schedule == "novelty" and len(spec.rho_mlp) == 4
    assert cfg.model.mlp_widths == solve_sizes(spec, 4, cfg.model.mlp_width)


def test_prune_honours_taperlm_set_after_set(base, tmp_path, capsys, monkeypatch):
    """prune's run config comes from the one assembly like every command's: $TAPERLM_SET applies
    after --set (it wins), and may not change the pruned model either (refused naming it)."""
    _, run = base
    out = tmp_path / "env"
    argv = ["prune", str(run), "--out", str(out), "--params", "0.8", "--calibration-tokens", "256"]
    monkeypatch.setenv("TAPERLM_SET", "train.lr=0.0005 train.log_every=3")
    assert cli_main([*argv, "--set", "train.lr=0.002", "--set", "train.eval_tokens=64"]) == 0
    _, cfg = load_run_model(out)
    assert (cfg.train.lr, cfg.train.log_every, cfg.train.eval_tokens) == (0.0005, 3, 64)
    for setting in ("model.d_model=64", "d_model=64"):
        monkeypatch.setenv("TAPERLM_SET", setting)
        assert cli_main(["prune", str(run), "--out", str(tmp_path / "x"), "--params", "0.8"]) == 2
        err = capsys.readouterr().err
        assert "TAPERLM_SET" in err and "train: and data: settings only" in err, err


def test_prune_refuses_what_it_cannot_do(base, tmp_path, capsys):
    _, run = base
    for extra, message in [
        (["--params", "0.01"], "below the smallest model"),
        (
            ["--params", "0.9", "--params-of", "non-embedding", "--taper", "cosine:1.9:0.1"],
            "pruning only removes units",
        ),
        (["--params", "0.5", "--taper", "nonsense"], "--taper 'nonsense'"),
        (["--params", "0.5", "--set", "model.d_model=64"], "train: and data: settings only"),
        # a budget past the train split would cycle over it (issue 63): refused before measuring
        (["--params", "0.5", "--calibration-tokens", "1000000000"], "more than the train split"),
    ]:
        out = tmp_path / f"x{len(message)}"
        assert cli_main(["prune", str(run), "--out", str(out), *extra]) == 2
        assert message in capsys.readouterr().err
