"""Structure: one home per model family (a toy fifth family from the docs needs one module and one
registry line), no import circle, and configs of taperlm 0.1 (every family's section, a top-level
`gate:`) still load, in run dirs, checkpoints and exports alike."""

from __future__ import annotations

import ast
import functools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import import_docs_example, raises_naming
from taperlm import families
from taperlm.cli import main
from taperlm.config import (
    ModelConfig,
    RunConfig,
    budget,
    from_dict,
    load_run_config,
    run_config_from_dict,
    to_dict,
)
from taperlm.config.presets import get_preset, preset_names
from taperlm.errors import ConfigError
from taperlm.models import TaperedLM
from taperlm.spec.taper import TaperSpec

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "taperlm"

# ----------------------------------------------------------------------------------------------
# a fifth family: the example of docs/architectures.md, run as written


@pytest.fixture
def plainmlp(tmp_path, monkeypatch):
    """The docs' module, imported from a file and registered with one line; unregistered after."""
    module = import_docs_example(
        "architectures.md", "## Adding a family", "plainmlp_family", tmp_path, monkeypatch
    )
    families.register(module.FAMILY)  # the one registry line
    yield module
    del families.FAMILIES[module.FAMILY.name]


def test_toy_family_from_the_docs_works_everywhere(plainmlp, capsys):
    names = preset_names()
    assert [
        f"plainmlp-{s}" for s in ("nano", "micro", "tiny", "small", "440m", "760m", "1.3b")
    ] == [n for n in names if n.startswith("plainmlp-")]
    cfg = get_preset("plainmlp-tiny", TaperSpec.parse("cosine"))
    assert cfg.family == "plainmlp" and cfg.plainmlp.activation == "gelu"
    # exact budgets: the formula equals numel, tapered equals uniform
    model = TaperedLM(cfg)
    assert model.num_params() == budget.total_params(cfg)
    assert budget.total_params(cfg) == budget.total_params(cfg.baseline())
    assert budget.flops_per_token(cfg) == budget.flops_per_token(cfg.baseline())
    assert [b.mlp[0].out_features for b in model.blocks] == cfg.mlp_widths
    # forward, backward, causality
    idx = torch.randint(0, cfg.vocab_size, (2, 12))
    model(idx, targets=idx).loss.backward()
    assert all(p.grad is not None for p in model.parameters())
    model.eval()
    with torch.no_grad():
        ref = model(idx).logits
        pert = idx.clone()
        pert[:, 6] = (pert[:, 6] + 1) % cfg.vocab_size
        assert torch.equal(model(pert).logits[:, :6], ref[:, :6])
    # YAML: only its own section, round trip, validation by key
    d = to_dict(RunConfig(model=cfg))
    assert d["model"]["plainmlp"] == {"activation": "gelu"}
    assert not {"hope", "titans", "gated", "gate"} & set(d["model"])
    assert to_dict(run_config_from_dict(d)) == d
    d["model"]["plainmlp"]["activation"] = "tanh"
    with raises_naming(ConfigError, "model.plainmlp.activation", "gelu, relu", "'tanh'"):
        run_config_from_dict(d).resolve()
    # the plan command shows the family's column
    assert main(["plan", "--preset", "plainmlp-tiny", "--taper", "cosine"]) == 0
    out = capsys.readouterr().out
    assert "activation" in out and out.count("gelu") == cfg.n_layers


def test_every_registered_family_is_complete():
    """Every family has presets that build, with exact budgets and its own YAML section only;
    a family with attention builds every layer with its own (tapered) query and KV heads."""
    for name, fam in families.FAMILIES.items():
        assert fam.name == name and fam.presets, name
        for prefix in fam.presets:
            cfg = get_preset(f"{prefix}-tiny", TaperSpec.parse("cosine"))
            assert TaperedLM(cfg).num_params() == budget.total_params(cfg), prefix
            d = to_dict(cfg)
            assert not (set(families.FAMILIES) - {name}) & set(d), prefix
            assert (name in d) == (fam.options is not None), prefix
            if fam.attention:
                cfg = cfg.with_taper(cfg.taper, head_taper="cosine", kv_taper="groups:0.5")
                model = TaperedLM(cfg)
                for block, b in zip(model.blocks, budget.layer_budgets(cfg)):
                    assert sum(p.numel() for p in block.parameters()) == b.params, prefix
                assert budget.total_params(cfg) == budget.total_params(cfg.baseline()), prefix


