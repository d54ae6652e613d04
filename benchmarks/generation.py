"""Greedy generation speed: incremental decoding vs recomputing the prefix every token, and the
exported Hugging Face model's `generate()` vs `taperlm generate`.

    python benchmarks/generation.py --threads 1                # cache vs recompute, 256 and 1024
    python benchmarks/generation.py --hf --new-tokens 256      # HF generate() vs ours, cached
    python benchmarks/generation.py --smoke                    # seconds

Models: the `*-tiny` presets with random weights, context 2048 (so no window slides during the
run), batch 1, a prompt of 16 random tokens, no EOS. tokens/s = new tokens / process CPU seconds
of the whole call (prefill included). Contestants of one model run interleaved over rounds
(rotating order); the tables give medians and the paired ratio. The greedy tokens of every run
are checked to be equal (the benchmark refuses to compare different outputs).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_info, median, paired_ratio, table, write_json
from outputs import output_file
from taperlm.config.presets import get_preset
from taperlm.models import TaperedLM
from taperlm.models.generation import SamplingConfig, generate_tokens

PRESETS = ["transformer-tiny", "titans-mac-tiny", "titans-mag-tiny", "titans-mal-tiny"]
HF_PRESETS = ["transformer-tiny", "gated-tiny", "hope-tiny", *PRESETS[1:]]


def build(preset: str, context: int, layers: int | None = None) -> TaperedLM:
    cfg = get_preset(preset, resolve=False)
    fields: dict[str, Any] = {"context_length": context}
    if layers:
        fields |= {"n_layers": layers, "mlp_widths": None}
    torch.manual_seed(0)
    return TaperedLM(dataclasses.replace(cfg, **fields).resolve()).eval()


def ours(model: TaperedLM, prompt: list[int], n: int, use_cache: bool) -> Callable[[], list[int]]:
    cfg = SamplingConfig(max_new_tokens=n, temperature=0, use_cache=use_cache)
    return lambda: list(generate_tokens(model, prompt, cfg))


def hf_generate(hf: Any, prompt: list[int], n: int) -> Callable[[], list[int]]:
    ids = torch.tensor([prompt])
    kw = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None)

    def run() -> list[int]:
        with torch.no_grad():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), **kw)
        return out[0, len(prompt) :].tolist()

    return run


def compare(
    name: str, n: int, fns: dict[str, Callable[[], list[int]]], rounds: int
) -> list[dict[str, Any]]:
    """Time the contestants in alternating rounds (rotating order) and check that every run of
    every contestant generated the same tokens (the benchmark refuses to compare different
    outputs)."""
    names = list(fns)
    times: dict[str, dict[str, list[float]]] = {k: {"cpu": [], "wall": []} for k in names}
    first: list[int] | None = None
    for r in range(rounds):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            t0, c0 = time.perf_counter(), time.process_time()
            tokens = fns[k]()
            times[k]["cpu"].append(time.process_time() - c0)
            times[k]["wall"].append(time.perf_counter() - t0)
            if first is None:
                first = tokens
            elif tokens != first:
                raise SystemExit(f"{name}: {k} generates other tokens than {names[0]}")
    base = names[0]
    rows = []
    for k in names:
        cpu = median(times[k]["cpu"])
        rows.append(
            {
                "model": name,
                "new tokens": n,
                "contestant": k,
                "cpu s": cpu,
                "tokens/s": n / cpu,
                f"speed vs {base}": paired_ratio(times[base]["cpu"], times[k]["cpu"]),
                "wall s": median(times[k]["wall"]),
                "cpu_times": times[k]["cpu"],
                "wall_times": times[k]["wall"],
            }
        )
        print(f"{name} {n} {k}: {n / cpu:.1f} tokens/s", file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", nargs="*")
    ap.add_argument("--new-tokens", nargs="*", type=int, default=[256, 1024])
    ap.add_argument("--rounds", type=int, default=3, help="rounds for runs of <= 256 tokens")
    ap.add_argument("--long-rounds", type=int, default=1, help="rounds for longer runs")
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--hf", action="store_true", help="HF generate() vs ours instead")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument(
        "--json", type=output_file, help="results file (default results/generation[_hf].json)"
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    presets = args.presets or (HF_PRESETS if args.hf else PRESETS)
    lengths, layers = args.new_tokens, None
    if args.smoke:
        presets, lengths, layers = presets[:1] + presets[-1:], [8], 2
        args.rounds = args.long_rounds = 1
    gen = torch.Generator().manual_seed(0)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for preset in presets:
            model = build(preset, context=2048, layers=layers)
            prompt = torch.randint(0, model.config.vocab_size, (args.prompt,), generator=gen)
            prompt = prompt.tolist()
            if args.hf:
                from transformers import AutoModelForCausalLM

                from taperlm.hf.export import export_model

                out = export_model(model, Path(tmp) / preset)
                hf = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True).eval()
            for n in lengths:
                rounds = args.rounds if n <= 256 else args.long_rounds
                if args.hf:
                    fns = {
                        "taperlm": ours(model, prompt, n, True),
                        "hf": hf_generate(hf, prompt, n),
                    }
                else:
                    fns = {
                        "recompute": ours(model, prompt, n, False),
                        "cache": ours(model, prompt, n, True),
                    }
                t0 = time.perf_counter()
                rows += compare(preset, n, fns, rounds)
                print(f"  ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    base = "taperlm" if args.hf else "recompute"
    cols = ["model", "new tokens", "contestant", "cpu s", "tokens/s", f"speed vs {base}", "wall s"]
    print(f"greedy generation, batch 1, prompt {args.prompt}, {args.threads} thread(s)")
    print(table(rows, cols))
    if not args.smoke or args.json:
        name = "generation_hf" if args.hf else "generation"
        path = write_json(
            name, {"machine": machine_info(), "args": vars(args), "rows": rows}, args.json
        )
        print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
