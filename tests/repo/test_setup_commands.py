"""README's two set-up commands work on a stock Debian 12 / Ubuntu 24.04 machine, and CI runs the
test command the way a newcomer does (issue 60).

The system `python3` there refuses `pip install` outside a virtual environment (PEP 668), so both
commands make `.venv` and use it before anything is installed: every pip and every later python
of README's commands runs inside it, torch's CPU build first. The main job's apt line brings
`python3 -m venv` (`python3-venv`) with the corpus packages; README says once how to come back to
the environment. `.ci/run` holds README's test command character for character, runs its set-up
first (in a fresh copy, with the system's python3 first on PATH) and the command itself last;
every stage between runs in that environment.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CI = REPO / ".ci" / "run"
VENV = "python3 -m venv .venv && . .venv/bin/activate && "
TORCH_FIRST = "python -m pip install torch==2.13.0 && "

pytestmark = pytest.mark.unit


def _readme() -> str:
    return (REPO / "README.md").read_text(encoding="utf-8")


def _bash_blocks() -> list[str]:
    return [b.split("```", 1)[0] for b in _readme().split("```bash\n")[1:]]


def _one_line_block(marker: str) -> str:
    """The only README bash block that is a single line containing `marker`."""
    found = [b.strip() for b in _bash_blocks() if marker in b and b.strip().count("\n") == 0]
    assert len(found) == 1, f"expected one one-line bash block with {marker!r}: {found}"
    return found[0]


def readme_test_command() -> str:
    return _one_line_block("python -m pytest")


def main_job_command() -> str:
    return _one_line_block("taperlm compare --out runs/compare")


def ci_test_command() -> str:
    text = CI.read_text(encoding="utf-8")
    (value,) = re.findall(r"^README_TEST_COMMAND=(.+)$", text, flags=re.M)
    (word,) = shlex.split(value)  # the shell's value of the assignment
    return word


def _steps(command: str) -> list[str]:
    return [s.strip() for s in command.split("&&")]


def test_the_test_command_makes_and_uses_a_virtual_environment():
    command = readme_test_command()
    assert command.startswith(VENV + TORCH_FIRST), command
    assert _steps(command)[-1] == "python -m pytest"
    _only_inside_the_environment(command)


def test_the_main_job_command_makes_and_uses_a_virtual_environment():
    command = main_job_command()
    steps = _steps(command)
    apt = [s for s in steps if "apt-get install" in s]
    assert len(apt) == 1 and "python3-venv" in apt[0].split()
    tail = command.split(apt[0] + " && ", 1)[1]
    assert tail.startswith(VENV + TORCH_FIRST), tail
    assert steps[-1] == "taperlm compare --out runs/compare"
    _only_inside_the_environment(command)


def test_the_install_block_is_the_main_jobs_set_up():
    """README's Install block: the main job's apt line, then its environment and installs."""
    block = _readme().split("\n## Install\n", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    apt, env = block.strip().splitlines()
    assert main_job_command() == f"{apt} && {env} && taperlm compare --out runs/compare"
    assert env.startswith(VENV + TORCH_FIRST)


def _only_inside_the_environment(command: str) -> None:
    """No pip, python or taperlm before `.venv` is active; python3 only to make it."""
    active = False
    for step in _steps(command):
        words = step.split()
        if step == ". .venv/bin/activate":
            active = True
        elif words[0] == "python3":
            assert step == "python3 -m venv .venv", f"the system python3 used for more: {step}"
        elif words[0] in {"python", "pip", "pip3", "taperlm", "pytest"}:
            assert active, f"{step!r} runs before the virtual environment is active"


def test_readme_says_once_how_to_come_back_to_the_environment():
    prose = re.sub(r"```bash\n.*?```", "", _readme(), flags=re.S)
    assert prose.count("`. .venv/bin/activate`") == 1


def test_ci_runs_the_readmes_test_command_as_a_newcomer():
    """.ci/run: the command is README's; its set-up first, in a fresh copy with the system's
    python3 first on PATH, then every stage in that environment, the command itself last."""
    assert ci_test_command() == readme_test_command()
    lines = [ln.strip() for ln in CI.read_text(encoding="utf-8").splitlines()]
    code = [ln for ln in lines if ln and not ln.startswith("#")]
    assert code[-1] == 'eval "$README_TEST_COMMAND"'
    setup = code.index('eval "$README_TEST_SETUP"')
    assert 'README_TEST_SETUP="${README_TEST_COMMAND% && python -m pytest}"' in " ".join(
        ln.split("  #")[0] for ln in code
    )
    assert code.index('export PATH="/usr/bin:$PATH"') < setup
    assert code.index('cd "$work/clone/taperlm"') < setup  # the fresh copy
    # every stage after the set-up runs the environment's python, never python3 or a bare pip
    for line in code[setup + 1 :]:
        assert not re.search(r"(^|[\s(])(python3|pip3?)\s", line.replace("-m pip ", "")), line
    stages = " ".join(code[setup + 1 :])
    for stage in ("ruff check", "-m unit", "tests/repo/test_wheel.py", '"shared and not slow"'):
        assert stage in stages, stage


def test_ci_installs_system_packages_in_one_place():
    """One list of system packages (the place to add one), with python3-venv and the corpus."""
    text = CI.read_text(encoding="utf-8")
    assert len(re.findall(r"apt-get install", text)) == 1
    (packages,) = re.findall(r"^SYSTEM_PACKAGES=\((.*)\)$", text, flags=re.M)
    apt = next(s for s in _steps(main_job_command()) if "apt-get install" in s).split()
    readme_packages = {w for w in apt[apt.index("install") + 1 :] if not w.startswith("-")}
    assert "python3-venv" in readme_packages and set(packages.split()) >= readme_packages
