"""The package as users install it: one source of the version, package data that covers every
non-Python file of the package, and (slow; CI runs it) `python -m build` of a clean copy of the
checkout giving a wheel and an sdist that pass `twine check` and, each installed in a fresh
virtual environment, run `taperlm --version`, `taperlm plan` and a tiny `prepare` + `train`.

The environments see this interpreter's site-packages after their own and are installed into
with --no-index: the dependencies (torch is 200+ MB) come from this interpreter's installation,
offline, while pip still resolves every requirement of the package's metadata against them (a
missing or incompatible dependency fails the install), and taperlm itself comes from the wheel
or sdist (the test checks where it is imported from, since an editable install may also be
visible). This interpreter may itself be a virtual environment (CI's: `.ci/run`).
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import taperlm
from taperlm.cli import main

REPO = Path(__file__).resolve().parents[2]


def _pyproject() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def _tracked_package_files() -> list[str]:
    """Files git tracks under src/taperlm, relative to src/ (skip outside a git checkout)."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(
        ["git", "ls-files", "src/taperlm"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    return [line.removeprefix("src/") for line in out.splitlines() if line]


def test_version_has_one_source(capsys) -> None:
    project = _pyproject()
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "taperlm.__version__"}
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"taperlm {taperlm.__version__}"
    changelog = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert f"## {taperlm.__version__}" in changelog


def test_package_data_covers_every_non_python_file() -> None:
    """A file the package reads at run time (task YAMLs, ...) must reach the wheel: every
    tracked non-Python file under src/taperlm matches a package-data pattern."""
    patterns = _pyproject()["tool"]["setuptools"]["package-data"]["taperlm"]
    data = [f for f in _tracked_package_files() if not f.endswith(".py")]
    assert data, "expected the lm-eval task YAMLs at least"

    def covered(rel: str) -> bool:  # rel: path inside the package; "**/" also matches no folder
        return any(
            fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(rel, p.removeprefix("**/")) for p in patterns
        )

    missing = [f for f in data if not covered(f.removeprefix("taperlm/"))]
    assert not missing, f"add these to [tool.setuptools.package-data] in pyproject.toml: {missing}"


# ----------------------------------------------------------------------------------------------
# build, check, install, run


def _run(argv: list[str], cwd: Path, **kw) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)  # the installed package, not this checkout's src/
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{argv}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _clean_copy(dest: Path) -> Path:
    """The tracked files of the checkout (what a fresh clone has), without build outputs."""
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, files):
        src = REPO / name.decode()
        if src.is_file():
            (dest / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name.decode())
    return dest


def _venv_with(package: Path, root: Path) -> Path:
    """A fresh virtual environment with `package` (wheel or sdist) installed offline; its bin."""
    # without pip of its own: its bundled pip/setuptools would shadow the installed ones (torch
    # needs a newer setuptools than venv bundles); this interpreter's pip installs into it
    _run([sys.executable, "-m", "venv", "--without-pip", str(root)], cwd=root.parent)
    py = root / "bin" / "python"
    # This interpreter's site-packages after the environment's own, as site dirs (their .pth files
    # apply). Not --system-site-packages: where this interpreter is itself a virtual environment,
    # that would give the base interpreter's packages, without torch.
    own = _run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
               cwd=root.parent).strip()  # fmt: skip
    ours = dict.fromkeys([*site.getsitepackages(), sysconfig.get_paths()["purelib"]])
    lines = [f"import site; site.addsitedir({d!r})" for d in ours if Path(d).is_dir()]
    (Path(own) / "_this_interpreters_site.pth").write_text("\n".join(lines) + "\n")
    _run([str(py), "-m", "pip", "install", "--quiet", "--no-index", "--no-build-isolation",
          str(package)], cwd=root.parent)  # fmt: skip
    where = _run([str(py), "-c", "import taperlm; print(taperlm.__file__)"], cwd=root.parent)
    assert Path(where.strip()).is_relative_to(root), f"taperlm imported from {where}"
    return root / "bin"


def _use(bin_dir: Path, work: Path) -> None:
    """`taperlm --version`, `plan`, and a tiny prepare + train with the installed CLI."""
    taperlm_cli = str(bin_dir / "taperlm")
    out = _run([taperlm_cli, "--version"], cwd=work)
    assert out.strip() == f"taperlm {taperlm.__version__}"
    out = _run([taperlm_cli, "plan", "--preset", "transformer-tiny", "--taper", "cosine"], cwd=work)
    assert "budget matched" in out
    text = work / "corpus.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 400, encoding="utf-8")
    _run([taperlm_cli, "prepare", "--source", str(text), "--tokenizer", "bpe:300",
          "--val-tokens", "256", "--out", "data", "--workers", "1", "--no-progress"], cwd=work)  # fmt: skip
    sets = ["model.n_layers=2", "model.d_model=32", "model.n_heads=2", "model.mlp_width=64",
            "model.vocab_size=320", "train.seq_len=32", "train.micro_batch_size=4",
            "train.batch_tokens=128", "train.tokens=256", "train.eval_tokens=128"]  # fmt: skip
    argv = [taperlm_cli, "train", "--preset", "transformer-tiny", "--taper", "cosine",
            "--data", "data", "--out", "run", "--no-progress"]  # fmt: skip
    for s in sets:
        argv += ["--set", s]
    _run(argv, cwd=work)
    assert (work / "run" / "metrics.jsonl").is_file()


@pytest.mark.slow
def test_wheel_and_sdist_build_check_install_and_run(tmp_path: Path) -> None:
    """About 1-2 minutes on 2 cores: the build (no network: --no-isolation), two venvs."""
    pytest.importorskip("build")
    src = _clean_copy(tmp_path / "checkout")
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), "."], cwd=src)
    wheel, sdist = next(dist.glob("*.whl")), next(dist.glob("*.tar.gz"))
    assert wheel.name.startswith(f"taperlm-{taperlm.__version__}-")
    assert sdist.name == f"taperlm-{taperlm.__version__}.tar.gz"
    if _has("twine"):
        out = _run(
            [sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)], cwd=src
        )
        assert out.count("PASSED") == 2
    # every tracked file of the package, data included, is in the wheel
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [f for f in _tracked_package_files() if f not in names]
    assert not missing, f"not in the wheel: {missing}"
    for name, package in (("wheel", wheel), ("sdist", sdist)):
        work = tmp_path / f"use-{name}"
        work.mkdir()
        _use(_venv_with(package, tmp_path / f"venv-{name}"), work)


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None
