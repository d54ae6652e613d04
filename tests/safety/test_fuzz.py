"""Property-based fuzzing (hypothesis) of the input parsers (issue 8, item 7): the config parser,
`--set` overrides, the taper spec parser and solver, the token-shard reader and the evaluation-file
readers. The property: on any input they return or raise one of the documented errors
(ConfigError / TaperError / DataError / CheckpointError, all TaperlmError) -- nothing else.

Example counts are small by default so the file runs in seconds; for a long run:

    TAPERLM_FUZZ_EXAMPLES=5000 python -m pytest -q tests/safety/test_fuzz.py

Bounds: numbers fed to `solve_sizes` are kept small (<= 64 layers, multipliers <= 50), because
the solver moves one width step per iteration (see docs/reliability.md, "open issues").
"""

from __future__ import annotations

import contextlib
import json
import os
import string
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from conftest import raises_naming
from taperlm.config import (
    DataConfig,
    ModelConfig,
    TrainConfig,
    apply_overrides,
    from_dict,
    load_yaml,
    run_config_from_dict,
)
from taperlm.data.shards import HEADER_SIZE, open_shard, parse_header, write_shard
from taperlm.errors import DataError, TaperlmError
from taperlm.evaluation.registry import get_task, load_task
from taperlm.spec.solver import solve_sizes
from taperlm.spec.taper import TaperSpec

pytestmark = pytest.mark.unit

N = int(os.environ.get("TAPERLM_FUZZ_EXAMPLES", "40"))
FUZZ = settings(
    max_examples=N,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# ----------------------------------------------------------------------------------------------
# config


def _field_names(cls) -> list[str]:
    import dataclasses

    return [f.name for f in dataclasses.fields(cls)]


KEYS = st.one_of(
    st.sampled_from(
        [
            *("model", "train", "data", "taper", "hope", "titans", "schedule", "start", "end"),
            *_field_names(ModelConfig),
            *_field_names(TrainConfig),
            *_field_names(DataConfig),
        ]
    ),
    st.text(max_size=8),
    st.integers(-3, 3),
    st.booleans(),
    st.none(),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 300),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["cosine:1.5:0.5", "uniform", "groups:1.5,0.5", "1e-3", "nan", "transformer"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(KEYS, inner, max_size=5)),
    max_leaves=20,
)


def _documented(fn, *args):
    """Call fn; a TaperlmError is fine, anything else fails the property."""
    try:
        return fn(*args)
    except TaperlmError:
        return None


@FUZZ
@given(st.dictionaries(KEYS, VALUES, max_size=4))
def test_run_config_from_random_dicts(data):
    cfg = _documented(run_config_from_dict, data)
    if cfg is not None:
        _documented(cfg.resolve)


@FUZZ
@given(st.dictionaries(st.sampled_from(_field_names(ModelConfig)), VALUES, max_size=6))
def test_model_config_from_random_fields(data):
    cfg = _documented(from_dict, ModelConfig, data, "model")
    if cfg is not None:
        _documented(cfg.resolve)


OVERRIDE_KEYS = st.one_of(
    st.sampled_from(
        [f"model.{k}" for k in _field_names(ModelConfig)]
        + [f"train.{k}" for k in _field_names(TrainConfig)]
        + ["data.dir", "d_model", "lr", "model.taper.start", "model.hope.levels", "foo", ""]
    ),
    st.text(alphabet=string.ascii_lowercase + "._", max_size=20),
)
OVERRIDE_VALUES = st.one_of(
    st.sampled_from(["1", "-1", "0", "[1, 2]", "{a: 1}", "nan", "cosine:2:0", "[", "'x", "null"]),
    st.text(max_size=15),
)


@FUZZ
@given(
    st.lists(
        st.tuples(OVERRIDE_KEYS, st.sampled_from(["=", "", "=="]), OVERRIDE_VALUES), max_size=4
    )
)
def test_set_overrides(parts):
    from taperlm.config import to_dict
    from taperlm.config.presets import get_preset

    data = {"model": to_dict(get_preset("transformer-tiny", resolve=False))}
    overrides = [k + sep + v for k, sep, v in parts]
    if _documented(apply_overrides, data, overrides) is None:
        return
    cfg = _documented(run_config_from_dict, data)
    if cfg is not None and cfg.model.n_layers <= 64 and cfg.model.mlp_width <= 4096:
        _documented(cfg.resolve)


