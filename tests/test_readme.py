"""The README's commands work on a fresh copy of the repository, offline, without ../shared.

The commands are read from README.md itself: the `taperlm` commands of the set-up block (the
main job) and every line of the Usage block (continuations joined, comments dropped).

- every command is accepted by the command line's parser, and every file or folder the commands
  write is git-ignored (fast, default);
- slow: the whole usage sequence runs in a fresh copy (its files, `git init`, no ../shared, no
  network, an empty cache), each line as printed plus the small settings of `SMALL` where the
  printed one takes minutes (1.5 min of CPU, 2-4 min wall on 2 shared cores); afterwards
  `git status` is clean, so every output the README makes is git-ignored;
- slow: the same with the printed settings (compare lines with 2 seeds of 65,536 tokens; the
  full main job's time is measured in the README), torchrun included (~15 min on 2 cores).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from taperlm.cli import build_parser

REPO = Path(__file__).resolve().parents[1]

# Appended to a README line (matched by its first words) to make it take seconds, not minutes.
SMALL_TRAIN = (
    "--set train.tokens=8192 --set train.batch_tokens=2048 --set train.micro_batch_size=8 "
    "--set train.seq_len=64 --set train.eval_every=2 --set train.eval_tokens=1024 "
    "--set model.n_layers=3 --set model.d_model=64 --set model.n_heads=2 --set model.mlp_width=128"
)
SMALL_COMPARE = (
    "--data data/default --seeds 2 --tokens 4096 --val-tokens 2048 --novelty-tokens 256 "
    "--set train.batch_tokens=2048 --set train.micro_batch_size=8 --set train.seq_len=64 "
    "--set train.eval_tokens=512 --set model.n_layers=3 --set model.d_model=64 "
    "--set model.n_heads=2 --set model.mlp_width=96 --jobs 1"
)
SMALL: dict[str, str] = {
    "taperlm prepare": "--max-chars 1500000",
    "taperlm train": SMALL_TRAIN,
    "torchrun": SMALL_TRAIN,
    "taperlm eval": "--limit 8",
    "taperlm compare": SMALL_COMPARE,
}
# The printed settings, except compare's seeds and tokens (each grid would take 10-20 minutes).
SLOW: dict[str, str] = {"taperlm compare": "--seeds 2 --tokens 65536"}


def readme_commands() -> list[str]:
    """The `taperlm` commands of the set-up block and every command of the Usage block."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    setup = text.split("## Set up", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [c.strip() for c in setup.split("&&") if c.strip().startswith("taperlm ")]
    usage = text.split("## Usage", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    lines = re.sub(r"\\\n\s*", "", usage).splitlines()
    commands += [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    return commands


def _cli_args(command: str) -> list[str]:
    """The taperlm arguments of a README command (`taperlm ...` or `torchrun ... -m taperlm.cli`)."""
    words = shlex.split(command)
    if words[0] == "taperlm":
        return words[1:]
    assert words[0] == "torchrun" and "taperlm.cli" in words, command
    return words[words.index("taperlm.cli") + 1 :]


def _extra(command: str, table: dict[str, str]) -> str:
    return next((v for k, v in table.items() if command.startswith(k)), "")


def test_readme_has_the_commands_it_promises():
    commands = readme_commands()
    subcommands = {_cli_args(c)[0] for c in commands}
    assert subcommands >= {"plan", "prepare", "train", "eval", "export", "generate", "novelty"}
    assert "taperlm compare --out runs/compare" in commands  # the main job
    assert any(c.startswith("torchrun ") for c in commands)


@pytest.mark.parametrize("command", readme_commands())
def test_readme_command_parses(command):
    """Options the README uses exist (a renamed option fails here in a second)."""
    args = _cli_args(command)
    build_parser(only=args[0]).parse_args(args)


def _written_paths(command: str) -> list[str]:
    """The files and folders a README command writes (its --out and --plot)."""
    args = _cli_args(command)
    ns = build_parser(only=args[0]).parse_args(args)
    return [str(getattr(ns, k)) for k in ("out", "plot") if getattr(ns, k, None) is not None]


def test_readme_outputs_are_git_ignored():
    """A user who follows the README and then runs `git status` sees none of its outputs."""
    paths = sorted({p for c in readme_commands() for p in _written_paths(c)})
    assert {"data/default", "hf/tiny-cosine", "runs/compare", "novelty.png"} <= set(paths)
    try:
        done = subprocess.run(
            ["git", "check-ignore", "--no-index", "-v", "-n", *paths],
            cwd=REPO, capture_output=True, text=True, check=False,
        )  # fmt: skip
    except OSError:
        pytest.skip("git is not installed")
    if done.returncode > 1:
        pytest.skip(f"not a git checkout: {done.stderr.strip()}")
    not_ignored = [ln.split("\t")[-1] for ln in done.stdout.splitlines() if ln.startswith("::")]
    assert not not_ignored, f"README outputs that git does not ignore: {not_ignored}"


def _fresh_copy(dest: Path) -> Path:
    """The repository's files (tracked and not ignored) in a new git repository at `dest`."""
    try:
        files = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=REPO, capture_output=True, check=True,
        ).stdout.decode().split("\0")  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], cwd=dest, check=True)
    subprocess.run([*git, "add", "-A"], cwd=dest, check=True)
    subprocess.run([*git, "commit", "-qm", "copy"], cwd=dest, check=True)
    return dest


