"""Issue 41, classes 2 (YAML part), 4 and 6 (merges): one bounded reader for every structured file.

A JSON or YAML file nested 200,000 deep was a RecursionError traceback from every reader; a
418-byte YAML alias bomb ran to the memory cap. Now every JSON/YAML parse in src/ goes through
`taperlm.files.io` (`read_json`/`parse_json`/`read_yaml`/`parse_yaml`): sizes checked before reading,
depth and alias expansion before parsing, one clear error naming the file.

- `test_every_structured_parse_goes_through_the_bounded_reader` walks src/ and fails on any
  json/yaml parse call outside files/io.py (a new unbounded reader fails it);
- the shapes (deep arrays, objects, block and flow YAML, alias bombs, aliases that nest deep,
  huge integers) are tried on the parsers;
- every structured file kind taperlm reads is made deep and read by the command that reads it;
- the YAML ones under three parsers of events (the installed one, PyYAML's pure-Python one, and
  one with a nesting limit of its own, as libyaml 0.2.5 in PyYAML 6.0.4's wheels has, which
  refuses a deep flow collection before its first event): the error is the reader's own, and
  names the file and the problem, whichever parser saw the text first.
"""

from __future__ import annotations

import ast
import json
import shutil
import time
from pathlib import Path

import pytest
import yaml
from yaml.scanner import ScannerError

import fault_harness as H
import taperlm.files.io
from conftest import assert_own_options, raises_naming
from taperlm.cli import main as cli_main
from taperlm.errors import ConfigError, MalformedFileError
from taperlm.files.io import (
    MAX_DEPTH,
    MAX_MESSAGE,
    json_depth,
    parse_json,
    parse_yaml,
    read_json,
    read_yaml,
)

SRC = Path(__file__).resolve().parents[2] / "src" / "taperlm"
DEEP = 200_000

# ----------------------------------------------------------------------------------------------
# the walk: no parse of JSON or YAML outside the bounded reader

PARSERS = {
    "json": {"load", "loads"},
    "yaml": {
        *("load", "safe_load", "full_load", "unsafe_load", "load_all", "safe_load_all"),
        *("compose", "compose_all", "parse"),
    },
    "tomllib": {"load", "loads"},
}


