"""`taperlm eval RUN --tasks LIST`: validation perplexity, the paper's zero-shot suite and
RULER's single needle-in-a-haystack tasks (lm-evaluation-harness conventions), printed as the
paper's table and/or JSON."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from taperlm.checkpoint.loading import check_tokenizer, load_any, resolve_data_dir, run_root
from taperlm.data.identity import check_run_data
from taperlm.errors import ConfigError, DataError
from taperlm.evaluation.harness import write_task_dir
from taperlm.evaluation.locate import eval_data_dir
from taperlm.evaluation.niah import DEFAULT_HAYSTACK, DEFAULT_LENGTHS, load_haystack, parse_lengths
from taperlm.evaluation.record import SkippedTask
from taperlm.evaluation.registry import (
    has_local_files,
    needs_haystack,
    task_names,
    zero_shot_tasks,
)
from taperlm.files.io import atomic_write_text
from taperlm.files.outfiles import R_FILE, json_mark
from taperlm.runtime.device import resolve_device
from taperlm.spec.domains import (
    MAX_BATCH,
    MAX_CONTEXT,
    MAX_COUNT,
    choices,
    input_path,
    number,
    output_path,
    up_to,
)

TASK_HELP = (
    "auto (default: val + every task of the suite whose files are found locally), or "
    f"comma-separated: paper (= val + the zero-shot tasks), {', '.join(task_names('paper'))}; "
    f"niah (= {', '.join(task_names('niah'))}: RULER S-NIAH at --niah-lengths); "
    "all (= paper + niah)"
)

# --source: the task files on disk, or the Hugging Face datasets lm-eval downloads
EvalSource = Literal["local", "hf"]
# --dtype: exact fp32, or bf16 autocast on GPU
EvalDtype = Literal["fp32", "bf16"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run",
        nargs="?",
        type=input_path(),
        help="run directory of `taperlm train` (or a checkpoint dir, or a `taperlm export` dir)",
    )
    _add_task_arguments(parser)
    _add_niah_arguments(parser)
    _add_compute_arguments(parser)
    _add_output_arguments(parser)


def _add_task_arguments(parser: argparse.ArgumentParser) -> None:
    """Which tasks, on which data, how many items."""
    parser.add_argument("--tasks", default="auto", help=TASK_HELP)
    parser.add_argument(
        "--data-dir",
        type=input_path(),
        help="folder with the eval files laid out like ../shared/data (default: $TAPERLM_EVAL_DATA, "
        "else ../shared/data beside the checkout or the working directory)",
    )
    parser.add_argument(
        "--source",
        choices=choices(EvalSource),
        default="local",
        help="local files (default) or the Hugging Face datasets lm-eval downloads",
    )
    parser.add_argument(
        "--limit",
        type=number(int, up_to(MAX_COUNT)),
        help="first N items per task (val: N windows; NIAH: per length)",
    )


def _add_niah_arguments(parser: argparse.ArgumentParser) -> None:
    """RULER S-NIAH: lengths, prose, extrapolation."""
    parser.add_argument(
        "--niah-lengths",
        default=",".join(map(str, DEFAULT_LENGTHS)),
        help="NIAH sequence lengths in tokens, comma-separated (default: the paper's 4K,8K,16K; "
        "e.g. 256,512,1024 for small models)",
    )
    parser.add_argument(
        "--niah-haystack",
        type=input_path(text=True),
        default=DEFAULT_HAYSTACK,
        help="prose of niah_single_2/3: python-docs (default: the Python language reference "
        "that ships with Python, pydoc_data.topics), wikitext (the WikiText-2 test text of "
        "--data-dir), a .txt/.jsonl file or folder, default (the built-in corpus), or hf:NAME "
        "(RULER's essays: hf:baber/paul_graham_essays)",
    )
    parser.add_argument(
        "--niah-extrapolate",
        action="store_true",
        help="also evaluate NIAH lengths beyond the model's context_length (the paper's 8K/16K "
        "columns for 4K models); without it they are skipped with the reason",
    )


def _add_compute_arguments(parser: argparse.ArgumentParser) -> None:
    """Batch, window, checkpoint, device, precision."""
    parser.add_argument(
        "--batch-size",
        type=number(int, up_to(MAX_BATCH)),
        default=16,
        help="sequences per forward pass",
    )
    parser.add_argument(
        "--max-length",
        type=number(int, up_to(MAX_CONTEXT, 2)),
        help="context window for scoring (default: the model's context_length)",
    )
    parser.add_argument(
        "--step",
        type=number(int, up_to(MAX_COUNT, 0)),
        help="evaluate checkpoint STEP (default: newest)",
    )
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument(
        "--dtype",
        choices=choices(EvalDtype),
        default="fp32",
        help="bf16 autocast on GPU (default fp32, exact)",
    )


def _add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """Table or JSON, files, per-item records, lm-eval task YAMLs."""
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument(
        "--out", type=output_path("file"), help="also write the JSON results to FILE" + R_FILE
    )
    parser.add_argument(
        "--samples",
        action="store_true",
        help="include per-item log-likelihoods (NIAH: generations and scores) in the JSON",
    )
    parser.add_argument(
        "--write-lm-eval-tasks",
        type=output_path("dir"),
        metavar="DIR",
        help="write lm-eval task YAMLs + normalized data for the local files to DIR and exit "
        "(then: lm_eval --include_path DIR --tasks taperlm_piqa,...)",
    )


def parse_tasks(text: str) -> list[str]:
    from taperlm.evaluation.suite import parse_task_list  # lazy: --help stays torch-free

    groups = {"paper": task_names("paper"), "niah": task_names("niah"), "all": task_names()}
    out = parse_task_list(text, groups["all"], "--tasks", groups=groups)
    if not out:
        raise ConfigError(f"--tasks is empty; choose from {TASK_HELP}")
    return out


def auto_tasks(data_dir: Path | None, source: str, notes: list[str]) -> list[str]:
    """`--tasks auto`: the validation perplexity and every zero-shot task of the paper's suite
    that can run here (all of them with --source hf; with local files, those whose files are in
    `data_dir`); a note names the others and how to get them."""
    suite = zero_shot_tasks()
    if source == "hf":
        return ["val", *suite]
    have = [t for t in suite if has_local_files(t, data_dir)]
    missing = [t for t in suite if t not in have]
    if missing:
        where = f"in {data_dir}" if data_dir is not None else "(no evaluation data folder)"
        notes.append(
            f"zero-shot tasks skipped, their files are not found {where}: {', '.join(missing)}. "
            "Evaluate them with --tasks paper --source hf (downloads the datasets from the "
            "Hugging Face Hub) or --data-dir DIR (a folder laid out like ../shared/data)"
        )
    return ["val", *have]


def _is_niah(task: str) -> bool:
    return task in task_names("niah")


def run(args: argparse.Namespace) -> int:
    from taperlm.evaluation.runner import evaluate  # lazy: --help stays torch-free

    data_dir = args.data_dir or eval_data_dir()
    auto_notes: list[str] = []
    if args.tasks.strip() == "auto":
        tasks = auto_tasks(data_dir, args.source, auto_notes)
    else:
        tasks = parse_tasks(args.tasks)
    if any(_is_niah(t) for t in tasks):
        args.niah_lengths = parse_lengths(args.niah_lengths, "--niah-lengths")
    if args.write_lm_eval_tasks:
        return _write_lm_eval_tasks(args, tasks, data_dir)
    if args.run is None:
        raise ConfigError("give the RUN directory to evaluate (or --write-lm-eval-tasks DIR)")
    device = resolve_device(args.device)
    model, tokenizer, run_config = load_any(args.run, step=args.step, device=device)
    _check_niah_lengths(args, tasks, model.config.context_length)
    options = _options(args, model, device, data_dir, run_config)
    zero_shot = [t for t in tasks if t != "val" and not _is_niah(t)]
    if zero_shot and args.source == "local" and data_dir is None:
        raise DataError(
            "no evaluation data found: pass --data-dir DIR (laid out like ../shared/data), set "
            "TAPERLM_EVAL_DATA, or use --source hf"
        )
    haystack = _check_niah_inputs(args, tasks, model, tokenizer, data_dir)
    options = replace(options, haystack=lambda: haystack)
    done = evaluate(model, tokenizer, tasks, options, None if args.json else _show)
    notes = done.notes + auto_notes
    if not done.results:
        raise DataError("nothing to evaluate: " + "; ".join(notes))
    meta = _meta(args, device, data_dir, options.max_length, model, notes)
    _report(args, done.results, notes, meta)
    return 0


def _show(res: Any) -> None:
    """One line per task as it finishes (not with --json)."""
    shown = ", ".join(f"{k} {v:.4g}" for k, v in res.metrics.items())
    print(f"{res.task}: {shown} (n={res.n}, {res.seconds:.1f}s)", file=sys.stderr)


def _check_niah_lengths(args: argparse.Namespace, tasks: list[str], context: int) -> None:
    """Stop before any work when no NIAH length fits the model (lengths past it are skipped)."""
    from taperlm.evaluation.suite import niah_lengths  # lazy: --help stays torch-free

    if not any(_is_niah(t) for t in tasks):
        return
    if not niah_lengths(args.niah_lengths, context, args.niah_extrapolate)[0]:
        raise ConfigError(
            f"--niah-lengths {','.join(map(str, args.niah_lengths))}: every length is longer "
            f"than the model's context_length {context}; give lengths <= {context} or pass "
            "--niah-extrapolate"
        )


def _check_niah_inputs(args: argparse.Namespace, tasks: list[str], model, tokenizer, data_dir):
    """The S-NIAH haystack (None when no task hides its needle in prose), loaded and checked
    with everything else the S-NIAH tasks need before any task runs."""
    from taperlm.evaluation.suite import check_niah_inputs  # lazy: --help stays torch-free

    niah_tasks = [t for t in tasks if _is_niah(t)]
    if not niah_tasks:
        return None
    haystack = None
    if any(needs_haystack(t) for t in niah_tasks):
        haystack = _haystack(args, data_dir)
    check_niah_inputs(
        model, tokenizer, niah_tasks, args.niah_lengths, haystack, args.niah_extrapolate
    )
    return haystack


def _write_lm_eval_tasks(args: argparse.Namespace, tasks: list[str], data_dir: Path | None) -> int:
    if any(_is_niah(t) for t in tasks):
        print(
            "note: lm-eval builds the NIAH tasks itself (niah_single_1..3 with --metadata "
            "'{\"max_seq_lengths\": [...]}'); nothing is written for them"
        )
    out = write_task_dir(
        args.write_lm_eval_tasks,
        data_dir,
        [t for t in tasks if t != "val" and not _is_niah(t)],
        source=args.source,
        limit=args.limit,
    )
    print(
        f"wrote lm-eval tasks to {out}; run e.g.\n  lm_eval --model hf --model_args "
        f"pretrained=EXPORT_DIR,trust_remote_code=True --include_path {out} "
        "--tasks taperlm_piqa,taperlm_hellaswag --batch_size 16"
    )
    return 0


def _options(args: argparse.Namespace, model, device: str, data_dir, run_config):
    """The runner's options from the command line (the scoring window checked here)."""
    import torch  # lazy: --help stays torch-free

    from taperlm.evaluation.runner import EvalOptions  # lazy: --help stays torch-free

    max_length = args.max_length or model.config.context_length
    if max_length < 2:
        raise ConfigError(f"--max-length must be >= 2, got {max_length}")
    return EvalOptions(
        max_length=max_length,
        batch_size=args.batch_size,
        device=device,
        dtype=torch.bfloat16 if args.dtype == "bf16" else None,
        limit=args.limit,
        data_dir=data_dir,
        source=args.source,
        niah_lengths=args.niah_lengths,
        niah_extrapolate=args.niah_extrapolate,
        val_tokens=lambda: _val_tokens(args, run_config),
        keep_items=args.samples,
    )