# ----------------------------------------------------------------------------------------------
# imports


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """taperlm module -> the taperlm modules it imports anywhere: at the top, inside functions,
    under TYPE_CHECKING, or by a string given to importlib.import_module. (Importing a submodule
    also runs its package's __init__; like other import-graph tools, that edge is not drawn.)"""
    modules = {_module_name(p): p for p in SRC.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                # `from pkg import submodule` imports the submodule; other names come from pkg
                subs = {f"{node.module}.{a.name}" for a in node.names} & set(modules)
                targets |= subs
                if len(subs) < len(node.names):
                    targets.add(node.module)
            elif isinstance(node, ast.Call) and ast.unparse(node.func).endswith("import_module"):
                targets |= {a.value for a in node.args if isinstance(a, ast.Constant)}
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    graph = _import_graph()
    assert _cycles(graph) == []
    fams = [m for m in graph if m.startswith("taperlm.families")]
    assert len(fams) >= 6
    for m in fams:  # families never reach back to the config (which imports them)
        assert not {"taperlm.config", "taperlm.config.presets", "taperlm.models.lm"} & graph[m], m


def test_models_and_families_do_not_zig_zag():
    """Families build their blocks from the torch modules of `taperlm.models`, which never import
    a family back, nor anything that imports the families (the config, the budget, the presets):
    the blocks read a config through `taperlm.spec.model_fields`, and `TaperedLM` is handed its
    family's block factory by the config (`ModelSpec.build_block`) instead of looking it up in
    `taperlm.families`. A family never imports `TaperedLM`."""
    upper = (
        "taperlm.families",
        "taperlm.config",
        "taperlm.config.budget",
        "taperlm.config.presets",
    )
    graph = _import_graph()
    assert "taperlm.models.lm" in graph
    for m, targets in graph.items():
        if m == "taperlm.models" or m.startswith("taperlm.models."):
            assert not [t for t in targets if t.startswith(upper)], m
        if m == "taperlm.spec.model_fields":
            assert targets <= {"taperlm.spec.taper"}, m
        if m.startswith("taperlm.families"):
            assert not {"taperlm.models", "taperlm.models.lm"} & targets, m


def _room(module: str) -> str:
    """The room of a module: its top-level module or package below `taperlm` (the package
    itself is a room of its own)."""
    return ".".join(module.split(".")[:2])


# Rooms that import each other (through different modules, so no module circle), kept with the
# reason; an entry whose loop is gone fails the test below, so the dict only shrinks.
KEPT_ROOM_LOOPS: dict[tuple[str, str], str] = {}


def test_no_two_rooms_import_each_other():
    """No room (a top-level module or package) imports another that imports it back, even
    through other modules: models and families (the config hands `TaperedLM` its block
    factory), spec and families (the families are written in the spec's vocabulary; the budget
    and the KV taper that read the families sit in config/), interop and training (the loader
    that training reads runs with sits in checkpoint/, below training; `importing` above it)."""
    rooms: dict[str, set[str]] = {}
    for m, targets in _import_graph().items():
        rooms.setdefault(_room(m), set()).update(_room(t) for t in targets if _room(t) != _room(m))
    loops = [tuple(c) for c in _cycles({r: t & set(rooms) for r, t in rooms.items()})]
    assert sorted(loops) == sorted(KEPT_ROOM_LOOPS), f"rooms that import each other: {loops}"
    # inside config/: the typed config never imports the presets or the assembly that read it,
    # and the budget reads a config through `ModelSpec` (`taperlm.spec.model_fields`)
    graph = _import_graph()
    readers = {"taperlm.config.presets", "taperlm.config.assembly"}
    for m in graph:
        if (m == "taperlm.config" or m.startswith("taperlm.config.")) and m not in readers:
            assert not readers & graph[m], m
    assert not {"taperlm.config", "taperlm.config.model"} & graph["taperlm.config.budget"]
    assert "taperlm.spec.model_fields" in graph["taperlm.config.budget"]


def test_config_families_and_plan_do_not_import_torch():
    code = (
        "import sys, taperlm.config, taperlm.families, taperlm.config.presets, taperlm.config.budget, "
        "taperlm.compare.grid\n"
        "from taperlm.cli import main\n"
        "main(['plan', '--preset', 'titans-mac-tiny', '--taper', 'cosine'])\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


# ----------------------------------------------------------------------------------------------
# configs of taperlm 0.1: every family's section, and `gate:` at the top level

V01_SECTIONS = """\
  gate: GATE
  hope:
    levels: 3
    level_fractions: [0.5, 0.25, 0.25]
    update_periods: [1, 4, 16]
    level_widths: null
  titans:
    variant: mag
    memory_heads: 4
    memory_head_dim: 64
    memory_depth: 2
    memory_expansion: 2
    chunk_size: 16
    conv_kernel: 4
    persistent_tokens: 4
    window: 512
    segment_len: 128
    max_inner_lr: 0.1
    memory_taper: uniform
    memory_multiple_of: 16
    memory_widths: null
"""


def _v01_model_yaml(family: str, gate: str = "elementwise") -> str:
    return (
        f"model:\n  family: {family}\n  vocab_size: 300\n  d_model: 32\n  n_layers: 3\n"
        "  n_heads: 2\n  n_kv_heads: null\n  mlp_width: 64\n"
        "  taper: {schedule: cosine, multiple_of: 16, start: 1.5, end: 0.5}\n"
        "  mlp_widths: null\n  context_length: 32\n  rope_theta: 10000.0\n  norm_eps: 1.0e-06\n"
        "  tie_embeddings: false\n  init_std: 0.02\n" + V01_SECTIONS.replace("GATE", gate)
    )


@pytest.mark.parametrize("family", ["transformer", "gated"])
def test_v01_configs_load_with_the_same_meaning(tmp_path, family):
    path = tmp_path / "config.yaml"
    path.write_text(_v01_model_yaml(family, gate="headwise"), encoding="utf-8")
    cfg = load_run_config(path).resolve()
    d = to_dict(cfg.model)
    assert not {"hope", "titans", "gate"} & set(d)
    if family == "gated":
        assert cfg.model.gated.gate == "headwise" and d["gated"] == {"gate": "headwise"}
        assert cfg.model.baseline().gated.gate == "headwise"
    else:
        assert "gated" not in d
    assert budget.total_params(cfg.model) == TaperedLM(cfg.model).num_params()
    # a bad old value is still named by its old key
    path.write_text(_v01_model_yaml(family, gate="scalar"), encoding="utf-8")
    with raises_naming(ConfigError, "model.gate", "'scalar'", "elementwise", "headwise"):
        load_run_config(path)


def test_v01_run_dir_loads_resumes_and_compares(tmp_path):
    """A run dir whose config.yaml and checkpoint manifest are in the 0.1 layout: the model loads,
    `taperlm train --out RUN` continues it, and compare sees no config conflict."""
    from fault_harness import corpus_text
    from taperlm.checkpoint.loading import load_run_model
    from taperlm.checkpoint.store import find_checkpoint
    from taperlm.compare.cell import _check_saved_config

    data = tmp_path / "data"
    (tmp_path / "corpus.txt").write_text(corpus_text(), encoding="utf-8")
    assert main(["prepare", "--source", str(tmp_path / "corpus.txt"), "--tokenizer", "bpe:300",
                 "--out", str(data), "--no-progress"]) == 0  # fmt: skip
    run = tmp_path / "run"
    base = [
        "train", "--config", str(tmp_path / "c.yaml"), "--data", str(data), "--out", str(run),
        "--no-progress", "--set", "train.seq_len=16", "--set", "train.micro_batch_size=2",
        "--set", "train.batch_tokens=32", "--set", "train.eval_tokens=32",
        "--set", "train.checkpoint_every=2", "--set", "train.warmup_tokens=0",
    ]  # fmt: skip
    (tmp_path / "c.yaml").write_text(_v01_model_yaml("transformer"), encoding="utf-8")
    assert main([*base, "--set", "train.tokens=128", "--stop-after-steps", "2"]) == 0
    # rewrite the run into the 0.1 layout: config.yaml and the manifest's run_config
    old = _v01_model_yaml("transformer").split("\n", 1)[1]
    saved = load_run_config(run / "config.yaml")
    text = (run / "config.yaml").read_text()
    assert "hope:" not in text and "gate:" not in text
    widths = saved.model.mlp_widths
    model_yaml = old.replace("  mlp_widths: null\n", f"  mlp_widths: {widths}\n")
    rest = text.split("\ndata:", 1)[1]
    (run / "config.yaml").write_text("model:\n" + model_yaml + "data:" + rest)
    ckpt = find_checkpoint(run)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    v01 = to_dict(load_run_config(run / "config.yaml"))
    import yaml

    v01["model"] = yaml.safe_load("m:\n" + model_yaml)["m"]
    manifest["run_config"] = v01
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    _, cfg = load_run_model(run)
    assert cfg.model.mlp_widths == widths and "hope" not in to_dict(cfg.model)
    # compare's cached result (a dict in the old layout) and the new config agree
    cell = type("Cell", (), {"config": cfg})()
    _check_saved_config(run, v01, cell, "was trained with a different config")
    # continue the run with its own (old) config.yaml: no conflict, finishes
    assert main(["train", "--out", str(run), "--no-progress"]) == 0
    assert find_checkpoint(run).name == "step_00000004"
    assert "hope:" not in (run / "config.yaml").read_text()  # rewritten in today's layout


def test_v01_export_config_loads():
    """The `taperlm` dict of a 0.1 export's config.json still builds the model."""
    import yaml

    old = yaml.safe_load(_v01_model_yaml("gated", gate="headwise"))["model"]
    cfg = from_dict(ModelConfig, old, "config.json:taperlm").resolve()
    assert cfg.family == "gated" and cfg.gated.gate == "headwise"
    assert TaperedLM(cfg).num_params() == budget.total_params(cfg)


def test_progress_bar_postfixes_are_formatted_text():
    """Every tqdm `set_postfix` in the library passes text it formatted itself: tqdm prints bare
    numbers with 3 significant digits (a step or token count of 6,100,000 as 6.1e+06)."""
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "set_postfix"):
                continue
            for kw in node.keywords:
                text = isinstance(kw.value, ast.JoinedStr) or (
                    isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, (str, bool))
                )
                if kw.arg != "refresh" and not text:
                    bad.append(f"{path.relative_to(SRC)}:{node.lineno} {kw.arg}")
    assert not bad, f"format these postfix values as text: {bad}"


