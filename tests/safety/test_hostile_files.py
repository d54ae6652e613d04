"""Issue 26, class 1: no file we read runs code.

A payload (a pickle whose `__reduce__` creates a marker file, or code files an `auto_map` points
at) is planted in every kind of file taperlm reads -- a checkpoint's DCP `.metadata`, its
`state.pt`, the byte items inside its shards, a run's `config.yaml`, a Hugging Face model folder's
`auto_map` code, a tokenizer folder's `auto_map` -- with the manifest's hashes updated (whoever
can write a file can rewrite its hash). Every command that reads the file (eval, export,
generate, novelty, train resume, prepare) must stop with a clear error or ignore the code, and
the marker must never appear. `test_every_deserialisation_path_is_allowed` walks src/ for every
deserialisation and dynamic-code call and fails on one that is not in `ALLOWED` with a reason.
"""

from __future__ import annotations

import enum
import io
import json
import os
import pickle
import re
import shutil
import tokenize
from pathlib import Path

import pytest

import fault_harness as H
from conftest import assert_own_options
from taperlm.cli import main as cli_main

SRC = Path(__file__).resolve().parents[2] / "src" / "taperlm"


class Payload:
    """Unpickling this creates `marker` (the stand-in for any shell command)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def hostile_pickle(marker: Path) -> bytes:
    return pickle.dumps({"step": Payload(marker)})


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return H.prepare_data(tmp_path_factory.mktemp("hostile"))


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("trained") / "run"
    assert cli_main([*H.train_argv(data, run), "--stop-after-steps", "2"]) == 0
    return run


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("text") / "text.txt"
    p.write_text(H.corpus_text(2000), encoding="utf-8")
    return p


def _newest(run: Path) -> Path:
    return sorted((run / "checkpoints").glob("step_*"))[-1]


def _rehash(ckpt: Path) -> None:
    """Rewrite the manifest's hashes so the altered file verifies (what an attacker does)."""
    manifest = json.loads((ckpt / "manifest.json").read_text())
    for name in manifest["files"]:
        manifest["files"][name] = {
            "sha256": H._sha256(ckpt / name),
            "bytes": (ckpt / name).stat().st_size,
        }
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


def _plant_metadata(run: Path, marker: Path) -> None:
    ckpt = _newest(run)
    (ckpt / ".metadata").write_bytes(hostile_pickle(marker))
    _rehash(ckpt)


def _plant_state(run: Path, marker: Path) -> None:
    import torch

    ckpt = _newest(run)
    buf = io.BytesIO()
    torch.save({"step": Payload(marker)}, buf)
    (ckpt / "state.pt").write_bytes(buf.getvalue())
    _rehash(ckpt)


def _plant_config(run: Path, marker: Path) -> None:
    text = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(
        f"x: !!python/object/apply:os.system ['touch {marker}']\n" + text
    )