def _environment(root: Path, copy: Path) -> dict[str, str]:
    """`taperlm` and `torchrun` on PATH running the copy's code with this interpreter; no
    evaluation data, no network, an empty cache."""
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for name, module in (("taperlm", "taperlm.cli"), ("torchrun", "torch.distributed.run")):
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m {module} "$@"\n')
        shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TAPERLM_")}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(copy / "src"),
        TAPERLM_CACHE=str(root / "cache"),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        MPLBACKEND="Agg",
    )
    return env


def _run_readme(tmp_path: Path, table: dict[str, str], timeout: float) -> dict[str, str]:
    from taperlm.data import corpus

    try:
        corpus.default_corpus_files()
    except corpus.DataError:
        pytest.skip("Debian documentation packages not installed: " + corpus.INSTALL_COMMAND)
    pytest.importorskip("transformers")  # export/novelty of an export (the [eval] extra)
    copy = tmp_path / "clone" / "taperlm"
    copy.mkdir(parents=True)
    _fresh_copy(copy)
    assert not (copy.parent / "shared").exists()
    env = _environment(tmp_path, copy)
    # the main job last: its corpus comes from data/default in SMALL, the cache otherwise
    commands = readme_commands()
    commands = commands[1:] + commands[:1]
    outputs = {}
    for command in commands:
        line = f"{command} {_extra(command, table)}".strip()
        t0 = time.perf_counter()
        done = subprocess.run(
            ["bash", "-c", line], cwd=copy, env=env, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
        assert done.returncode == 0, f"README command failed: {line}\n{done.stderr[-3000:]}"
        outputs[command] = done.stdout
        print(f"TIMING {time.perf_counter() - t0:6.1f}s {line[:70]}")
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=copy, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert status == "", f"README outputs that git does not ignore:\n{status}"
    return outputs


def _check_outputs(outputs: dict[str, str], copy_hint: str) -> None:
    import json

    ev = json.loads(outputs["taperlm eval runs/tiny-cosine --json"])
    assert "val" in ev["tasks"], copy_hint
    assert any("--source hf" in n for n in ev["meta"]["notes"])
    nov = json.loads(outputs["taperlm novelty hf/tiny-cosine --data LICENSE --tokens 2048 --json"])
    assert nov["input_tokens"] == 2048 and nov["data"] == "LICENSE"


@pytest.mark.slow
def test_readme_usage_runs_on_a_fresh_copy(tmp_path):
    _check_outputs(_run_readme(tmp_path, SMALL, timeout=600), "small settings")


@pytest.mark.slow
def test_readme_usage_runs_as_printed(tmp_path):
    _check_outputs(_run_readme(tmp_path, SLOW, timeout=3600), "printed settings")