# ----------------------------------------------------------------------------------------------
# the structure rules of docs/design.md, read from the code (AST only)

# The layers, low to high (docs/design.md#layers): a module imports only from its own layer or
# lower ones. A module is placed by its top-level name below `taperlm` (a package: all its modules).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("errors", "files", "runtime")),
    ("specification", ("spec", "families", "config")),
    ("model", ("models", "hf")),
    ("data", ("data",)),
    ("runs", ("checkpoint", "training", "evaluation", "analysis", "compress", "interop")),
    ("compare", ("compare",)),
    ("commands", ("commands",)),
    ("cli", ("cli",)),
)
# Upward imports with a documented reason (docs/design.md#layers): (importer prefix, imported
# prefix) -> why.
UPWARD_REASONS = {
    ("taperlm", "taperlm.hf.autoregister"): "the package registers with transformers' Auto "
    "classes only when the process imports them (nothing heavy is imported)",
    ("taperlm.families", "taperlm.models"): "a family describes its model in pure Python "
    "(config, budget and plan stay torch-free); only its block factory builds the torch module",
}
# Violations in files that other parts of issue 30 are moving: file -> the rules it breaks and
# why it waits. The lead empties this dict at merge (a stale entry fails the test below).
PENDING: dict[str, str] = {}
RULES = ("function-imports", "upward-imports")