def parse_calls(source: str) -> list[str]:
    """`module.function` of every call in `source` to a JSON/YAML/TOML parser (by attribute on
    the module, or a name imported from it)."""
    tree = ast.parse(source)
    imported = {
        alias.asname or alias.name: f"{node.module}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module in PARSERS
        for alias in node.names
        if alias.name in PARSERS[node.module]
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            if f.value.id in PARSERS and f.attr in PARSERS[f.value.id]:
                found.append(f"{f.value.id}.{f.attr}")
        elif isinstance(f, ast.Name) and f.id in imported:
            found.append(imported[f.id])
    return found


@pytest.mark.unit
def test_every_structured_parse_goes_through_the_bounded_reader():
    """Only taperlm/files/io.py parses JSON or YAML; every other module reads through it."""
    offenders = {
        path.relative_to(SRC).as_posix(): calls
        for path in sorted(SRC.rglob("*.py"))
        if path != SRC / "files/io.py"
        if (calls := parse_calls(path.read_text(encoding="utf-8")))
    }
    assert not offenders, (
        f"JSON/YAML parsed outside taperlm.files.io (use read_json/parse_json/read_yaml/parse_yaml, "
        f"which bound size, depth and aliases): {offenders}"
    )
    assert parse_calls((SRC / "files/io.py").read_text(encoding="utf-8"))  # the walk sees io.py's


@pytest.mark.unit
def test_the_walk_would_catch_a_new_reader():
    assert parse_calls("import json\nx = json.loads(t)\n") == ["json.loads"]
    assert parse_calls("from json import load as L\nL(f)\n") == ["json.load"]
    assert parse_calls("import yaml\nyaml.safe_load(t)\n") == ["yaml.safe_load"]
    assert parse_calls("json.dumps(x)\n") == []


# ----------------------------------------------------------------------------------------------
# the shapes


DEEP_JSON = {
    "arrays": "[" * DEEP + "]" * DEEP,
    "objects": '{"a":' * DEEP + "1" + "}" * DEEP,
    "mixed": '[{"a":' * (DEEP // 2) + "1" + "}]" * (DEEP // 2),
    "unclosed": "[" * DEEP,
}
DEEP_YAML = {
    "flow": "[" * DEEP + "]" * DEEP,
    "flow mapping": "{a: " * DEEP + "1" + "}" * DEEP,
    "block sequence": "- " * DEEP + "x\n",
    "under a key": "model:\n  taper: " + "[" * DEEP + "]" * DEEP + "\n",
}
# each level holds 9 aliases of the one before: 9^9 strings from a few hundred bytes
BOMB = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi")
)
# aliases that stay small but nest deep: each level wraps the one before
ALIAS_DEPTH = "a0: &a0 [x]\n" + "".join(f"a{i + 1}: &a{i + 1} [*a{i}]\n" for i in range(200))


class NestingLimitedLoader(yaml.SafeLoader):
    """A YAML parser with a nesting limit of its own, as libyaml 0.2.5 has (PyYAML 6.0.4's
    wheels): past 1,000 levels it raises a ScannerError, in flow style before its first event
    (it looks ahead up to 1,024 characters for a key)."""

    LIMIT = 1000

    def fetch_flow_collection_start(self, TokenClass):
        if self.flow_level >= self.LIMIT:
            raise ScannerError(
                "while increasing flow level", None, "exceeded maximum nesting depth",
                self.get_mark(),
            )  # fmt: skip
        super().fetch_flow_collection_start(TokenClass)

    def add_indent(self, column: int) -> bool:
        if len(self.indents) >= self.LIMIT:
            raise ScannerError(
                "while increasing block level", None, "exceeded maximum nesting depth",
                self.get_mark(),
            )  # fmt: skip
        return super().add_indent(column)


EVENT_PARSERS = {
    "installed": taperlm.files.io._YAML_EVENTS_LOADER,
    "pure Python": yaml.SafeLoader,
    "nesting limit of its own": NestingLimitedLoader,
}


@pytest.fixture(params=EVENT_PARSERS)
def yaml_parser(request, monkeypatch) -> str:
    """The reader's YAML events come from each parser in turn."""
    monkeypatch.setattr(taperlm.files.io, "_YAML_EVENTS_LOADER", EVENT_PARSERS[request.param])
    return request.param


@pytest.mark.unit
def test_the_nesting_limited_parser_refuses_deep_flow_before_its_first_event():
    """The stand-in behaves as libyaml 0.2.5 does: no event at all before its own refusal."""
    collections = 0
    with pytest.raises(ScannerError, match="exceeded maximum nesting depth"):
        for event in yaml.parse(DEEP_YAML["flow"], Loader=NestingLimitedLoader):
            collections += isinstance(event, yaml.CollectionStartEvent)
    assert collections == 0


@pytest.mark.unit
@pytest.mark.parametrize("shape", DEEP_JSON)
def test_deep_json_is_refused_before_parsing(shape):
    t0 = time.perf_counter()
    with pytest.raises(MalformedFileError, match="nests deeper than"):
        parse_json(DEEP_JSON[shape], "f.json", "f.json")
    assert time.perf_counter() - t0 < 2


@pytest.mark.unit
@pytest.mark.parametrize("shape", DEEP_YAML)
def test_deep_yaml_is_refused_before_parsing(shape, yaml_parser):
    t0 = time.perf_counter()
    with raises_naming(MalformedFileError, "config file", "c.yaml", "nests deeper than"):
        parse_yaml(DEEP_YAML[shape], "c.yaml", "config file")
    assert time.perf_counter() - t0 < 5


@pytest.mark.unit
def test_a_syntax_error_is_not_called_too_deep(yaml_parser):
    """Where the parser gives up on a text that is not deep, it is a syntax error with its line."""
    with raises_naming(MalformedFileError, "config file", "c.yaml", "not valid YAML", "line 2"):
        parse_yaml("a: [1, 2]\nb: c: d\n", "c.yaml", "config file")


@pytest.mark.unit
def test_an_alias_bomb_is_refused_at_once():
    assert len(BOMB) < 500
    t0 = time.perf_counter()
    with raises_naming(MalformedFileError, "config file", "c.yaml", "aliases"):
        parse_yaml(BOMB, "c.yaml", "config file")
    assert time.perf_counter() - t0 < 1


@pytest.mark.unit
def test_aliases_that_nest_deep_are_refused():
    with pytest.raises(MalformedFileError, match="alias"):
        parse_yaml(ALIAS_DEPTH)


@pytest.mark.unit
def test_depth_and_aliases_within_bounds_still_read():
    ok = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert json_depth(ok) == MAX_DEPTH and parse_json(ok) is not None
    assert parse_json('["[[[[", "{{{{"]') == ["[[[[", "{{{{"]  # brackets in strings do not count
    assert parse_json(r'["\"[[[["]') == ['"[[[[']  # nor after an escaped quote
    assert parse_yaml(ok) is not None
    text = "base: &b {lr: 0.1, seq_len: 32}\ntrain:\n  <<: *b\n  lr: 0.2\n"
    assert parse_yaml(text)["train"] == {"lr": 0.2, "seq_len": 32}


@pytest.mark.unit
def test_a_huge_integer_is_a_clear_error():
    with raises_naming(MalformedFileError, "JSON"):
        parse_json('{"vocab_size": ' + "9" * 5000 + "}")


@pytest.mark.unit
def test_strict_json_and_yaml_refuse_a_key_twice():
    with raises_naming(MalformedFileError, "'a'", "twice"):
        parse_json('{"a": 1, "a": 2}', strict=True)
    with raises_naming(MalformedFileError, "'a'", "twice", "line 2"):
        parse_yaml("a: 1\na: 2\n")


MERGES = {
    "two <<: keys": "x: &x {p: 1, q: 2}\ny: &y {p: 3}\nz:\n  <<: *x\n  <<: *y\n",
    "a <<: list": "x: &x {p: 1, q: 2}\ny: &y {p: 3}\nz:\n  <<: [*x, *y]\n",
    "nested merges": "w: &w {p: 9}\nx: &x {<<: *w, q: 2}\ny: &y {p: 3}\nz:\n  <<: [*x, *y]\n",
}


@pytest.mark.unit
@pytest.mark.parametrize("case", MERGES)
def test_merges_that_disagree_are_refused(case):
    """Which of two merges wins is a rule of YAML few know: refused, naming the key."""
    with raises_naming(MalformedFileError, "'p'", "<<:"):
        parse_yaml(MERGES[case])


@pytest.mark.unit
def test_merges_that_agree_or_are_overridden_are_fine():
    agree = "x: &x {p: 1, q: 2}\ny: &y {p: 1}\nz:\n  <<: [*x, *y]\n"
    assert parse_yaml(agree)["z"] == {"p": 1, "q": 2}
    override = MERGES["two <<: keys"] + "  p: 5\n"
    assert parse_yaml(override)["z"] == {"p": 5, "q": 2}


@pytest.mark.unit
def test_the_readers_bound_the_size_before_reading(tmp_path):
    path = tmp_path / "big.json"
    path.write_text("[" + "1," * 1000 + "1]")
    with raises_naming(MalformedFileError.__mro__[1], "record", str(path), "100 bytes"):
        read_json(path, 100, "record")  # UnsafeFileError
    with raises_naming(MalformedFileError.__mro__[1], "config file", str(path), "100 bytes"):
        read_yaml(path, 100, "config file")
    assert read_json(path)[-1] == 1


# ----------------------------------------------------------------------------------------------
# every structured file kind x deep nesting x the command that reads it


def _deep(path: Path, kind: str = "json") -> None:
    text = DEEP_JSON["objects"] if kind == "json" else DEEP_YAML["under a key"]
    path.write_text(text)


def _fails_cleanly(argv: list[str], capsys, *needles: str) -> str:
    rc = cli_main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err and "RecursionError" not in err, err
    assert err.count("\n") == 1 and len(err) < MAX_MESSAGE + 100, err
    for needle in needles:
        assert needle in err, err
    assert_own_options(argv[0], err)
    return err


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return H.prepare_data(tmp_path_factory.mktemp("deep"))


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory) -> Path:
    """A run with checkpoints at steps 1 and 2."""
    run = tmp_path_factory.mktemp("deep-run") / "run"
    argv = H.train_argv(data, run, "train.checkpoint_every=1")
    assert cli_main([*argv, "--stop-after-steps", "2"]) == 0
    return run