def _val_tokens(args: argparse.Namespace, run_config) -> tuple[Any, str]:
    """The run's validation shard as token ids, and its folder; SkippedTask (a note) when the
    model has no run data dir and val was not asked for explicitly."""
    import torch  # lazy: --help stays torch-free

    from taperlm.data.loader import open_split  # lazy: --help stays torch-free

    root = run_root(Path(args.run))
    run_data = resolve_data_dir(root, run_config) if run_config else None
    if run_data is None:
        if "val" in [t.strip() for t in args.tasks.split(",")]:
            raise DataError(
                f"val: {args.run} has no data dir with a validation shard (data.dir in its "
                "config.yaml); evaluate a training run or drop val from --tasks"
            )
        raise SkippedTask("val skipped: the model has no run data dir")
    check_tokenizer(root, run_data)
    why = check_run_data(root, run_data, ("val",))
    if why:
        raise DataError(
            f"val: the data dir {run_data} of run {root} changed since the run was trained: "
            f"{why}. Its validation loss would not be comparable; restore that data or drop val "
            "from --tasks (the other tasks use the run's own tokenizer)"
        )
    _, tokens = open_split(run_data, "val")
    return torch.from_numpy(tokens.astype("int64")), str(run_data.resolve())


def _haystack(args: argparse.Namespace, data_dir):
    # RULER reads the first words only; 16 characters per token of the longest length is ample.
    return load_haystack(args.niah_haystack, data_dir, max(10**6, 16 * max(args.niah_lengths)))


def _meta(args: argparse.Namespace, device, data_dir, max_length, model, notes) -> dict:
    return {
        "run": str(Path(args.run).resolve()),
        "step": args.step,
        "device": device,
        "dtype": args.dtype,
        "max_length": max_length,
        "batch_size": args.batch_size,
        "source": args.source,
        "data_dir": None if data_dir is None else str(Path(data_dir).resolve()),
        "limit": args.limit,
        **({"niah_lengths": args.niah_lengths} if isinstance(args.niah_lengths, list) else {}),
        "notes": notes,
        "model": {
            "family": model.config.family,
            "params": sum(p.numel() for p in model.parameters()),
            "mlp_widths": list(model.config.mlp_widths or []),
        },
    }


def _report(args: argparse.Namespace, results, notes: list[str], meta: dict) -> None:
    from taperlm.evaluation.suite import format_table, results_json  # lazy: --help torch-free

    blob = results_json(results, meta)
    if args.out:
        atomic_write_text(args.out, json.dumps(json_mark(blob, "eval"), indent=2) + "\n")
    if args.json:
        print(json.dumps(blob, indent=2))
    else:
        print(format_table(results, label=Path(args.run).name))
        for n in notes:
            print(f"note: {n}")