PLANTS = {"dcp_metadata": _plant_metadata, "state_pt": _plant_state, "config_yaml": _plant_config}
# Which commands read each planted file (config.yaml: resume reads it; eval etc. too).
COMMANDS = {
    "eval": lambda run, tmp, text: ["eval", str(run), "--tasks", "val"],
    "export": lambda run, tmp, text: ["export", str(run), "--out", str(tmp / "export")],
    "generate": lambda run, tmp, text: ["generate", str(run), "--max-new-tokens", "4"],
    "novelty": lambda run, tmp, text: ["novelty", str(run), "--data", str(text), "--tokens", "64"],
    "train_resume": None,  # built from the data fixture below
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_payload_in_a_run_never_runs(plant, command, trained, data, text_file, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    marker = tmp_path / "PWNED"
    PLANTS[plant](run, marker)
    if command == "train_resume":
        argv = H.train_argv(data, run)
    else:
        argv = COMMANDS[command](run, tmp_path, text_file)
    try:
        rc = cli_main(argv)
    except SystemExit as exc:  # argparse
        rc = exc.code
    err = capsys.readouterr().err
    assert not marker.exists(), f"{plant} ran code in {command}"
    assert rc == 2, err[-2000:]
    assert "Traceback" not in err
    assert_own_options(argv[0], err)
    assert err.startswith(f"taperlm {argv[0]}: error: "), err
    needle = {
        "dcp_metadata": "refers to posix.system, which a checkpoint index never holds",
        "state_pt": "state.pt cannot be read",
        "config_yaml": "config.yaml",
    }[plant]
    assert needle in err, err


def test_byte_items_of_shards_are_read_without_pickle_globals(tmp_path):
    """Non-tensor items inside `.distcp` shards (optimizer hyperparameters) go through
    `SafeLoadPlanner.load_bytes`, which is `torch.load(weights_only=True)`."""
    import torch
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.planner import LoadItemType, ReadItem

    from taperlm.checkpoint import safe_load

    marker = tmp_path / "PWNED"
    buf = io.BytesIO()
    torch.save(Payload(marker), buf)
    buf.seek(0)
    planner = safe_load.planner()
    planner.set_up_planner({"x": 1.0}, None, True)
    planner.mappings = {"x": ("x",)}
    item = ReadItem(
        LoadItemType.BYTE_IO,
        MetadataIndex("x"),
        torch.Size([0]),
        MetadataIndex("x"),
        torch.Size([0]),
        torch.Size([0]),
    )
    with pytest.raises(pickle.UnpicklingError):
        planner.load_bytes(item, buf)
    assert not marker.exists()
    ok = io.BytesIO()
    torch.save({"lr": 0.1, "betas": (0.9, 0.95)}, ok)
    ok.seek(0)
    planner.load_bytes(item, ok)
    assert planner.original_state_dict["x"] == {"lr": 0.1, "betas": (0.9, 0.95)}


def test_metadata_allow_list_covers_a_real_checkpoint(trained):
    """The allow-list admits everything a checkpoint written by this torch holds."""
    from taperlm.checkpoint import safe_load

    meta = safe_load.read_metadata(_newest(trained))
    assert any(k.startswith("model.") for k in meta.state_dict_metadata)


class _EnumsByName(pickle.Pickler):
    """Pickles an enum member as `getattr(EnumClass, "NAME")`, as Python 3.11.2 (Debian 12's)
    does, whichever Python runs the test."""

    def reducer_override(self, obj):
        if isinstance(obj, enum.Enum):
            return getattr, (type(obj), obj.name)
        return NotImplemented


class _EnumsByValue(pickle.Pickler):
    """Pickles an enum member as `EnumClass(value)`, as other Pythons (3.11.7, 3.12) do."""

    def reducer_override(self, obj):
        if isinstance(obj, enum.Enum):
            return type(obj), (obj.value,)
        return NotImplemented


def _pickled(obj, pickler=pickle.Pickler) -> bytes:
    buf = io.BytesIO()
    pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def test_an_index_whose_enums_are_pickled_by_name_reads_the_same(trained, tmp_path):
    """A checkpoint written under either Python reads under either: its index re-pickled with
    every enum by name (Debian 12's python) and by value (others) reads equal to the original."""
    from taperlm.checkpoint import safe_load

    ckpt = tmp_path / "ckpt"
    shutil.copytree(_newest(trained), ckpt)
    meta = safe_load.read_metadata(ckpt)
    by_name, by_value = _pickled(meta, _EnumsByName), _pickled(meta, _EnumsByValue)
    assert b"getattr" in by_name and b"getattr" not in by_value
    for data in (by_name, by_value):
        (ckpt / safe_load.METADATA_FILE).write_bytes(data)
        assert safe_load.read_metadata(ckpt) == meta


def test_getattr_in_an_index_reaches_allowed_enum_members_only():
    """Every member of every allow-listed enum reads back by name and by value; a getattr of
    anything else (a method, a class attribute, an enum outside the list) stops the read."""
    import importlib

    from taperlm.checkpoint import safe_load
    from taperlm.errors import CheckpointError

    def load(data: bytes):
        return safe_load._IndexUnpickler(io.BytesIO(data), Path("x/.metadata")).load()

    enums = [
        getattr(importlib.import_module(module), name)
        for module, names in safe_load.ALLOWED.items()
        for name in names
        if isinstance(getattr(importlib.import_module(module), name), enum.EnumMeta)
    ]
    assert len(enums) >= 3  # _MEM_FORMAT_ENCODING, LoadItemType, WriteItemType
    for cls in enums:
        for member in cls:
            assert load(_pickled(member, _EnumsByName)) is member
            assert load(_pickled(member, _EnumsByValue)) is member

    class Reduce:
        def __init__(self, *args) -> None:
            self.args = args

        def __reduce__(self):
            return getattr, self.args

    from torch.distributed.checkpoint.metadata import Metadata

    member = enums[0]
    for target, attr in (
        (Metadata, "__init__"),  # an allowed class that is no enum
        (member, "__class__"),  # an enum's attribute that is no member
        (Path, "home"),  # an allowed class's method
        (enum.Enum, "__new__"),  # an enum class outside the list
    ):
        with pytest.raises(CheckpointError, match="never holds"):
            load(_pickled(Reduce(target, attr)))


def _hf_folder_with_code(folder: Path, marker: Path, model_type: str) -> None:
    code = f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
    (folder / "modeling_evil.py").write_text(code)
    (folder / "configuration_evil.py").write_text(code)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model_type"] = model_type
    cfg["auto_map"] = {
        "AutoConfig": "configuration_evil.EvilConfig",
        "AutoModelForCausalLM": "modeling_evil.EvilModel",
    }
    (folder / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("model_type", ["taperlm", "evil"])
def test_model_folder_code_runs_only_with_the_flag(
    model_type, trained, text_file, tmp_path, capsys
):
    """A Hugging Face model folder whose config's auto_map points at code files: novelty (the
    one command that loads arbitrary HF folders) never imports them without
    --trust-remote-code; a taperlm export loads through the registered classes instead."""
    pytest.importorskip("transformers")
    folder = tmp_path / "export"
    assert cli_main(["export", str(trained), "--out", str(folder)]) == 0
    marker = tmp_path / "PWNED"
    _hf_folder_with_code(folder, marker, model_type)
    for name in ("modeling_taperlm.py", "configuration_taperlm.py"):  # the export's own too
        (folder / name).write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    capsys.readouterr()
    rc = cli_main(["novelty", str(folder), "--data", str(text_file), "--tokens", "64"])
    err = capsys.readouterr().err
    assert not marker.exists()
    if model_type == "taperlm":
        assert rc == 0, err
    else:
        assert rc == 2 and "--trust-remote-code" in err, err


def test_tokenizer_folder_code_never_runs(tmp_path, data, capsys):
    """`prepare --tokenizer hf:FOLDER` whose tokenizer_config.json has an auto_map."""
    pytest.importorskip("transformers")
    folder = tmp_path / "tok"
    folder.mkdir()
    marker = tmp_path / "PWNED"
    (folder / "tokenization_evil.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
    )
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"auto_map": {"AutoTokenizer": ["tokenization_evil.Evil", None]}})
    )
    (folder / "config.json").write_text(json.dumps({"model_type": "evil"}))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(H.corpus_text(500))
    rc = cli_main(
        [
            "prepare",
            "--source",
            str(corpus),
            "--tokenizer",
            f"hf:{folder}",
            "--out",
            str(tmp_path / "d"),
        ]
    )
    err = capsys.readouterr().err
    assert not marker.exists()
    assert rc == 2
    assert "taperlm prepare: error: could not load Hugging Face tokenizer" in err, err