@functools.cache
def _parsed(path: Path) -> tuple[str, ast.Module]:
    text = path.read_text(encoding="utf-8")
    return text, ast.parse(text)


def _src_files() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _pending(path: Path, rule: str) -> bool:
    return rule in PENDING.get(_rel(path), "")


def _core_dependencies() -> set[str]:
    """Import names of pyproject's core `dependencies` (an import of one of them inside a function
    needs a `# lazy:` reason; an optional extra's does not)."""
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
    dists = re.findall(r'^\s*"([A-Za-z0-9_.-]+)', block, re.M)
    import_names = {"pyyaml": "yaml"}
    return {import_names.get(d.lower(), d.lower().replace("-", "_")) for d in dists}


def _function_imports(path: Path, core: set[str]) -> list[str]:
    """Imports inside functions of the standard library, a core dependency or taperlm itself
    whose first line carries no `# lazy: <reason>`."""
    text, tree = _parsed(path)
    lines = text.splitlines()
    found = []
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(func):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            if isinstance(node, ast.Import):
                top = node.names[0].name.split(".")[0]
            else:
                top = "taperlm" if node.level else (node.module or "").split(".")[0]
            optional = top not in core and top not in sys.stdlib_module_names and top != "taperlm"
            reason = re.search(r"#\s*lazy:\s*\S", lines[node.lineno - 1])
            if not optional and not reason:
                found.append(f"{_rel(path)}:{node.lineno} {ast.unparse(node)}")
    return sorted(set(found))


