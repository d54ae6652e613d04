"""`taperlm eval RUN --tasks LIST`: validation perplexity and the paper's zero-shot suite
(lm-evaluation-harness conventions), printed as the paper's table and/or JSON."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from taperlm.domains import input_path, number, output_path
from taperlm.errors import ConfigError, DataError

TASK_HELP = (
    "auto (default: val + every task of the suite whose files are found locally), or "
    "comma-separated: paper (= val + all below), val, wikitext, lambada_openai, piqa, hellaswag, "
    "winogrande, arc_easy, arc_challenge, social_iqa, boolq"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run",
        nargs="?",
        type=input_path(),
        help="run directory of `taperlm train` (or a checkpoint dir, or a `taperlm export` dir)",
    )
    parser.add_argument("--tasks", default="auto", help=TASK_HELP)
    parser.add_argument(
        "--data-dir",
        type=input_path(),
        help="folder with the eval files laid out like ../shared/data (default: $TAPERLM_EVAL_DATA, "
        "else ../shared/data beside the checkout or the working directory)",
    )
    parser.add_argument(
        "--source",
        choices=("local", "hf"),
        default="local",
        help="local files (default) or the Hugging Face datasets lm-eval downloads",
    )
    parser.add_argument(
        "--limit", type=number(int, "[1, inf)"), help="first N items per task (val: N windows)"
    )
    parser.add_argument(
        "--batch-size", type=number(int, "[1, inf)"), default=16, help="sequences per forward pass"
    )
    parser.add_argument(
        "--max-length",
        type=number(int, "[2, inf)"),
        help="context window for scoring (default: the model's context_length)",
    )
    parser.add_argument(
        "--step", type=number(int, "[0, inf)"), help="evaluate checkpoint STEP (default: newest)"
    )
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument(
        "--dtype",
        choices=("fp32", "bf16"),
        default="fp32",
        help="bf16 autocast on GPU (default fp32, exact)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument(
        "--out", type=output_path("file"), help="also write the JSON results to FILE"
    )
    parser.add_argument(
        "--samples", action="store_true", help="include per-item log-likelihoods in the JSON"
    )
    parser.add_argument(
        "--write-lm-eval-tasks",
        type=output_path("dir"),
        metavar="DIR",
        help="write lm-eval task YAMLs + normalized data for the local files to DIR and exit "
        "(then: lm_eval --include_path DIR --tasks taperlm_piqa,...)",
    )


def parse_tasks(text: str) -> list[str]:
    from taperlm.evaluation.suite import PAPER_TASKS, parse_task_list

    out = parse_task_list(text, PAPER_TASKS, "--tasks")
    if not out:
        raise ConfigError(f"--tasks is empty; choose from {TASK_HELP}")
    return out


def auto_tasks(data_dir: Path | None, source: str, notes: list[str]) -> list[str]:
    """`--tasks auto`: the validation perplexity and every zero-shot task of the paper's suite
    that can run here (all of them with --source hf; with local files, those whose files are in
    `data_dir`); a note names the others and how to get them."""
    from taperlm.evaluation.tasks import LOCAL_FILES, TASKS

    if source == "hf":
        return ["val", *TASKS]
    have = [
        t
        for t in TASKS
        if data_dir is not None and all((Path(data_dir) / f).is_file() for f in LOCAL_FILES[t])
    ]
    missing = [t for t in TASKS if t not in have]
    if missing:
        where = f"in {data_dir}" if data_dir is not None else "(no evaluation data folder)"
        notes.append(
            f"zero-shot tasks skipped, their files are not found {where}: {', '.join(missing)}. "
            "Evaluate them with --tasks paper --source hf (downloads the datasets from the "
            "Hugging Face Hub) or --data-dir DIR (a folder laid out like ../shared/data)"
        )
    return ["val", *have]


def run(args: argparse.Namespace) -> int:
    from taperlm.device import resolve_device
    from taperlm.evaluation.locate import eval_data_dir
    from taperlm.loading import load_any

    data_dir = args.data_dir or eval_data_dir()
    auto_notes: list[str] = []
    if args.tasks.strip() == "auto":
        tasks = auto_tasks(data_dir, args.source, auto_notes)
    else:
        tasks = parse_tasks(args.tasks)
    if args.write_lm_eval_tasks:
        return _write_lm_eval_tasks(args, tasks, data_dir)
    if args.run is None:
        raise ConfigError("give the RUN directory to evaluate (or --write-lm-eval-tasks DIR)")
    device = resolve_device(args.device)
    model, tokenizer, run_config = load_any(args.run, step=args.step, device=device)
    scorer = _scorer(args, model, tokenizer, device)
    if any(t != "val" for t in tasks) and args.source == "local" and data_dir is None:
        raise DataError(
            "no evaluation data found: pass --data-dir DIR (laid out like ../shared/data), set "
            "TAPERLM_EVAL_DATA, or use --source hf"
        )
    results, notes = _run_tasks(args, tasks, scorer, data_dir, run_config)
    notes += auto_notes
    if not results:
        raise DataError("nothing to evaluate: " + "; ".join(notes))
    _report(args, results, notes, _meta(args, device, data_dir, scorer.max_length, model, notes))
    return 0


def _write_lm_eval_tasks(args: argparse.Namespace, tasks: list[str], data_dir: Path | None) -> int:
    from taperlm.evaluation.harness import write_task_dir

    out = write_task_dir(
        args.write_lm_eval_tasks,
        data_dir,
        [t for t in tasks if t != "val"],
        source=args.source,
        limit=args.limit,
    )
    print(
        f"wrote lm-eval tasks to {out}; run e.g.\n  lm_eval --model hf --model_args "
        f"pretrained=EXPORT_DIR,trust_remote_code=True --include_path {out} "
        "--tasks taperlm_piqa,taperlm_hellaswag --batch_size 16"
    )
    return 0


def _scorer(args: argparse.Namespace, model, tokenizer, device: str):
    import torch

    from taperlm.evaluation.scoring import Scorer

    max_length = args.max_length or model.config.context_length
    if max_length < 2:
        raise ConfigError(f"--max-length must be >= 2, got {max_length}")
    return Scorer(
        model,
        tokenizer,
        max_length,
        batch_size=args.batch_size,
        device=device,
        dtype=torch.bfloat16 if args.dtype == "bf16" else None,
    )


def _run_tasks(args: argparse.Namespace, tasks: list[str], scorer, data_dir, run_config):
    """({task: TaskResult}, notes), printing one line per task unless --json."""
    import time

    from taperlm.evaluation.suite import run_task
    from taperlm.evaluation.tasks import load_task

    results = {}
    notes: list[str] = []
    for task in tasks:
        t0 = time.perf_counter()
        if task == "val":
            res = _run_val(args, scorer, run_config, notes)
            if res is None:
                continue
        else:
            data = load_task(task, data_dir, source=args.source, limit=args.limit)
            res = run_task(scorer, data, keep_items=args.samples)
        res.seconds = time.perf_counter() - t0
        results[task] = res
        if not args.json:
            shown = ", ".join(f"{k} {v:.4g}" for k, v in res.metrics.items())
            print(f"{task}: {shown} (n={res.n}, {res.seconds:.1f}s)", file=sys.stderr)
    return results, notes


def _run_val(args: argparse.Namespace, scorer, run_config, notes: list[str]):
    """Perplexity on the run's validation shard; None (with a note) when the model has no run
    data dir and val was not asked for explicitly."""
    import torch

    from taperlm.data.identity import check_run_data
    from taperlm.data.loader import open_split
    from taperlm.evaluation.suite import run_val
    from taperlm.loading import resolve_data_dir, run_root

    root = run_root(Path(args.run))
    run_data = resolve_data_dir(root, run_config) if run_config else None
    if run_data is None:
        if "val" in [t.strip() for t in args.tasks.split(",")]:
            raise DataError(
                f"val: {args.run} has no data dir with a validation shard (data.dir in its "
                "config.yaml); evaluate a training run or drop val from --tasks"
            )
        notes.append("val skipped: the model has no run data dir")
        return None
    why = check_run_data(root, run_data, ("val",))
    if why:
        raise DataError(
            f"val: the data dir {run_data} of run {root} changed since the run was trained: "
            f"{why}. Its validation loss would not be comparable; restore that data or drop val "
            "from --tasks (the other tasks use the run's own tokenizer)"
        )
    _, tokens = open_split(run_data, "val")
    tokens = torch.from_numpy(tokens.astype("int64"))
    return run_val(scorer, tokens, args.limit, str(run_data.resolve()))


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
        "notes": notes,
        "model": {
            "family": model.config.family,
            "params": sum(p.numel() for p in model.parameters()),
            "mlp_widths": list(model.config.mlp_widths or []),
        },
    }


def _report(args: argparse.Namespace, results, notes: list[str], meta: dict) -> None:
    from taperlm.evaluation.suite import format_table, results_json
    from taperlm.io import atomic_write_text

    blob = results_json(results, meta)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.out, json.dumps(blob, indent=2) + "\n")
    if args.json:
        print(json.dumps(blob, indent=2))
    else:
        print(format_table(results, label=Path(args.run).name))
        for n in notes:
            print(f"note: {n}")
