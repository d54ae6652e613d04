"""Shared test fixtures and the one builder of small model configs (`tiny_config`).

Real benchmark files live in ../shared/data beside the checkout (or $TAPERLM_EVAL_DATA, the
library's own lookup); tests that need them use the `shared_data` fixture and skip cleanly when
it is absent. That is the only way a test sees them: such tests get the `shared` marker, and every
other test runs with the lookup off (`TAPERLM_EVAL_DATA=none`, inherited by the commands it
starts), as on a fresh clone with nothing beside it. So the default suite passes without
../shared as long as the `shared` tests do, and CI (.ci/run) runs those a second time in a bare
copy.

The `unit` lane (`python3 -m pytest -m unit`) is the part of the suite that needs no torch: the
spec layer (tapers, solver, budgets, domains, config parsing) and the readers of files. In that
lane torch cannot be imported: a test module that imports it fails to collect, and a test that
imports it (even where the code under test catches the ImportError) fails, naming the test.
Only files that mention `mark.unit` are collected there, so the other modules' top-level torch
imports cost nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.abc
import importlib.machinery
import importlib.util
import os
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from taperlm.config import OVERRIDES_ENV, ModelConfig
from taperlm.evaluation.locate import EVAL_DATA_ENV, NO_EVAL_DATA, eval_data_dir
from taperlm.spec.taper import TaperSpec

# Tests live in one folder per feature (tests/model, tests/training, ...) and share fixtures and
# helpers across them by module name (`from test_compare import TINY`, `import fault_harness`), as
# pytest's default import mode allows for modules that sit on sys.path. Every area's folder goes
# there, so a file imports the same way whichever file or folder is run; hence the basenames of
# test modules are unique across tests/ (tests/repo/test_structure.py checks).
TESTS = Path(__file__).resolve().parent
for _area in sorted(p for p in TESTS.iterdir() if p.is_dir() and p.name[0] not in "._"):
    if str(_area) not in sys.path:
        sys.path.append(str(_area))

TINY_SHAPE = dict(vocab_size=64, d_model=32, n_layers=4, n_heads=4, mlp_width=64, context_length=64)


# The shape of the tiny training runs the trainer's tests share (2 layers, d_model 32, steps of
# 256 tokens in two micro-batches of 4 x 32); each test adds its own schedule and budget.
TINY_RUN_SETS = [
    "model.n_layers=2",
    "model.d_model=32",
    "model.n_heads=2",
    "model.mlp_width=96",
    "model.vocab_size=512",
    "model.context_length=64",
    "train.seq_len=32",
    "train.micro_batch_size=4",
    "train.batch_tokens=256",
]


def tiny_config(
    family: str = "transformer",
    taper: str | TaperSpec = "uniform",
    preset: str | None = None,
    resolve: bool = True,
    **kw: Any,
) -> ModelConfig:
    """A small model config for tests: TINY_SHAPE with the given family and taper (a spec string
    or a TaperSpec), resolved unless `resolve=False`. Keyword arguments set model fields
    (`n_layers=3`, `tie_embeddings=True`) or, by their names, the family's options
    (`variant="mac"`, `levels=2`, `gate="headwise"`). With `preset` (e.g. "titans-mag-tiny") the
    family and its options come from that preset instead (shape still TINY_SHAPE)."""
    from taperlm.config.presets import get_preset

    if preset is not None:
        base = get_preset(preset, resolve=False)
        family, options = base.family, base.options
    else:
        options = None
    names = {f.name for f in dataclasses.fields(ModelConfig)}
    fields = {**TINY_SHAPE, **{k: v for k, v in kw.items() if k in names}}
    opts = {k: v for k, v in kw.items() if k not in names}
    spec = taper if isinstance(taper, TaperSpec) else TaperSpec.parse(taper)
    cfg = ModelConfig(family=family, taper=spec, options=options, **fields)
    if opts:
        cfg.options = dataclasses.replace(cfg.options, **opts)
    return cfg.resolve() if resolve else cfg


def import_docs_example(
    page: str, heading: str, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Any:
    """The first ```python block after `heading` in docs/`page`, written to a file and imported
    as module `name` (in sys.modules until the test ends): the docs' example run as written."""
    text = (TESTS.parent / "docs" / page).read_text(encoding="utf-8")
    source = text.split(heading, 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    path = tmp_path / f"{name}.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def raises_naming(error: type[BaseException], *tokens: str) -> Iterator[pytest.ExceptionInfo]:
    """`pytest.raises(error)` whose message names every token: the file, key, flag, value or fix
    a reader acts on. The facts are the contract, not the wording around them, so a message may
    be rephrased without touching the tests that check it."""
    with pytest.raises(error) as info:
        yield info
    missing = [t for t in tokens if t not in str(info.value)]
    assert not missing, f"{missing} not named in: {info.value}"


REPO_ROOT = Path(__file__).resolve().parents[1]
README_RESULTS = ("<!-- README's results: begin", "<!-- README's results: end -->")


def flat_text(text: str) -> str:
    """`text` with its line breaks and runs of spaces made single spaces, so that a quoted number
    is found wherever the prose wraps it."""
    return " ".join(text.split())


def readme_results_text() -> str:
    """docs/compare.md's section "README's results" (the measurements that opened README.md
    until issue 60, moved there unchanged), flattened: the tests that checked README's numbers
    check them here, and in README where it still quotes them."""
    page = (REPO_ROOT / "docs" / "compare.md").read_text(encoding="utf-8")
    begin, end = README_RESULTS
    return flat_text(page.split(begin, 1)[1].split(end, 1)[0])


def readme_text() -> str:
    """README.md, flattened (`flat_text`)."""
    return flat_text((REPO_ROOT / "README.md").read_text(encoding="utf-8"))


def assert_naming(text: str, *tokens: str) -> None:
    """`text` (a message a command printed, warned or logged) names every token: the
    `raises_naming` check for what is not an exception."""
    missing = [t for t in tokens if t not in text]
    assert not missing, f"{missing} not named in: {text}"


def assert_own_options(command: str, err: str) -> None:
    """Every --option an error of `taperlm COMMAND` tells the user to change is one COMMAND
    accepts; another command's options appear only inside its command line (`taperlm prepare
    --val-tokens N`). A message shared by several commands must be told which command's
    options to name."""
    from taperlm.cli import build_parser, subcommand_parser

    sub = subcommand_parser(build_parser(only=command), command)
    own = {o for a in sub._actions for o in a.option_strings if o.startswith("--")}
    text = err.split(": error: ", 1)[-1]
    text = re.sub(
        r"`?taperlm ([a-z-]+)[^`;()\n]*`?",
        lambda m: m.group(0) if m.group(1) == command else "",
        text,
    )
    foreign = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text)) - own
    assert not foreign, f"the error names options `taperlm {command}` lacks: {foreign}: {err!r}"