def _layer_of(module: str) -> int:
    """The index in LAYERS of a taperlm module (the package itself: the foundation)."""
    if module == "taperlm":
        return 0
    parts = module.split(".")[1:]
    for i, (_, prefixes) in enumerate(LAYERS):
        if parts[0] in prefixes:
            return i
    raise AssertionError(
        f"{module} has no layer: add its top name to LAYERS here and to docs/design.md#layers"
    )


def _documented(importer: str, imported: str) -> bool:
    return any(
        (importer == a or importer.startswith(a + "."))
        and (imported == b or imported.startswith(b + "."))
        for a, b in UPWARD_REASONS
    )


@functools.cache
def _upward_imports() -> dict[str, list[str]]:
    """module file -> its imports of a higher layer without a documented reason."""
    found: dict[str, list[str]] = {}
    for importer, targets in _import_graph().items():
        for imported in sorted(targets):
            if _layer_of(imported) > _layer_of(importer) and not _documented(importer, imported):
                path = SRC.parent / (importer.replace(".", "/") + ".py")
                if not path.exists():
                    path = SRC.parent / importer.replace(".", "/") / "__init__.py"
                found.setdefault(_rel(path), []).append(
                    f"{importer} ({LAYERS[_layer_of(importer)][0]}) -> {imported} "
                    f"({LAYERS[_layer_of(imported)][0]})"
                )
    return found


def test_imports_sit_at_the_top_of_modules():
    """Inside a function only an optional extra's import, or one whose first line says why:
    `# lazy: <reason>` (e.g. `plan` stays torch-free). An import cycle is no reason."""
    core = _core_dependencies()
    assert {"torch", "numpy", "yaml", "tokenizers"} <= core
    inner = [
        i
        for p in _src_files()
        if not _pending(p, "function-imports")
        for i in _function_imports(p, core)
    ]
    assert not inner, f"move these imports to the top, or say why with `# lazy: <reason>`: {inner}"


def test_no_import_points_up_a_layer():
    up = {f: v for f, v in _upward_imports().items() if "upward-imports" not in PENDING.get(f, "")}
    assert not up, f"imports from a lower layer to a higher one (docs/design.md#layers): {up}"


def test_pending_entries_still_break_their_rules():
    """PENDING shrinks to nothing: an entry whose file keeps every rule it names must go."""
    core = _core_dependencies()
    up = _upward_imports()
    stale = []
    for rel, reason in PENDING.items():
        path = REPO / rel
        rules = [r for r in RULES if r in reason]
        assert rules, f"{rel}: PENDING names none of {RULES}"
        if not path.exists():
            stale.append(f"{rel} (no such file)")
            continue
        broken = {
            "function-imports": bool(_function_imports(path, core)),
            "upward-imports": rel in up,
        }
        stale += [f"{rel}: {r}" for r in rules if not broken[r]]
    assert not stale, f"remove these from PENDING, they keep the rule now: {stale}"


# What is not in the repository: the maintainers' notes and reference files beside it, and this
# machine's folders. Code and docs cite the repo's own pages (docs/paper.md#...) instead.
OUTSIDE_FILES = re.compile(
    r"\b(PAPER|DESIGN|ARCHITECTURES|ECOSYSTEM|DEVELOPERS)\.md\b|shared/(data/README|reference)|/work/"
)


