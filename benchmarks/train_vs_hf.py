"""Training throughput: taperlm `transformer` vs `transformers.LlamaForCausalLM`, same shape.

Both models get the identical configuration (uniform widths, vocabulary, d_model, layers, heads,
context, untied embeddings, RMSNorm eps, RoPE theta, no dropout, SDPA attention for HF) and the
same weights (copied across), which is checked first: equal parameter counts and equal logits.
Then one training step (forward + backward + AdamW) of each is timed in alternating rounds in
this process; we report median tokens/s and the paired ratio ours/HF.

    python benchmarks/train_vs_hf.py                      # defaults below, 2 threads, eager
    python benchmarks/train_vs_hf.py --threads 1 --compile
    python benchmarks/train_vs_hf.py --smoke              # tiny, seconds

Contestants: `hf` (LlamaForCausalLM, eager PyTorch + SDPA), `ours` (TaperedLM eager); with
`--ablate` also `ours-plain` (our CPU fast paths off: plain ATen cross-entropy and RMSNorm), with
`--compile` also `ours+compile` and `hf+compile` (torch.compile of the whole model).

Timing: CPU seconds of the process per step (robust to other processes on a shared machine when
torch uses one thread) and wall seconds; "speedup" is HF's time / the contestant's, paired by
round.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import interleaved, machine_info, median, paired_ratio, table, write_json
from outputs import output_file
from taperlm.config import ModelConfig
from taperlm.models import TaperedLM, cpu_kernels
from taperlm.spec.taper import TaperSpec


def build_ours(args: argparse.Namespace) -> TaperedLM:
    cfg = ModelConfig(
        family="transformer",
        vocab_size=args.vocab,
        d_model=args.d_model,
        n_layers=args.layers,
        n_heads=args.heads,
        mlp_width=args.mlp_width,
        context_length=args.seq,
        taper=TaperSpec(schedule="uniform"),
        tie_embeddings=False,
        norm_eps=1e-6,
        rope_theta=10000.0,
    ).resolve()
    return TaperedLM(cfg)


def build_hf(args: argparse.Namespace) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.d_model,
        intermediate_size=args.mlp_width,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        max_position_embeddings=args.seq,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
        attention_dropout=0.0,
        attention_bias=False,
        mlp_bias=False,
        use_cache=False,
    )
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg)


@torch.no_grad()
def copy_weights(ours: TaperedLM, hf: torch.nn.Module) -> None:
    """Load our weights into the HF model (fused QKV and gate/up split into HF's matrices)."""
    d = ours.config.d_model
    hf.model.embed_tokens.weight.copy_(ours.embed.weight)
    hf.lm_head.weight.copy_(ours.lm_head.weight)
    hf.model.norm.weight.copy_(ours.norm.weight)
    for blk, layer in zip(ours.blocks, hf.model.layers):
        q, k, v = blk.mixer.qkv.weight.split([d, d, d], dim=0)
        layer.self_attn.q_proj.weight.copy_(q)
        layer.self_attn.k_proj.weight.copy_(k)
        layer.self_attn.v_proj.weight.copy_(v)
        layer.self_attn.o_proj.weight.copy_(blk.mixer.out.weight)
        gate, up = blk.mlp.w_in.weight.chunk(2, dim=0)
        layer.mlp.gate_proj.weight.copy_(gate)
        layer.mlp.up_proj.weight.copy_(up)
        layer.mlp.down_proj.weight.copy_(blk.mlp.w_out.weight)
        layer.input_layernorm.weight.copy_(blk.mixer_norm.weight)
        layer.post_attention_layernorm.weight.copy_(blk.mlp_norm.weight)


def check_equivalent(ours: TaperedLM, hf: torch.nn.Module, vocab: int, seq: int) -> float:
    """Equal parameter counts and (after copying weights) equal logits; returns max |diff|."""
    n_ours = sum(p.numel() for p in ours.parameters())
    n_hf = sum(p.numel() for p in hf.parameters())
    if n_ours != n_hf:
        raise SystemExit(f"parameter counts differ: ours {n_ours:,} vs HF {n_hf:,}")
    copy_weights(ours, hf)
    idx = torch.randint(0, vocab, (2, seq))
    with torch.no_grad():
        a = ours(idx).logits
        b = hf(input_ids=idx).logits
    diff = (a - b).abs().max().item()
    if diff > 1e-4:
        raise SystemExit(f"logits differ by {diff:.2e} after copying weights; not the same model")
    return diff


@contextlib.contextmanager
def plain_ops() -> Iterator[None]:
    """Turn off our CPU fast paths (fused cross-entropy, closed-form RMSNorm) for a while: the
    model then runs on the plain ATen ops, as before those were written (ablation)."""
    saved = cpu_kernels.applies
    cpu_kernels.applies = lambda x: False
    try:
        yield
    finally:
        cpu_kernels.applies = saved


def make_step(model: torch.nn.Module, kind: str, x: torch.Tensor, y: torch.Tensor, fused: bool):
    """One forward + backward + AdamW step, in the way each library is normally used."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=fused or None)
    fwd = model

    def step() -> None:
        with plain_ops() if kind == "ours-plain" else contextlib.nullcontext():
            if kind.startswith("ours"):
                loss = fwd(x, targets=y).loss
            else:  # HF shifts the labels itself
                loss = fwd(input_ids=x, labels=x).loss
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--mlp-width", type=int, default=768)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps", type=int, default=2, help="steps per contestant per round")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--compile", action="store_true", help="also time torch.compile'd models")
    p.add_argument("--ablate", action="store_true", help="also time ours on plain ATen ops")
    p.add_argument("--fused-adamw", action="store_true", help="AdamW(fused=True) for both")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, 2 rounds (for tests)")
    p.add_argument(
        "--json", type=output_file, default=None, help="results file (default benchmarks/results/)"
    )
    args = p.parse_args(argv)
    if args.smoke:
        args.d_model, args.layers, args.heads, args.mlp_width = 32, 2, 2, 64
        args.vocab, args.seq, args.batch = 128, 16, 2
        args.rounds, args.steps, args.warmup = 2, 1, 1
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    ours = build_ours(args)
    hf = build_hf(args)
    diff = check_equivalent(ours, hf, args.vocab, min(args.seq, 32))
    n_params = sum(p.numel() for p in ours.parameters())

    x = torch.randint(0, args.vocab, (args.batch, args.seq))
    y = torch.full_like(x, -100)
    y[:, :-1] = x[:, 1:]  # the same T-1 predictions HF makes from labels=x
    steps: dict[str, Any] = {
        "hf": make_step(hf, "hf", x, y, args.fused_adamw),
        "ours": make_step(ours, "ours", x, y, args.fused_adamw),
    }
    if args.ablate:
        plain = build_ours(args)
        plain.load_state_dict(ours.state_dict())
        steps["ours-plain"] = make_step(plain, "ours-plain", x, y, args.fused_adamw)
    if args.compile:
        steps["ours+compile"] = make_step(
            torch.compile(build_ours(args)), "ours", x, y, args.fused_adamw
        )
        steps["hf+compile"] = make_step(torch.compile(build_hf(args)), "hf", x, y, args.fused_adamw)
    print(
        f"params {n_params:,} (equal), max |logit diff| {diff:.1e}; "
        f"batch {args.batch} x seq {args.seq}, {args.threads} threads, fp32",
        flush=True,
    )
    times = interleaved(
        steps,
        rounds=args.rounds,
        steps_per_round=args.steps,
        warmup=args.warmup,
        on_round=lambda r: print(f"  round {r + 1}/{args.rounds}", end="\r", flush=True),
    )
    print()
    tokens = args.batch * args.seq
    rows = []
    hf_t = times["hf"]
    for name, t in times.items():
        rows.append(
            {
                "model": name,
                "wall ms": 1e3 * median(t["wall"]),
                "cpu ms": 1e3 * median(t["cpu"]),
                "tokens/s": tokens / median(t["wall"]),
                "tokens/cpu-s": tokens / median(t["cpu"]),
                "speedup (wall)": paired_ratio(hf_t["wall"], t["wall"]),
                "speedup (cpu)": paired_ratio(hf_t["cpu"], t["cpu"]),
            }
        )
    print(table(rows, list(rows[0])))
    result = {
        "benchmark": "train_vs_hf",
        "machine": machine_info(),
        "shape": {
            k: getattr(args, k)
            for k in ("d_model", "layers", "heads", "mlp_width", "vocab", "seq", "batch")
        },
        "params": n_params,
        "fused_adamw": args.fused_adamw,
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "rows": rows,
        "times_s": times,
    }
    name = "train_vs_hf" + ("_smoke" if args.smoke else f"_t{args.threads}")
    print(f"wrote {write_json(name, result, args.json)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