# ----------------------------------------------------------------------------------------------
# every deserialisation / dynamic-code call in src/ is known

# (file relative to src/taperlm, pattern name) -> why it cannot run code from a file we read.
ALLOWED: dict[tuple[str, str], str] = {
    ("checkpoint/safe_load.py", "pickle"): "the allow-listed unpickler of DCP .metadata",
    ("checkpoint/safe_load.py", "torch.load"): "weights_only=True for DCP byte items",
    ("checkpoint/store.py", "torch.load"): "state.pt with weights_only=True",
    ("compare/workers.py", "pickle"): (
        "an exception passed from our own forked compare worker over a multiprocessing pipe, "
        "never a file"
    ),
    (
        "checkpoint/safe_load.py",
        "dcp reader",
    ): "SafeReader: FileSystemReader with the allow-list",
    ("cli.py", "import_module"): "taperlm.commands.<name> for a fixed table of command names",
    ("cli.py", "importlib"): "(the import of import_module above)",
    ("commands/common.py", "import_module"): "taperlm.commands.<name> as cli.py names it",
    ("commands/common.py", "importlib"): "(the import of import_module above)",
    (
        "compare/study.py",
        "import_module",
    ): "the study functions of options.PAPER_STUDIES, our table",
    ("compare/study.py", "importlib"): "(the import of import_module above)",
    (
        "compare/execute.py",
        "import_module",
    ): "--executor's implementation from EXECUTORS, our table",
    ("compare/execute.py", "importlib"): "(the import of import_module above)",
    ("data/readers.py", "importlib"): "(the import of import_module above)",
    ("data/readers.py", "import_module"): "optional packages by their fixed names (zstandard, ...)",
    ("analysis/sources.py", "trust_remote_code"): "passes the user's --trust-remote-code flag",
    ("data/tokenizer.py", "trust_remote_code"): "trust_remote_code=False, explicitly",
    ("evaluation/harness.py", "importlib"): "importlib.resources: our packaged task templates",
    ("hf/autoregister.py", "importlib"): "a meta-path hook registering taperlm with transformers",
    (
        "files/io.py",
        "yaml.load",
    ): "parse_yaml: StrictLoader, a SafeLoader subclass (builds no objects)",
    ("training/loggers.py", "importlib"): "find_spec of the optional logger packages by fixed name",
}