def test_no_citation_of_files_outside_the_repository():
    files = [REPO / "README.md", *(REPO / "docs").rglob("*.md"), *_src_files()]
    files += [*(REPO / "benchmarks").rglob("*.py"), *(REPO / "configs").rglob("*.yaml")]
    cites = [
        f"{_rel(p)}:{i}"
        for p in files
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE_FILES.search(line)
    ]
    assert not cites, f"cite a page of the repository (docs/paper.md#...) instead: {cites}"


# A repository path cited in backticks: `src/taperlm/...`, `docs/...`, `benchmarks/...`,
# `configs/...`, `tests/...`, `scripts/...` (globs, placeholders and run outputs aside).
CITED_PATH = re.compile(r"`((?:src/taperlm|docs|benchmarks|configs|tests|scripts)/[\w./-]+)")


def test_every_repository_path_the_docs_cite_exists():
    """README and docs name files a reader will open; a moved module must not leave a pointer
    behind (README once sent readers to `src/taperlm/config.py` after it became a package)."""
    files = [REPO / "README.md", *(REPO / "docs").rglob("*.md"), REPO / "CONTRIBUTING.md"]
    missing = []
    for p in files:
        if not p.exists():
            continue
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            for cited in CITED_PATH.findall(line):
                path = cited.split("::")[0].rstrip(".")
                if any(c in path for c in "*<>{}") or path.startswith("benchmarks/results/"):
                    continue
                if f"Saved as `{cited}" in line:  # a file the page tells the reader to create
                    continue
                if not (REPO / path).exists():
                    missing.append(f"{_rel(p)}:{i} {path}")
    assert not missing, f"these cited paths do not exist (fix the pointer): {missing}"


def _readme_layout() -> set[str]:
    """The module paths (below src/taperlm) that README's Layout block names. A line indented by
    two spaces starts a folder (`data/  a.py b.py`) or lists top-level modules (`cli.py ...`);
    a deeper line continues the folder above; a `sub/` token inside a folder's line opens a
    subpackage for the rest of the line; `#` starts a comment."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    listed: set[str] = set()
    folder = ""
    for raw in block.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        tokens = line.split()
        if not tokens or tokens[0] == "src/taperlm/" or not raw.startswith("  "):
            continue
        if not raw.startswith("   "):  # two spaces: a new folder, or top-level modules
            folder = tokens[0] if tokens[0].endswith("/") else ""
            tokens = tokens[1:] if folder else tokens
        prefix = folder
        for token in tokens:
            if token.endswith("/"):
                prefix = folder + token
            elif token.endswith(".py"):
                listed.add(prefix + token)
    return listed


def test_readme_layout_lists_every_module():
    modules = {p.relative_to(SRC).as_posix() for p in _src_files() if p.name != "__init__.py"}
    listed = _readme_layout()
    missing: dict[str, list[str]] = {}
    for m in sorted(modules - listed):
        folder, _, name = m.rpartition("/")
        missing.setdefault(folder + "/" if folder else "(top level)", []).append(name)
    lines = "\n".join(f"  {folder}  {' '.join(names)}" for folder, names in missing.items())
    assert not missing, f"README.md's Layout misses these modules; add them:\n{lines}"
    assert not listed - modules, (
        f"README.md's Layout names modules that do not exist: {listed - modules}"
    )


def test_a_package_map_names_every_module():
    """A package whose docstring names its modules (a map for the reader: compare, training,
    data, checkpoint, ...) names all of them, so that a module added or moved cannot leave the
    map stale; packages whose docstring names none are not maps."""
    stale = {}
    for init in sorted(SRC.glob("*/__init__.py")):
        pkg = init.parent
        doc = ast.get_docstring(_parsed(init)[1]) or ""
        modules = [p.stem for p in pkg.glob("*.py") if p.stem != "__init__"]
        modules += [p.name for p in pkg.iterdir() if (p / "__init__.py").is_file()]
        named = [m for m in modules if re.search(rf"`{m}(\.py|/)?`", doc)]
        if named and len(named) < len(modules):
            stale[pkg.name] = sorted(set(modules) - set(named))
    assert not stale, f"package docstrings that list modules but miss some: {stale}"