@FUZZ
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_yaml_file_bytes(tmp_path_factory, raw):
    path = tmp_path_factory.mktemp("yaml") / "c.yaml"
    path.write_bytes(raw)
    data = _documented(load_yaml, path)
    if data is not None:
        _documented(run_config_from_dict, data)


# ----------------------------------------------------------------------------------------------
# tapers

SPEC_TEXT = st.one_of(
    st.text(max_size=30),
    st.builds(
        lambda name, nums, sep: name + (":" if nums else "") + sep.join(nums),
        st.sampled_from(
            ["uniform", "cosine", "linear", "sigmoid", "groups", "custom", "Cosine", "x"]
        ),
        st.lists(
            st.one_of(
                st.floats(-3, 50, allow_nan=False).map(lambda x: f"{x:g}"),
                st.integers(-3, 400).map(str),
                st.sampled_from(["nan", "inf", "-inf", "", "1e3", "a", " 1.5 "]),
            ),
            max_size=6,
        ),
        st.sampled_from([":", ",", ", "]),
    ),
)


def _small(spec: TaperSpec) -> bool:
    nums = [spec.start, spec.end, spec.steepness, *spec.groups, *spec.values]
    return all(abs(x) <= 400 for x in nums)


@FUZZ
@given(
    SPEC_TEXT, st.one_of(st.none(), st.integers(-2, 64)), st.integers(1, 48), st.integers(-4, 2048)
)
def test_taper_parse_and_solve(text, multiple_of, layers, baseline):
    spec = _documented(TaperSpec.parse, text, multiple_of)
    if spec is None:
        return
    assert TaperSpec.parse(spec.to_string(), spec.multiple_of).to_dict() == spec.to_dict()
    assume(_small(spec))
    widths = _documented(solve_sizes, spec, layers, baseline)
    if widths is not None:
        assert len(widths) == layers and sum(widths) == layers * baseline
        assert all(w > 0 for w in widths)
        if not (spec.schedule == "custom" and spec.values_are_widths):
            assert all(w % spec.multiple_of == 0 for w in widths)


# ----------------------------------------------------------------------------------------------
# token shards


@FUZZ
@given(st.binary(max_size=300))
def test_shard_random_bytes(tmp_path_factory, raw):
    _documented(parse_header, raw)
    path = tmp_path_factory.mktemp("shard") / "x.bin"
    path.write_bytes(raw)
    _documented(open_shard, path, True)


@FUZZ
@given(
    st.lists(st.integers(0, 99), min_size=0, max_size=50),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    st.sampled_from(["flip", "truncate", "append"]),
)
def test_shard_mutations_are_detected(tmp_path_factory, tokens, edits, how):
    path = tmp_path_factory.mktemp("shard") / "x.bin"
    write_shard(path, np.array(tokens, dtype=np.int64), vocab_size=100)
    raw = bytearray(path.read_bytes())
    if how == "flip":
        for pos, byte in edits:
            raw[pos % len(raw)] ^= byte or 1
    elif how == "truncate":
        del raw[edits[0][0] % len(raw) :]
    else:
        raw += bytes(b for _, b in edits)
    path.write_bytes(bytes(raw))
    try:
        header, got = open_shard(path, verify=True)
    except DataError:
        return
    # Undetected only if the change hit the 24 reserved header bytes (not checksummed).
    changed = [i for i, (a, b) in enumerate(zip(raw, _rewrite(tokens))) if a != b]
    assert all(40 <= i < HEADER_SIZE for i in changed), changed
    assert list(got) == tokens and header.count == len(tokens)


def _rewrite(tokens: list[int]) -> bytes:
    payload = np.array(tokens, dtype="<u2").tobytes()
    head = struct.pack("<8sIIQQI", b"TAPERTOK", 1, 2, len(tokens), 100, zlib.crc32(payload))
    return (head + struct.pack("<I", zlib.crc32(head))).ljust(HEADER_SIZE, b"\0") + payload


# ----------------------------------------------------------------------------------------------
# evaluation files

