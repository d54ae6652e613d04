"""The README's commands work on a fresh copy of the repository, offline, without ../shared.

The commands are read from README.md itself: every `taperlm` and `torchrun` command of its
```bash blocks, in the order they appear (continuations joined, comments dropped, `&&` chains
split: the main job's set-up line ends in `taperlm compare`), and they run exactly as printed,
in a fresh copy (its files, `git init`, no ../shared, no network, an empty cache); afterwards
`git status` is clean, so every output the README makes is git-ignored. A line may only be made
smaller through what the README documents and the line does not show: the `TAPERLM_SET`
overrides of `QUICK` for the lines that train. The line the README marks *(needs internet)*
must fail offline with a clear error (no traceback). The page itself is a guide: its first
command within the first screen, a table of every subcommand.

- default: every command parses, every output path is git-ignored, the lines that need no
  model (`taperlm plan`) run as printed in a fresh copy;
- slow: the whole usage sequence as printed with `QUICK` (the default corpus prepared as printed,
  then tiny models). Measured on 2 cores shared with other jobs: every line before the compare
  lines 15-45 s each, the corpus 146 s, the 15-cell compare line 614 s; the three compare lines
  after it (the paper grid, the four-allocation grid with pilots, the main job's 14 cells) have
  about 7 times as many cells, so the whole test takes 1-2 hours there;
- slow: the same with no override at all (the README's own sizes: the main job alone takes
  ≈ 14 min on 2 idle cores (estimated), the three compare lines about an hour more).
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

from taperlm.cli import COMMANDS, build_parser

REPO = Path(__file__).resolve().parents[2]

# $TAPERLM_SET for the lines that train (matched by their first words): tiny models, few tokens,
# and compare on the corpus `taperlm prepare` made (instead of preparing its own once more).
QUICK_TRAIN_SET = (
    "train.tokens=8192 train.batch_tokens=2048 train.micro_batch_size=8 train.seq_len=64 "
    "train.eval_every=2 train.eval_tokens=1024 data.dir=data/default"
)
QUICK_SET = (
    "model.n_layers=3 model.d_model=64 model.n_heads=2 model.mlp_width=128 " + QUICK_TRAIN_SET
)
QUICK: dict[str, dict[str, str]] = {
    # the quick start is small as printed (and trains on the corpus it prepares itself)
    "taperlm train --preset transformer-nano": {},
    # a run from a pruned model's weights keeps that model: the training settings only
    "taperlm train --init-from": {"TAPERLM_SET": QUICK_TRAIN_SET},
    **{f: {"TAPERLM_SET": QUICK_SET} for f in ("taperlm train", "torchrun", "taperlm compare")},
}
NEEDS_INTERNET = "(needs internet)"


def _bash_lines() -> list[str]:
    """Every line of README's ```bash blocks, in order, continuations joined."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = [b.split("```", 1)[0] for b in text.split("```bash\n")[1:]]
    return [ln.strip() for b in blocks for ln in re.sub(r"\\\n\s*", "", b).splitlines()]


def _is_command(part: str) -> bool:
    return part.startswith(("taperlm ", "torchrun "))


def readme_commands() -> list[str]:
    """The `taperlm`/`torchrun` commands of README's bash blocks (each part of an `&&` chain)."""
    parts = [c.strip() for ln in _bash_lines() if not ln.startswith("#") for c in ln.split("&&")]
    return [c for c in parts if _is_command(c)]


def internet_commands() -> list[str]:
    """The commands whose comment says they need the internet."""
    out, comment = [], ""
    for ln in _bash_lines():
        if ln.startswith("#"):
            comment += ln
        elif ln:
            if NEEDS_INTERNET in comment:
                out += [c.strip() for c in ln.split("&&") if _is_command(c.strip())]
            comment = ""
    return out


def _cli_args(command: str) -> list[str]:
    """The taperlm arguments of a README command (`taperlm ...` or `torchrun ... -m taperlm.cli`)."""
    words = shlex.split(command)
    if words[0] == "taperlm":
        return words[1:]
    assert words[0] == "torchrun" and "taperlm.cli" in words, command
    return words[words.index("taperlm.cli") + 1 :]


def _extra_env(command: str, table: dict[str, dict[str, str]]) -> dict[str, str]:
    return next((v for k, v in table.items() if command.startswith(k)), {})


