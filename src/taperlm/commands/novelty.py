"""`taperlm novelty MODEL`: layer-wise novelty rho_block / rho_mlp per layer (docs/novelty.md)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Literal

from taperlm.errors import ConfigError, DataError
from taperlm.evaluation.locate import wikitext_test
from taperlm.files.io import atomic_write_json
from taperlm.files.outfiles import R_FILE, json_mark
from taperlm.runtime.device import resolve_device
from taperlm.spec.domains import (
    MAX_BATCH,
    MAX_CONTEXT,
    MAX_COUNT,
    MAX_TOKENS,
    choices,
    input_path,
    number,
    output_path,
    up_to,
)

# --dtype: the precision a Hugging Face model's weights are loaded in
LoadDtype = Literal["fp32", "bf16", "fp16"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        type=input_path(text=True),
        metavar="MODEL",
        help="a run dir (config.yaml + checkpoints/), a Hugging Face model dir (e.g. a "
        "`taperlm export`), or hf:NAME for any Hub causal LM (e.g. hf:gpt2; needs internet)",
    )
    add_measure_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--plot",
        type=output_path("file"),
        help="write both curves vs depth as a PNG" + R_FILE,
    )
    parser.add_argument(
        "--out", type=output_path("file"), help="also write the JSON result to FILE" + R_FILE
    )


def add_measure_arguments(parser: argparse.ArgumentParser) -> None:
    """How a model's novelty is measured (shared with `taperlm allocate`)."""
    parser.add_argument(
        "--data",
        type=input_path(),
        help="text file to measure on (default: WikiText-2 raw test from $TAPERLM_EVAL_DATA or "
        "../shared/data, the paper's choice)",
    )
    parser.add_argument(
        "--tokens",
        type=number(int, up_to(MAX_TOKENS, 2)),
        default=2048,
        help="input tokens taken from the text (default 2048)",
    )
    parser.add_argument(
        "--seq-len",
        type=number(int, up_to(MAX_CONTEXT, 2)),
        help="window length (default: the model's context, at most --tokens)",
    )
    parser.add_argument(
        "--batch-size",
        type=number(int, up_to(MAX_BATCH)),
        default=4,
        help="windows per forward pass",
    )
    parser.add_argument(
        "--include-first",
        action="store_true",
        help="also measure the first token of each window (excluded by default: it attends "
        "only to itself and acts as an attention sink in trained models)",
    )
    parser.add_argument(
        "--step",
        type=number(int, up_to(MAX_COUNT, 0)),
        help="run dirs: use checkpoint STEP (default: newest)",
    )
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (default: auto)")
    parser.add_argument("--dtype", choices=choices(LoadDtype), help="load the weights as")
    parser.add_argument(
        "--layers", help="dotted path of the decoder-layer ModuleList (default: auto-detect)"
    )
    parser.add_argument("--mlp", help="name of each layer's MLP submodule (default: auto-detect)")
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="run the model's own code (config auto_map) of hf:NAME or a model folder; off by "
        "default (taperlm exports never need it)",
    )


def run(args: argparse.Namespace) -> int:
    result, data, n_ids = measure_model(args.model, args, progress=not args.json)
    out = result.to_dict()
    out.update(model=args.model, data=str(data), input_tokens=n_ids)
    if args.out is not None:
        atomic_write_json(args.out, json_mark(out, "novelty"), indent=2)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(format_result(result, str(data), n_ids))
    if args.plot:
        from taperlm.analysis.plots import plot_novelty  # lazy: numpy, only for --plot

        path = plot_novelty(
            {result.name: result}, args.plot, title=f"Layer-wise novelty: {Path(data).name}"
        )
        if not args.json:
            print(f"plot written to {path}")
    return 0


def measure_model(model: str, args: argparse.Namespace, progress: bool = True):
    """Load MODEL and measure its novelty with the options of `add_measure_arguments`;
    returns (NoveltyResult, what the text is, input tokens)."""
    import torch  # lazy: --help stays torch-free

    from taperlm.analysis.novelty import measure  # lazy: torch; --help stays torch-free
    from taperlm.analysis.sources import load_model  # lazy: torch; --help stays torch-free

    device = resolve_device(args.device)
    loaded = load_model(model, device, args.dtype, args.trust_remote_code, args.step)
    seq_len = args.seq_len or min(loaded.context_length or args.tokens, args.tokens)
    if loaded.context_length and seq_len > loaded.context_length:
        raise ConfigError(
            f"--seq-len {seq_len} exceeds the model's context of {loaded.context_length}"
        )
    data, ids = _text(args, loaded)
    try:
        result = measure(
            loaded.model,
            torch.tensor(ids),
            seq_len=seq_len,
            batch_size=args.batch_size,
            skip_first=not args.include_first,
            layers_path=args.layers,
            mlp_name=args.mlp,
            name=loaded.name,
            progress=progress,
        )
    except ValueError as err:
        raise ConfigError(str(err)) from None
    return result, data, len(ids)


def _text(args: argparse.Namespace, loaded) -> tuple[str, list[int]]:
    """(what the text is, its first --tokens ids): --data, else WikiText-2 test (the paper's
    choice), else for our runs the validation split of the run's data, as compare does."""
    from taperlm.analysis.sources import (  # lazy: torch; --help stays torch-free
        first_tokens,
        first_val_tokens,
    )

    if args.data is not None:
        return str(args.data), first_tokens(args.data, loaded.encode, args.tokens)
    try:
        wikitext = wikitext_test()
    except DataError as err:
        if loaded.data_dir is None:
            raise DataError(
                f"{err}; or measure a training run, whose validation text is used"
            ) from None
        val = loaded.data_dir / "val.bin"
        if not args.json:
            print(
                f"note: WikiText-2 test not found; measuring on the first {args.tokens} tokens "
                f"of the run's validation split ({val})",
                file=sys.stderr,
            )
        return str(val), first_val_tokens(loaded.data_dir, args.tokens, "--tokens", loaded.run_dir)
    return str(wikitext), first_tokens(wikitext, loaded.encode, args.tokens)


def _fmt(x: float) -> str:
    return "nan" if not math.isfinite(x) else f"{x:+.3f}"


def format_result(result, data: str, input_tokens: int) -> str:
    first = "included" if not result.skip_first else "excluded"
    lines = [
        f"novelty of {result.name} on {data}",
        f"{input_tokens} input tokens in {result.n_windows} window(s) of <= {result.seq_len}; "
        f"first token of each window {first}; {result.n_tokens} tokens measured per layer",
        f"layers: {result.layers_path}[i].{result.mlp_name}",
        "",
        f"{'layer':>5}  {'mlp_width':>9}  {'rho_block mean ± std':>22}  {'rho_mlp mean ± std':>20}",
    ]
    for i, (b, m) in enumerate(zip(result.rho_block, result.rho_mlp)):
        width = "?" if result.mlp_widths[i] is None else str(result.mlp_widths[i])
        lines.append(
            f"{i:>5}  {width:>9}  {_fmt(b.mean):>12} ± {b.std:6.3f}  {_fmt(m.mean):>10} ± {m.std:6.3f}"
        )
    lines += [
        "",
        f"Pearson r with depth: rho_block {_fmt(result.pearson_block)}, "
        f"rho_mlp {_fmt(result.pearson_mlp)}",
        "(per-token cosines in fp32, mean ± sample std over tokens; paper: GPT-2 rho_mlp r = "
        "0.49-0.71)",
    ]
    return "\n".join(lines)