TEMPLATES = {
    "lambada_openai": {"context": "the cat sat on the", "continuation": "mat"},
    "winogrande": {"context_options": ["a cat", "a dog"], "continuation": "ran", "gold": 0},
    "arc_easy": {"query": "Question: why?", "choices": ["a", "b", "c"], "gold": 1},
    "social_iqa": {"context": "c", "question": "q", "options": ["a", "b", "c"], "answer": "b"},
    "boolq": {"query": "Passage: p\nQuestion: q?", "choices": ["no", "yes"], "gold": 1},
    "piqa": {"goal": "g", "sol1": "s1", "sol2": "s2"},
}
JSON_VALUES = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-3, 5),
        st.floats(allow_nan=False),
        st.text(max_size=8),
    ),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def _records(draw, task: str):
    """A few lines: mutated copies of a valid record, or raw junk lines."""
    lines = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["mutate", "mutate", "junk", "value"]))
        if kind == "junk":
            lines.append(draw(st.text(max_size=30)).replace("\n", " "))
            continue
        if kind == "value":
            lines.append(json.dumps(draw(JSON_VALUES)))
            continue
        rec = dict(TEMPLATES[task])
        for key in draw(st.lists(st.sampled_from(sorted(rec)), max_size=2)):
            if draw(st.booleans()):
                rec.pop(key, None)
            else:
                rec[key] = draw(JSON_VALUES)
        lines.append(json.dumps(rec))
    return lines


@pytest.mark.parametrize("task", sorted(TEMPLATES))
def test_eval_jsonl_readers(task, tmp_path_factory):
    @FUZZ
    @given(_records(task), st.lists(st.sampled_from(["0", "1", "2", "x", ""]), max_size=3))
    def check(lines, labels):
        root = tmp_path_factory.mktemp("eval")
        first = root / get_task(task).files[0]
        first.parent.mkdir(parents=True, exist_ok=True)
        first.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
        if task == "piqa":
            (root / get_task(task).files[1]).write_text("\n".join(labels) + "\n")
        data = _documented(load_task, task, root)
        if data is not None:
            data.items()

    check()


@FUZZ
@given(st.lists(st.text(max_size=20).map(lambda s: s.replace("\n", " ")), max_size=14))
def test_hellaswag_and_wikitext_text_readers(tmp_path_factory, lines):
    root = tmp_path_factory.mktemp("eval")
    for task in ("hellaswag", "wikitext"):
        path = root / get_task(task).files[0]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
        data = _documented(load_task, task, root)
        if data is not None:
            data.items()


def test_fuzz_example_count_is_configurable():
    assert FUZZ.max_examples == N and Path(__file__).name == "test_fuzz.py"


# ----------------------------------------------------------------------------------------------
# the bounded reader of structured text (issue 41, class 4)

JSON_LEAVES = st.one_of(st.none(), st.booleans(), st.integers(), st.text('a[]{}"\\:,', max_size=6))


def _nested(value: object, depth: int, kinds: list[bool]) -> object:
    for i in range(depth):
        value = [value] if kinds[i % len(kinds)] else {"k": value}
    return value


def _depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


@FUZZ
@given(
    leaf=JSON_LEAVES,
    depth=st.integers(0, 80),
    kinds=st.lists(st.booleans(), min_size=1, max_size=4),
    siblings=st.lists(JSON_LEAVES, max_size=3),
)
def test_structured_text_parsers(leaf, depth, kinds, siblings):
    """parse_json reads a value exactly as json does when it nests at most MAX_DEPTH deep and
    refuses it otherwise (brackets inside strings never count); parse_yaml agrees on the same
    text (JSON is YAML); random text is read or refused with a MalformedFileError only."""
    from taperlm.errors import MalformedFileError
    from taperlm.files.io import MAX_DEPTH, parse_json, parse_yaml

    value = _nested([leaf, *siblings], depth, kinds)
    text = json.dumps(value)
    if _depth(value) <= MAX_DEPTH:
        assert parse_json(text) == value
    else:
        with raises_naming(MalformedFileError, "JSON", f"{MAX_DEPTH} levels"):
            parse_json(text)
        with raises_naming(MalformedFileError, "YAML", f"{MAX_DEPTH} levels"):
            parse_yaml(text)
    noise = text[: len(text) // 2] + "".join(str(s) for s in siblings)
    for parse in (parse_json, parse_yaml):
        with contextlib.suppress(MalformedFileError):
            parse(noise)