@pytest.mark.unit
def test_config_file(tmp_path, capsys, yaml_parser):
    path = tmp_path / "c.yaml"
    _deep(path, "yaml")
    _fails_cleanly(["plan", "--config", str(path)], capsys, str(path), "nests deeper")
    path.write_text(BOMB)
    t0 = time.perf_counter()
    _fails_cleanly(["plan", "--config", str(path)], capsys, str(path), "aliases")
    assert time.perf_counter() - t0 < 5


@pytest.mark.unit
def test_set_and_the_environment(monkeypatch, capsys, yaml_parser):
    value = "[" * DEEP + "]" * DEEP
    argv = ["plan", "--preset", "transformer-tiny", "--set", f"model.taper={value}"]
    _fails_cleanly(argv, capsys, "--set", "nests deeper")
    monkeypatch.setenv("TAPERLM_SET", f"model.taper={'[' * 60_000 + ']' * 60_000}")
    _fails_cleanly(["plan", "--preset", "transformer-tiny"], capsys, "TAPERLM_SET", "nests deeper")
    monkeypatch.setenv("TAPERLM_SET", f"model.taper='{BOMB}'")
    _fails_cleanly(["plan", "--preset", "transformer-tiny"], capsys, "TAPERLM_SET", "aliases")


@pytest.mark.unit
def test_novelty_json(tmp_path, capsys):
    path = tmp_path / "novelty.json"
    _deep(path)
    argv = ["plan", "--preset", "transformer-tiny", "--taper", f"novelty:{path}"]
    _fails_cleanly(argv, capsys, str(path), "nests deeper")