PATTERNS = {
    "pickle": re.compile(r"\bpickle\.(loads?|Unpickler)\b|\bimport pickle\b"),
    "torch.load": re.compile(r"\btorch\.load\("),
    "yaml.load": re.compile(
        r"\byaml\.(load|unsafe_load|full_load|load_all)\(|yaml\.(Unsafe|Full)?Loader\b"
    ),
    "trust_remote_code": re.compile(r"trust_remote_code\s*="),
    "import_module": re.compile(r"\bimport_module\(|__import__\("),
    "importlib": re.compile(r"\bimport importlib\b|\bfrom importlib\b"),
    "eval/exec": re.compile(r"(?<![\w.])(eval|exec|compile)\("),
    "allow_pickle": re.compile(r"allow_pickle\s*=\s*True|weights_only\s*=\s*False"),
    "other serialisers": re.compile(r"\b(marshal|shelve|dill|cloudpickle|joblib)\b"),
    "dcp reader": re.compile(r"\bFileSystemReader\b|\bcheckpoint_id="),
}


_NOT_CODE = {tokenize.STRING, tokenize.COMMENT} | {
    getattr(tokenize, n)
    for n in ("FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END")
    if hasattr(tokenize, n)
}


def code_lines(path: Path) -> list[str]:
    """The lines of a module with strings and comments removed (messages may name anything)."""
    lines: dict[int, list[str]] = {}
    with open(path, encoding="utf-8") as f:
        for tok in tokenize.generate_tokens(f.readline):
            if tok.type in _NOT_CODE:
                continue
            lines.setdefault(tok.start[0], []).append(tok.string)
    return [
        " ".join(parts).replace(" . ", ".").replace(" (", "(").replace(" = ", "=")
        for parts in lines.values()
    ]


def _hits() -> set[tuple[str, str]]:
    found = set()
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        for code in code_lines(path):
            for name, pattern in PATTERNS.items():
                if pattern.search(code):
                    found.add((rel, name))
    return found


@pytest.mark.unit
def test_every_deserialisation_path_is_allowed():
    hits = _hits()
    unknown = sorted(hits - set(ALLOWED))
    assert not unknown, (
        f"new deserialisation / dynamic-code uses, add a reason to ALLOWED: {unknown}"
    )
    stale = sorted(set(ALLOWED) - hits)
    assert not stale, f"ALLOWED names uses that no longer exist: {stale}"


@pytest.mark.unit
def test_torch_load_is_weights_only_everywhere():
    calls = [
        (path, line)
        for path in SRC.rglob("*.py")
        for line in code_lines(path)
        if PATTERNS["torch.load"].search(line)
    ]
    assert calls
    for path, line in calls:  # each of our calls fits on one line
        assert "weights_only=True" in line, f"{path}: {line}"


@pytest.mark.unit
def test_the_walk_would_catch_a_new_use(monkeypatch):
    """The walk is not vacuous: a plain pickle.load in a new module is reported."""
    assert PATTERNS["pickle"].search("    data = pickle.load(f)")
    assert PATTERNS["dcp reader"].search("FileSystemReader(str(path)).read_metadata()")
    assert PATTERNS["yaml.load"].search("yaml.load(text, Loader=yaml.Loader)")
    assert PATTERNS["eval/exec"].search("x = eval(text)")
    assert not PATTERNS["eval/exec"].search("model.eval()")