def torchrun_command(*args: str, nproc: int = 2) -> list[str]:
    """`torchrun --standalone --nproc_per_node N ARGS...` with this interpreter."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc_per_node", str(nproc), *args,
    ]  # fmt: skip


# The evaluation-data lookup as the developer's environment has it (the `shared` tests use it).
_REAL_EVAL_DATA = os.environ.get(EVAL_DATA_ENV)


class _NoTorch(importlib.abc.MetaPathFinder):
    """The unit lane's guard: torch is absent, as on an install without it, and every attempt to
    import it is recorded, so a test that swallows the ImportError still fails."""

    def __init__(self) -> None:
        self.attempts: list[str] = []  # names of the torch modules asked for since the last check

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "torch" or fullname.startswith("torch."):
            self.attempts.append(fullname)
            raise ModuleNotFoundError(f"the unit lane runs without torch ({fullname})")
        return None

    def take(self) -> list[str]:
        """The attempts since the last call, forgotten once read."""
        seen, self.attempts = self.attempts, []
        return seen


# Installed when the session selects exactly the unit lane (`-m unit`); None otherwise.
_NO_TORCH: _NoTorch | None = None


def _unit_lane(config: pytest.Config) -> bool:
    return (config.getoption("markexpr", "") or "").strip() == "unit"


def pytest_configure(config: pytest.Config) -> None:
    global _NO_TORCH
    config.addinivalue_line(
        "markers",
        "shared: reads ../shared/data (given to every test that uses the `shared_data` fixture)",
    )
    if _unit_lane(config):
        if "torch" in sys.modules:
            raise pytest.UsageError("the unit lane must start without torch imported")
        _NO_TORCH = _NoTorch()
        sys.meta_path.insert(0, _NO_TORCH)
    # For the whole session, fixtures of every scope included: no evaluation data (as on a
    # fresh clone), and none of a developer's own config overrides.
    os.environ[EVAL_DATA_ENV] = NO_EVAL_DATA
    os.environ.pop(OVERRIDES_ENV, None)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """In the unit lane, a test module without a `unit` mark is not even imported."""
    if _NO_TORCH is None or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_"):
        return None
    return "mark.unit" not in collection_path.read_text(encoding="utf-8")


def pytest_collection_finish(session: pytest.Session) -> None:
    if _NO_TORCH is not None and (seen := _NO_TORCH.take()):
        raise pytest.UsageError(f"a unit test module imports torch when collected: {seen}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "shared_data" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.shared)


def _real_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    if _REAL_EVAL_DATA is None:
        monkeypatch.delenv(EVAL_DATA_ENV, raising=False)
    else:
        monkeypatch.setenv(EVAL_DATA_ENV, _REAL_EVAL_DATA)


@pytest.fixture(autouse=True)
def _shared_data_only_when_asked(request: pytest.FixtureRequest, monkeypatch) -> None:
    """Tests with the `shared` marker see the evaluation data the way the library finds it;
    every other test sees none, whatever lies beside the checkout: a default that silently
    reads ../shared fails here, not on a user's fresh clone."""
    if request.node.get_closest_marker("shared") is not None:
        _real_lookup(monkeypatch)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Path to ../shared/data (real eval sets, GPT-2 tokenizer, tiny-shakespeare); skip if absent."""
    with pytest.MonkeyPatch.context() as mp:
        _real_lookup(mp)
        path = eval_data_dir()
    if path is None or not path.is_dir():
        pytest.skip("../shared/data is not present beside the checkout")
    return path


@pytest.fixture(autouse=True)
def _torch_free_when_unit(request: pytest.FixtureRequest) -> Iterator[None]:
    """In the unit lane, a test that tried to import torch fails (see the module's docstring)."""
    if _NO_TORCH is not None:
        _NO_TORCH.take()
    yield
    if _NO_TORCH is not None and (seen := _NO_TORCH.take()):
        pytest.fail(f"{request.node.nodeid} is marked unit but imports torch: {seen}")


@pytest.fixture(autouse=True)
def _few_threads(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests run on 2 cores; keep torch from oversubscribing when it is imported (a unit test
    leaves torch alone: it needs none, and in the unit lane it cannot have it)."""
    if request.node.get_closest_marker("unit") is not None:
        yield
        return
    try:
        import torch
    except ImportError:  # pure-python tests
        yield
        return
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)