def test_data_dir_meta_json(data, tmp_path, capsys):
    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    _deep(copy / "meta.json")
    argv = H.train_argv(copy, tmp_path / "run")
    _fails_cleanly(argv, capsys, "meta.json", "nests deeper")


@pytest.mark.parametrize("name", ["data.json", "tokenizer/tokenizer_meta.json"])
def test_run_records(name, data, trained, tmp_path, capsys):
    """A run's data record and its copy of the tokenizer's meta, read by eval and a resume."""
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    assert (run / name).is_file()
    _deep(run / name)
    argv = ["generate", str(run), "--max-new-tokens", "2", "--prompt", "a"]
    if name == "data.json":  # read when the run is resumed
        argv = H.train_argv(data, run)
    _fails_cleanly(argv, capsys, name.split("/")[-1], "nests deeper")


def test_checkpoint_manifest_falls_back_to_the_previous_checkpoint(trained, tmp_path, capsys):
    from taperlm.checkpoint.store import find_checkpoint, list_checkpoints

    run = tmp_path / "run"
    shutil.copytree(trained, run)
    ckpts = list_checkpoints(run)
    assert [s for s, _ in ckpts] == [1, 2]
    _deep(ckpts[-1][1] / "manifest.json")
    with pytest.warns(Warning, match="nests deeper"):
        assert find_checkpoint(run) == ckpts[0][1]
    argv = ["generate", str(run), "--max-new-tokens", "2", "--prompt", "a"]
    assert cli_main(argv) == 0, capsys.readouterr().err
    capsys.readouterr()


def test_compare_cell_result_json_is_recomputed(tmp_path):
    from taperlm.compare.cell import read_result
    from taperlm.compare.results import RESULT_FILE

    _deep(tmp_path / RESULT_FILE)
    assert read_result(tmp_path) is None  # damaged: recomputed like a missing one


def test_the_checkers_of_an_existing_out_file_and_folder(trained, tmp_path, capsys):
    """outfiles: an existing --out JSON is ours only if it says so (a deep one is not, and is
    refused without a traceback); outdirs: a folder whose config.json/marker is deep is not
    recognised as taperlm's."""
    from taperlm.files.outdirs import written_files
    from taperlm.files.outfiles import check_output_file

    out = tmp_path / "eval.json"
    _deep(out)
    with raises_naming(ConfigError, "--out", str(out)):
        check_output_file(out, "json", "--out")
    folder = tmp_path / "exp"
    folder.mkdir()
    _deep(folder / "config.json")
    _fails_cleanly(["export", str(trained), "--out", str(folder)], capsys, "--out")
    _deep(folder / ".taperlm-export")
    assert written_files(folder, "export") == {}


def test_a_vocabulary_above_the_maximum_is_not_advised(data, tmp_path, capsys):
    """Issue 41, class 5: a data dir whose meta.json claims 10^8 ids was answered with advice
    to set model.vocab_size=100000000, above the 2^24 the field accepts."""
    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    meta = read_json(copy / "meta.json")
    meta["vocab_size"] = 10**8
    (copy / "meta.json").write_text(json.dumps(meta))
    err = _fails_cleanly(H.train_argv(copy, tmp_path / "run"), capsys, "100000000")
    assert "set model.vocab_size=100000000" not in err
    assert "no setting of model.vocab_size fits it" in err and "16777216" in err, err


def test_an_unbounded_value_in_a_message_is_cut(data, tmp_path, capsys):
    """Issue 41, class 5: no error line prints an unbounded value. A meta.json whose
    format_version is 100,000 characters is quoted by its reader as is; the CLI, where every
    TaperlmError is printed, cuts the middle and keeps the start and the fix."""
    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    meta = read_json(copy / "meta.json")
    meta["format_version"] = "9" * 100_000
    (copy / "meta.json").write_text(json.dumps(meta))
    err = _fails_cleanly(H.train_argv(copy, tmp_path / "run"), capsys, "meta.json")
    assert len(err) < MAX_MESSAGE + 200 and "characters ...]" in err, len(err)
    assert err.rstrip().endswith("`taperlm prepare`"), err[-200:]