def test_readme_has_the_commands_it_promises():
    commands = readme_commands()
    subcommands = {_cli_args(c)[0] for c in commands}
    assert subcommands == set(COMMANDS)  # every subcommand shown at work
    assert "taperlm compare --out runs/compare" in commands  # the main job
    assert any(c.startswith("torchrun ") for c in commands)


def _section(title: str) -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_readme_is_a_guide_that_starts_with_how_to_use_the_tool():
    """The first screen holds the install block; the quick start runs plan, prepare, train and
    eval; the Commands table names every subcommand, once, in the CLI's order."""
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert lines.index("```bash") < 40
    headings = [ln.removeprefix("## ") for ln in lines if ln.startswith("## ")]
    assert headings[:3] == ["Install", "Quick start", "Commands"]
    quick = [_cli_args(c)[0] for c in readme_commands() if c in _section("Quick start")]
    assert quick == ["plan", "prepare", "train", "eval"]
    table = re.findall(r"^\| `taperlm (\w+)` \|", _section("Commands"), flags=re.M)
    assert table == list(COMMANDS)
    assert "(docs/img/taper-widths.png)" in "\n".join(lines[:15])
    assert (REPO / "docs/img/taper-widths.png").is_file()


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


def _copy_and_environment(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    copy = tmp_path / "clone" / "taperlm"
    copy.mkdir(parents=True)
    _fresh_copy(copy)
    assert not (copy.parent / "shared").exists()
    return copy, _environment(tmp_path, copy)


def _run_line(command: str, copy: Path, env: dict[str, str], timeout: float):
    """One README command exactly as printed (bash runs the text itself)."""
    return subprocess.run(
        ["bash", "-c", command], cwd=copy, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def _run_readme(tmp_path: Path, table: dict[str, dict[str, str]], timeout: float) -> dict[str, str]:
    from taperlm.data import corpus

    try:
        corpus.default_corpus_files()
    except corpus.DataError:
        pytest.skip("Debian documentation packages not installed: " + corpus.INSTALL_COMMAND)
    pytest.importorskip("transformers")  # export/novelty of an export (the [eval] extra)
    copy, env = _copy_and_environment(tmp_path)
    offline = set(internet_commands())
    # in the page's order: the main job comes after the usage block, so with QUICK it trains on
    # the data/default that block prepares
    commands = readme_commands()
    outputs = {}
    for command in commands:
        extra = _extra_env(command, table)
        t0 = time.perf_counter()
        done = _run_line(command, copy, {**env, **extra}, timeout)
        shown = " ".join(f"{k}={shlex.quote(v)}" for k, v in extra.items()) + " " + command
        if command in offline:
            assert done.returncode == 2, f"expected a clear offline error: {command}"
            assert "error:" in done.stderr and "Traceback" not in done.stderr, done.stderr
        else:
            assert done.returncode == 0, f"README command failed: {shown}\n{done.stderr[-3000:]}"
        outputs[command] = done.stdout
        print(f"TIMING {time.perf_counter() - t0:6.1f}s {shown.strip()[:90]}")
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


def test_readme_marks_the_lines_that_need_the_internet():
    (line,) = internet_commands()
    assert line.startswith("taperlm prepare --source hf:HuggingFaceFW/fineweb-edu")


def test_readme_lines_without_a_model_run_as_printed_on_a_fresh_copy(tmp_path):
    """The `taperlm plan` lines (no torch, seconds) as printed, in a fresh copy."""
    lines = [c for c in readme_commands() if c.startswith("taperlm plan ")]
    assert len(lines) >= 4
    copy, env = _copy_and_environment(tmp_path)
    for command in lines:
        done = _run_line(command, copy, env, timeout=120)
        assert done.returncode == 0, f"README command failed: {command}\n{done.stderr[-2000:]}"
        assert done.stdout.strip() and not done.stderr.strip(), command


@pytest.mark.slow
def test_readme_usage_runs_on_a_fresh_copy(tmp_path):
    _check_outputs(_run_readme(tmp_path, QUICK, timeout=3600), "QUICK settings")


@pytest.mark.slow
def test_readme_usage_runs_as_printed(tmp_path):
    _check_outputs(_run_readme(tmp_path, {}, timeout=3 * 3600), "printed settings")
