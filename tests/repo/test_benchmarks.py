"""The benchmark scripts run end to end at tiny size (`--smoke`), and the CPU fast paths they
measure (fused cross-entropy, closed-form RMSNorm, precomputed RoPE tables) compute exactly what
the plain PyTorch ops compute. No timing asserts."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_config
from taperlm.config.presets import get_preset
from taperlm.models import TaperedLM, cpu_kernels
from taperlm.models.layers import RMSNorm, Rotary, cross_entropy

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench_module():
    sys.path.insert(0, str(BENCH))
    try:
        import gpu
        import niah_speed
        import taper_overhead
        import train_vs_hf

        yield {
            "train_vs_hf": train_vs_hf,
            "taper_overhead": taper_overhead,
            "gpu": gpu,
            "niah_speed": niah_speed,
        }
    finally:
        sys.path.remove(str(BENCH))


# ---------------------------------------------------------------------------------------------
# smoke runs


def test_train_vs_hf_smoke(bench_module, tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "r.json"
    assert bench_module["train_vs_hf"].main(["--smoke", "--threads", "1", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["model"] for r in data["rows"]] == ["hf", "ours"]
    assert all(r["tokens/s"] > 0 for r in data["rows"])


def test_scale_smoke(tmp_path):
    """benchmarks/scale.py --smoke: meta init, FSDP2 (one gloo rank) with the bf16 policy, eager
    and regional compile, DCP save/load, the planner's figure: every column filled."""
    import subprocess

    out = tmp_path / "scale.json"
    r = subprocess.run(
        [sys.executable, str(BENCH / "scale.py"), "--smoke", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(x["family"], x["mode"]) for x in rows] == [
        ("transformer", "eager"),
        ("titans-mag", "eager"),
        ("transformer", "compile"),
    ]
    assert all(x["tokens/s"] > 0 and x["planned_GiB"] > 0 for x in rows)
    assert rows[2]["graphs"] >= 1 and rows[0]["dcp_save_s"] > 0 and rows[1]["dcp_load_s"] > 0
    assert rows[0]["dcp_GB"] > 0


def test_train_vs_hf_checks_equivalence(bench_module, monkeypatch):
    """The comparison refuses to run on models that are not the same function."""
    pytest.importorskip("transformers")
    m = bench_module["train_vs_hf"]
    args = m.argparse.Namespace(
        d_model=32, layers=2, heads=2, mlp_width=64, vocab=128, seq=16, batch=2
    )
    ours, hf = m.build_ours(args), m.build_hf(args)
    assert m.check_equivalent(ours, hf, args.vocab, 8) < 1e-4
    with torch.no_grad():
        ours.blocks[1].mlp.w_out.weight.add_(0.1)  # a different model from here on
    monkeypatch.setattr(m, "copy_weights", lambda a, b: None)
    with pytest.raises(SystemExit, match="logits differ"):
        m.check_equivalent(ours, hf, args.vocab, 8)


def test_taper_overhead_smoke(bench_module, tmp_path):
    out = tmp_path / "r.json"
    argv = ["--smoke", "--families", "transformer", "gated", "--json", str(out)]
    assert bench_module["taper_overhead"].main(argv) == 0
    data = json.loads(out.read_text())
    assert {r["family"] for r in data["rows"]} == {"transformer", "gated"}
    for r in data["rows"]:
        assert r["ratio (cpu)"] > 0 and r["distinct widths"] > 1


def test_niah_speed_smoke(bench_module, tmp_path):
    out = tmp_path / "r.json"
    argv = ["--smoke", "--presets", "transformer-tiny,titans-mag-tiny", "--json", str(out)]
    assert bench_module["niah_speed"].main(argv) == 0
    results = json.loads(out.read_text())["results"]
    for preset in ("transformer-tiny", "titans-mag-tiny"):
        assert results[preset]["decoding"].endswith("decoding cache")
    for r in results.values():
        assert r["lengths"]["256"]["n"] == 2 and r["lengths"]["256"]["items_per_s"] > 0


def test_step_guard_smoke(tmp_path):
    sys.path.insert(0, str(BENCH))
    try:
        import step_guard
    finally:
        sys.path.remove(str(BENCH))
    out = tmp_path / "r.json"
    assert step_guard.main(["--smoke", "--families", "transformer", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    # the copy is the weights and both AdamW moments, 12 bytes per parameter (+ step counters)
    params = sum(p.numel() for p in TaperedLM(get_preset("transformer-tiny")).parameters())
    assert 12 * params <= row["guard copy (MiB)"] * 2**20 < 12 * params + 4096
    assert row["ratio (cpu)"] > 0


def test_gpu_smoke(tmp_path):
    """benchmarks/gpu.py --smoke, every section: MFU rows (compile for the first family), the
    planner's figure and a DCP save + load under FSDP2, and uniform vs cosine through the
    trainer. A subprocess: the memory section makes a process group."""
    import subprocess

    out = tmp_path / "r.json"
    r = subprocess.run(
        [
            sys.executable,
            str(BENCH / "gpu.py"),
            "--smoke",
            "--json",
            str(out),
            "--tmp",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(out.read_text())
    seen = [(r["family"], r["taper"], r["mode"]) for r in data["rows"]]
    assert seen == [
        ("transformer", "cosine", "compile"),
        ("transformer", "cosine", "eager"),
        ("titans-mag", "cosine", "eager"),
    ]
    assert all(r["flops_per_token"] > 0 and r["tokens/s"] > 0 for r in data["rows"])
    (mem,) = data["memory"]
    assert mem["planned_GiB"] > 0 and mem["dcp_save_s"] > 0 and mem["dcp_load_s"] > 0
    assert [t["taper"] for t in data["taper"]] == ["uniform", "cosine:1.5:0.5"]
    for t in data["taper"]:
        assert t["steps"] == 4 and len(t["losses"]) == 4
        assert all(math.isfinite(x) for x in t["losses"])
    assert data["notes"] == [] and not list(tmp_path.glob("taperlm-gpu-*"))  # cleaned up


def test_families_smoke(tmp_path):
    """benchmarks/families.py --smoke: paired speed and peak-memory ratios against the first
    family, one row per preset."""
    sys.path.insert(0, str(BENCH))
    try:
        import families
    finally:
        sys.path.remove(str(BENCH))
    out = tmp_path / "f.json"
    assert families.main(["--smoke", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["preset"] for r in rows] == ["transformer-tiny", "titans-mac-tiny"]
    assert rows[0]["speed vs transformer"] == 1.0 and rows[1]["speed vs transformer"] > 0
    assert all(r["peak MiB"] > 0 and r["saved MiB"] > 0 for r in rows)


@pytest.mark.slow  # Inductor compiles a block of each family (~1 min of CPU)
def test_families_compiled_per_block_smoke(tmp_path):
    """benchmarks/families.py --compile --compile-scope blocks: every block's forward is compiled
    (as train.compile_scope blocks does) and the speed ratio is measured compiled vs compiled."""
    sys.path.insert(0, str(BENCH))
    try:
        import families
    finally:
        sys.path.remove(str(BENCH))
    out = tmp_path / "f.json"
    argv = ["--smoke", "--compile", "--compile-scope", "blocks", "--no-memory", "--json", str(out)]
    assert families.main(argv) == 0
    data = json.loads(out.read_text())
    assert data["args"]["compile_scope"] == "blocks"
    assert [r["preset"] for r in data["rows"]] == ["transformer-tiny", "titans-mac-tiny"]
    assert data["rows"][1]["speed vs transformer"] > 0


@pytest.mark.parametrize("hf", [False, True])
def test_generation_smoke(tmp_path, hf):
    """benchmarks/generation.py --smoke: cache vs recompute, and HF generate() vs ours, with
    equal tokens in every run (the script refuses otherwise)."""
    if hf:
        pytest.importorskip("transformers")
    sys.path.insert(0, str(BENCH))
    try:
        import generation
    finally:
        sys.path.remove(str(BENCH))
    out = tmp_path / "g.json"
    assert generation.main(["--smoke", "--json", str(out)] + (["--hf"] if hf else [])) == 0
    rows = json.loads(out.read_text())["rows"]
    want = {"taperlm", "hf"} if hf else {"recompute", "cache"}
    assert {r["contestant"] for r in rows} == want
    assert {r["model"] for r in rows} == {"transformer-tiny", "titans-mal-tiny"}
    assert all(r["tokens/s"] > 0 for r in rows)


def test_gpu_peak_table(bench_module):
    gpu = bench_module["gpu"]
    assert gpu.peak_flops(torch.device("cpu"), None) is None
    assert gpu.peak_flops(torch.device("cpu"), 100.0) == 100e12


# ---------------------------------------------------------------------------------------------
# CPU fast paths == plain ops


def _ce_both(logits: torch.Tensor, targets: torch.Tensor, scale: float):
    out = []
    for fn in (cross_entropy, lambda a, b: F.cross_entropy(a.flatten(0, -2), b.flatten())):
        x = logits.clone().requires_grad_()
        loss = fn(x, targets)
        (loss * scale).backward()
        out.append((loss.detach(), x.grad))
    return out


@pytest.mark.parametrize("scale", [1.0, 0.25])
@pytest.mark.parametrize("vocab", [7, 50, 3000])
def test_fused_cross_entropy_matches(scale, vocab):
    torch.manual_seed(0)
    logits = torch.randn(3, 70, vocab) * 3
    targets = torch.randint(0, vocab, (3, 70))
    targets[0, 5:9] = -100
    targets[2] = -100
    (l1, g1), (l2, g2) = _ce_both(logits, targets, scale)
    assert torch.allclose(l1, l2, atol=1e-5, rtol=1e-5)
    assert torch.allclose(g1, g2, atol=1e-7, rtol=1e-4)
    assert g1[2].abs().max() == 0  # ignored rows get no gradient


def test_fused_cross_entropy_retain_graph_and_edge_cases():
    torch.manual_seed(0)
    x = torch.randn(4, 11, requires_grad=True)
    t = torch.randint(0, 11, (4,))
    loss = cross_entropy(x, t)
    (loss * 0.5).backward(retain_graph=True)
    first = x.grad.clone()
    x.grad = None
    (loss * 2.0).backward()
    assert torch.allclose(x.grad, 4 * first)
    # Every target ignored: the same NaN as F.cross_entropy (mean over nothing).
    none = torch.full((4,), -100)
    assert torch.isnan(cross_entropy(x, none)) and torch.isnan(F.cross_entropy(x, none))
    with torch.no_grad():
        assert torch.allclose(cross_entropy(x, t), F.cross_entropy(x, t))


def test_rmsnorm_fast_path_matches():
    torch.manual_seed(0)
    norm = RMSNorm(24, eps=1e-5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 5, 24) * 4
    g = torch.randn(3, 5, 24)
    results = []
    for fast in (True, False):
        xi = x.clone().requires_grad_()
        norm.weight.grad = None
        if fast:
            y = norm(xi)
        else:
            y = F.rms_norm(xi, (24,), norm.weight, 1e-5)
        y.backward(g)
        results.append((y.detach(), xi.grad, norm.weight.grad.clone()))
    for a, b in zip(*results):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)


def test_rotary_tables_match_reference():
    rot = Rotary(8, 16, theta=100.0)
    x = torch.randn(2, 3, 5, 8)
    inv = 1.0 / (100.0 ** (torch.arange(0, 8, 2).float() / 8))
    ang = torch.outer(torch.arange(4, 9).float(), inv)
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., :4], x[..., 4:]
    ref = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    assert torch.allclose(rot(x, start=4), ref, atol=1e-6)
    long = torch.randn(1, 1, 40, 8)  # beyond the table: it grows
    assert torch.allclose(rot(long)[..., 30:, :], rot(long[..., 30:, :], start=30), atol=1e-5)


def test_model_fast_path_equals_reference_path(monkeypatch):
    """A training step's loss and every parameter gradient agree with the plain-op path."""
    cfg = tiny_config(taper="cosine", vocab_size=97, n_layers=3, mlp_width=96)
    torch.manual_seed(0)
    model = TaperedLM(cfg)
    idx = torch.randint(0, 97, (2, 20))
    tgt = idx.roll(-1, 1)
    tgt[:, -1] = -100

    def run():
        model.zero_grad(set_to_none=True)
        loss = model(idx, targets=tgt).loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    fast_loss, fast_grads = run()
    monkeypatch.setattr(cpu_kernels, "applies", lambda x: False)
    ref_loss, ref_grads = run()
    assert torch.allclose(fast_loss, ref_loss, atol=1e-6)
    for name, g in ref_grads.items():
        assert torch.allclose(fast_grads[name], g, atol=1e-6, rtol=1e-4), name


def test_prepare_scale_smoke(tmp_path, capsys):
    sys.path.insert(0, str(BENCH))
    try:
        import prepare_scale
    finally:
        sys.path.remove(str(BENCH))
    assert prepare_scale.main(["--smoke", "--work", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| 0 MB |" in out and "| 1 |" in out and "| jsonl.gz |" in out  # each table
    assert prepare_scale.parse_size("2GB") == 2 * 10**9


# ---------------------------------------------------------------------------------------------
# compare_precision.py: the numbers behind compare's defaults


def _precision_report(per_seed: list[float]) -> dict:
    """A compare report.json holding only what compare_precision reads."""
    runs = {str(s): {"tokens_per_s": 1000.0} for s in range(len(per_seed))}
    n = len(per_seed)
    mean = sum(per_seed) / n
    sd = (sum((x - mean) ** 2 for x in per_seed) / (n - 1)) ** 0.5
    from taperlm.analysis.stats import t_quantile

    h = t_quantile(0.975, n - 1) * sd / n**0.5
    diff = {"mean": mean, "std": sd, "n": n, "per_seed": per_seed, "ci": [mean - h, mean + h]}
    return {
        "meta": {
            "model": {},
            "settings": {"tokens": 4096, "val_tokens": 512, "lr": 2e-3},
        },
        "allocations": [
            {"name": "uniform", "val_loss": {"n": n, "mean": 6.0}, "per_seed": runs},
            {
                "name": "cosine-1.5-0.5",
                "val_loss": {"n": n, "mean": 6.0 + mean},
                "per_seed": runs,
                "diff_vs_uniform": {"val_loss": diff},
            },
        ],
    }


def test_compare_precision_half_width_and_prediction():
    sys.path.insert(0, str(BENCH))
    try:
        import compare_precision as cp
    finally:
        sys.path.remove(str(BENCH))
    d = [-0.03, -0.01, -0.02, -0.04, -0.025]
    row = cp.summarize(
        "c", ["--tokens", "4096"], _precision_report(d), cpu=100.0, wall=60.0, fresh=True
    )
    sd = row["sd"]
    assert row["half_width"] == pytest.approx(2.776445 * sd / 5**0.5, rel=1e-5)
    assert row["half_width"] == pytest.approx(cp.half_width(sd, 5))
    assert row["runs"] == 10 and row["cpu_s_per_run"] == pytest.approx(10.0)
    pred = cp.predict(row, target=0.005, cores=2, allocations=2)
    need = pred["seeds_for_target"]
    assert cp.half_width(sd, need) <= 0.005 < cp.half_width(sd, need - 1)
    assert pred["wall_min_for_target"] == pytest.approx(2 * need * 10.0 / 2 / 60)
    reused = cp.summarize("c", [], _precision_report(d), cpu=1.0, wall=1.0, fresh=False)
    assert reused["cpu_s"] is None and cp.predict(reused, 0.005, 2, 2) == {}
    assert "| c |" in cp.table([{**row, "prediction": pred}], 0.005, 2, 2)


def test_kv_decode_smoke(tmp_path):
    """benchmarks/kv_decode.py --smoke: every allocation decodes at equal parameters, and its
    cache tensors equal the plan's bytes (the script refuses otherwise)."""
    sys.path.insert(0, str(BENCH))
    try:
        import kv_decode
    finally:
        sys.path.remove(str(BENCH))
    out = tmp_path / "kv.json"
    assert kv_decode.main(["--smoke", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert len(set(data["params"].values())) == 1
    rows = {(r["context"], r["allocation"]): r for r in data["rows"]}
    assert rows[(32, "halved")]["kv heads"] == "2/2/2/2/2/2"
    assert rows[(32, "halved")]["cache MiB fp32"] * 2 == rows[(32, "uniform")]["cache MiB fp32"]


# ---------------------------------------------------------------------------------------------
# op counts (benchmarks/op_count.py)


def _op_count():
    sys.path.insert(0, str(BENCH))
    try:
        import op_count
    finally:
        sys.path.remove(str(BENCH))
    return op_count


class _Event:
    """The part of a torch.profiler event that op_count reads."""

    def __init__(self, name: str, *children: _Event, us: float = 0.0) -> None:
        self.name, self.cpu_children, self.cpu_parent = name, list(children), None
        self.cpu_time_total = us  # microseconds, callees included
        for c in children:
            c.cpu_parent = self


def test_count_kernels_counts_the_ops_that_do_work():
    """Views, allocations and host reads count nothing; an op counts once whether it does the
    work itself (mm, which calls resolve_conj) or through its callees (linear -> t + mm, to ->
    _to_copy -> empty + copy_); a multi-tensor op counts once; generated kernels count."""
    E = _Event
    events = [
        E("aten::linear", E("aten::t", E("aten::transpose", E("aten::as_strided"))),
          E("aten::matmul", E("aten::mm", E("aten::resolve_conj")))),
        E("aten::view"),
        E("aten::to", E("aten::_to_copy", E("aten::empty_strided"), E("aten::copy_"))),
        E("aten::empty"),
        E("aten::_local_scalar_dense"),
        E("Optimizer.step#AdamW.step", E("aten::_fused_adamw_", E("aten::add"), E("aten::mul"))),
        E("CompiledFunction", E("graph_0_cpp_fused_add_mul_0"), E("aten::bmm")),
        E("autograd::engine::evaluate_function: MulBackward0", E("MulBackward0", E("aten::mul"))),
        E("detach"),
    ]  # fmt: skip
    flat = []
    stack = list(events)
    while stack:
        e = stack.pop()
        flat.append(e)
        stack.extend(e.cpu_children)
    total, names = _op_count().count_kernels(flat)
    assert names == {
        "aten::mm": 1,
        "aten::copy_": 1,
        "aten::_fused_adamw_": 1,
        "generated kernel": 1,
        "aten::bmm": 1,
        "aten::mul": 1,
    }
    assert total == 6


def test_time_by_kind_splits_a_step_without_losing_or_double_counting_time():
    """An op of a kind takes its whole time (bmm with the copy_ it calls); any other op keeps
    its self time and passes the rest down; the kinds add up to the top-level events' time."""
    E = _Event
    events = [
        E("aten::linear", E("aten::t", us=1000),
          E("aten::matmul", E("aten::mm", E("aten::resolve_conj", us=100), us=7000), us=8000),
          us=10000),
        E("CompiledFunction", E("graph_0_cpp_fused_add_mul_0", us=5000),
          E("aten::bmm", E("aten::copy_", us=2000), us=6000),
          E("aten::_scaled_dot_product_flash_attention_for_cpu", us=4000), us=20000),
        E("Optimizer.step#AdamW.step", E("aten::_fused_adamw_", us=3000), us=3500),
    ]  # fmt: skip
    flat, stack = [], list(events)
    while stack:
        e = stack.pop()
        flat.append(e)
        stack.extend(e.cpu_children)
    out = _op_count().time_by_kind(flat)
    assert out == pytest.approx(
        {"bmm": 6.0, "mm": 7.0, "attention": 4.0, "generated": 5.0, "other": 11.5, "total": 33.5}
    )
    assert sum(v for k, v in out.items() if k != "total") == pytest.approx(out["total"])


def test_families_profile_smoke(tmp_path):
    """benchmarks/families.py --profile: one step per model split by kind, the kinds adding up
    to the step; Titans' memory recurrence shows as batched GEMMs, Transformer++ has none."""
    sys.path.insert(0, str(BENCH))
    try:
        import families
    finally:
        sys.path.remove(str(BENCH))
    out = tmp_path / "fam.json"
    argv = ["--smoke", "--families", "transformer", "titans-mag", "--no-memory", "--profile"]
    assert families.main([*argv, "--json", str(out)]) == 0
    rows = {r["preset"]: r["profile ms"] for r in json.loads(out.read_text())["rows"]}
    for prof in rows.values():
        parts = sum(v for k, v in prof.items() if k != "total")
        assert prof["total"] > 0 and parts == pytest.approx(prof["total"], rel=1e-6)
    assert rows["titans-mag-tiny"]["bmm"] > 0 and rows["transformer-tiny"]["bmm"] == 0
    assert rows["transformer-tiny"]["mm"] > 0


def test_op_count_440m_layer_is_the_first_layer_of_every_family_at_440m():
    """The `440m-layer` shape of every family is one block with exactly the parameter shapes of
    the first block of `{family}-440m` (every per-layer size: MLP width, heads, KV heads, Hope's
    level widths, Titans' memory widths), built on the meta device."""
    import torch

    from taperlm.config.presets import get_preset
    from taperlm.models import TaperedLM

    op_count = _op_count()

    def shapes(block):
        return [(n, tuple(p.shape)) for n, p in block.named_parameters()]

    for family in op_count.FAMILIES:
        cfg, seq = op_count.build(family, "440m-layer", 2048)
        with torch.device("meta"):
            one = TaperedLM(cfg)
            full = TaperedLM(get_preset(f"{family}-440m"))
        assert cfg.n_layers == 1 and len(one.blocks) == 1 and seq == 2048, family
        assert shapes(one.blocks[0]) == shapes(full.blocks[0]), family


def test_op_count_smoke(tmp_path):
    """benchmarks/op_count.py --smoke (eager): kernels and dispatched ATen ops of one training
    step of transformer-tiny; views make the ATen count larger."""
    out = tmp_path / "ops.json"
    assert _op_count().main(["--smoke", "--modes", "eager", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert (row["family"], row["shape"], row["mode"]) == ("transformer", "tiny", "eager")
    assert 0 < row["kernels"] < row["aten ops"] and row["vs transformer"] == 1.0
    assert row["top"]["aten::mm"] > 0


@pytest.mark.slow
def test_op_count_compiled(tmp_path):
    """The compiled count: Inductor's generated kernels are seen, and they are fewer ops than
    eager's."""
    out = tmp_path / "ops.json"
    assert _op_count().main(["--smoke", "--json", str(out)]) == 0
    eager, compiled = json.loads(out.read_text())["rows"]
    assert compiled["mode"] == "compile" and compiled["top"].get("generated kernel", 0) > 0
    assert compiled["kernels"] < eager["kernels"]


@pytest.mark.slow
def test_titans_compile_smoke(tmp_path):
    """benchmarks/titans_compile.py compiles a 1-layer titans-mag at 2 chunk steps (this tree
    only) and records its warm-up and kernels (~1-3 min of Inductor)."""
    import subprocess

    out = tmp_path / "tc.json"
    cmd = [sys.executable, str(BENCH / "titans_compile.py"), "--only", "after", "--cases",
           "m1-32", "--cap", "900", "--json", str(out)]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    (row,) = json.loads(out.read_text())["rows"]
    assert row["tree"] == "after" and row["chunks"] == 2 and "error" not in row, row
    assert row["kernels"] > 0 and row["warmup_s"] > 0


def test_prune_smoke(tmp_path):
    """benchmarks/prune.py --smoke: source, pruning at two sizes and three shapes with every score,
    healing by distillation and scratch runs over two seeds, speed, the report and its tables;
    a rerun reads every finished cell back and writes the same tables."""
    import fault_harness
    from taperlm.cli import main as cli_main

    sys.path.insert(0, str(BENCH))
    try:
        import prune
    finally:
        sys.path.remove(str(BENCH))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(fault_harness.corpus_text(12000, 0), encoding="utf-8")
    data = tmp_path / "data"
    assert (
        cli_main(["prepare", "--source", str(corpus), "--tokenizer", "bpe:512", "--out", str(data)])
        == 0
    )
    out, png = tmp_path / "prune.json", tmp_path / "prune.png"
    argv = [
        "--smoke",
        "--data",
        str(data),
        "--work",
        str(tmp_path / "w"),
        "--json",
        str(out),
        "--plot",
        str(png),
    ]
    assert prune.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["seeds_done"] == {"heal": 2, "scratch": 2} and len(result["rows"]) == 8
    for row in result["rows"]:
        assert row["healed"]["n"] == 2
        if row["shape"] != "scratch":
            assert set(row["after_prune"]) == {"act", "flap", "weight_act"}
    first = prune.markdown(result)
    assert prune.main(argv) == 0  # resumed: every cell read back
    assert prune.markdown(json.loads(out.read_text())) == first
    assert png.stat().st_size > 1000


# ---------------------------------------------------------------------------------------------
# the behaviour snapshot's pieces that need no commands run (the snapshot itself takes minutes)


def test_behaviour_snapshot_normalises_and_compares(tmp_path, capsys):
    sys.path.insert(0, str(BENCH))
    try:
        import behaviour_snapshot as snap
    finally:
        sys.path.remove(str(BENCH))
    from taperlm.cli import build_parser, subcommand_parser

    # subcommands are found in the top-level help as argparse prints it
    top = build_parser(only="").format_help()
    assert snap.subcommands(top)[:3] == ["plan", "prepare", "train"]
    plan = subcommand_parser(build_parser(only="plan"), "plan")
    assert snap.subcommands(plan.format_help()) == []
    roots = [("/tmp/xyz", "<WORK>")]
    line = "done: 6,426 tokens/s in 0.4 min (0.2 s), 2026-12-02 13:39:58 UTC, /tmp/xyz/run"
    assert snap.normalise_text(line, roots) == (
        "done: <RATE> tokens/s in <TIME> min (<TIME> s), <DATE>, <WORK>/run"
    )
    table = "| a | tokens/s | loss |\n|---|---|---|\n| x | 3,052 | 4.69 |"
    assert snap.normalise_text(table, roots).splitlines()[-1] == "| x | <dropped> | 4.69 |"
    value = {"loss": 4.5, "wall_s": 3.2, "times": {"val_s": 1}, "path": "/tmp/xyz/a"}
    assert snap.normalise_json(value, roots) == {
        "loss": 4.5, "wall_s": "<dropped>", "times": "<dropped>", "path": "<WORK>/a"
    }  # fmt: skip
    a, b = tmp_path / "a", tmp_path / "b"
    for d, loss in ((a, "4.5"), (b, "4.5")):
        d.mkdir()
        (d / "train-x.txt").write_text(f"loss {loss}\n")
    assert snap.compare(a, b) == 0
    (b / "train-x.txt").write_text("loss 4.6\n")
    assert snap.compare(a, b) == 1
    assert "train-x.txt: differs" in capsys.readouterr().out


def test_gpu_command_keeps_what_it_measured_when_a_part_fails(bench_module, tmp_path, monkeypatch):
    """A GPU lease is minutes long: a row or a section that raises is a note in the results and
    the command goes on (2026-12-04, a DCP error in the memory section lost the mfu rows before
    it), and the report on disk is rewritten after each section, so a run killed in a later
    section (here an interrupt) keeps the sections before it."""
    gpu = bench_module["gpu"]
    real_run_config = gpu.run_config

    def run_config(cfg, mode, args, device):
        if mode == "compile":
            raise RuntimeError("inductor\nexploded")
        return real_run_config(cfg, mode, args, device)

    def memory_section(args, device, clock):
        raise RuntimeError("no storage map")

    monkeypatch.setattr(gpu, "run_config", run_config)
    monkeypatch.setattr(gpu, "memory_section", memory_section)
    monkeypatch.setattr(gpu, "taper_section", lambda args, device, clock: [{"taper": "uniform"}])
    out = tmp_path / "r.json"
    argv = ["--smoke", "--families", "transformer", "--modes", "compile", "eager"]
    assert gpu.main([*argv, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [(r["mode"], r["tokens/s"] > 0) for r in data["rows"]] == [("eager", True)]
    assert data["memory"] == [] and data["taper"] == [{"taper": "uniform"}]
    assert data["notes"] == [
        "transformer-tiny cosine compile: failed (RuntimeError: inductor exploded)",
        "section memory: failed (RuntimeError: no storage map)",
    ]

    def interrupted(args, device, clock):
        raise KeyboardInterrupt

    monkeypatch.setattr(gpu, "taper_section", interrupted)
    out.unlink()
    with pytest.raises(KeyboardInterrupt):
        gpu.main([*argv, "--json", str(out)])
    data = json.loads(out.read_text())  # written after the memory section, before the kill
    assert [r["mode"] for r in data["rows"]] == ["eager"] and "taper" in data


def test_scale_keeps_its_rows_when_one_fails(tmp_path, monkeypatch):
    """benchmarks/scale.py: a row that raises is a note and the next row runs; the report holds
    every finished row after each one."""
    sys.path.insert(0, str(BENCH))
    try:
        import scale
    finally:
        sys.path.remove(str(BENCH))
    out = tmp_path / "scale.json"
    seen_on_disk = []

    def run_row(family, taper, mode, args, device, info):
        if out.exists():
            seen_on_disk.append(len(json.loads(out.read_text())["rows"]))
        if family == "titans-mag":
            raise ValueError("chunk loop")
        return {"tokens/s": 1.0, "flops_per_token": 1, "planned_GiB": 1.0}

    monkeypatch.setattr(scale, "init_one_rank", lambda device: None)
    monkeypatch.setattr(scale, "run_row", run_row)
    monkeypatch.setattr(torch.distributed, "destroy_process_group", lambda: None)
    assert scale.main(["--smoke", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["row"] for r in data["rows"]] == [1, 3]
    assert data["notes"] == ["2. titans-mag-tiny cosine eager: failed (ValueError: chunk loop)"]
    assert seen_on_disk == [1, 1]  # row 1 was on disk before rows 2 and 3 ran
