"""compare's list options (--tapers/--taper, --preset-size, --families, --eval-tasks,
--eval-niah-lengths, --lr-grid) are parsed once, where `CompareOptions` is made, into typed
values that every consumer reads; a bad one fails there, naming the option; and the reproducing
command writes each back as text that parses to the same value."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import pytest

from conftest import raises_naming
from taperlm.cli import build_parser
from taperlm.compare import options as options_module
from taperlm.compare.options import CompareOptions, list_text, options_from, run_arguments
from taperlm.errors import ConfigError

OUT = Path("cmp")
# option -> the parser that reads its text (each runs once per option given as text)
PARSERS = {
    "tapers": "parse_tapers",
    "preset_size": "parse_preset_sizes",
    "families": "list_items",
    "eval_tasks": "list_items",
    "eval_niah_lengths": "parse_niah_lengths",
    "lr_grid": "parse_lr_grid",
}
EVERY_LIST = [
    "--tapers", "uniform;late=cosine:0.5:1.5;groups:1.5,1.0,0.5", "--taper", " linear:1.25:0.75 ",
    "--eval-tasks", "niah_single_1, niah_single_2", "--eval-niah-lengths", "256,128",
    "--tune-lr", "--lr-grid", "4e-3,1e-3, 2e-3",
]  # fmt: skip


def _options(argv: list[str]) -> CompareOptions:
    """`taperlm compare ARGV`'s options, as the command builds them."""
    args = build_parser().parse_args(["compare", *argv])
    args.loggers = None
    return options_from(args)


def _reparsed(opts: CompareOptions, argv: list[str]) -> CompareOptions:
    """The options of a reproducing command line (`taperlm compare ...` or its arguments)."""
    return _options(argv[2:] if argv[:2] == ["taperlm", "compare"] else argv)


@pytest.mark.unit
def test_options_from_argv_hold_typed_values():
    opts = _options(["--out", "o", *EVERY_LIST])
    # each allocation parsed once into its specs, with the options
    assert [a.label for a in opts.tapers] == ["uniform", "late", "groups:1.5,1.0,0.5"]
    assert opts.tapers[1].spec.start == 0.5 and opts.tapers[2].spec.groups == [1.5, 1.0, 0.5]
    assert [a.spec_string for a in opts.taper_list] == ["linear:1.25:0.75"]
    assert opts.eval_tasks == ("niah_single_1", "niah_single_2")
    assert opts.eval_niah_lengths == (256, 128)  # in the order given: it fixes the items
    assert opts.lr_grid == (0.001, 0.002, 0.004)  # a set of lrs: sorted
    paper = _options(["--out", "o", "--paper", "scaling", "--preset-size", "micro, tiny"])
    assert paper.preset_size == ("micro", "tiny")
    fams = _options(["--out", "o", "--paper", "families", "--families", "gated,hope"])
    assert fams.families == ("gated", "hope")
    # the defaults: nothing given
    none = CompareOptions(out=OUT)
    assert (none.tapers, none.taper_list, none.preset_size, none.families) == (None, (), None, None)
    assert (none.eval_tasks, none.eval_niah_lengths, none.lr_grid) == (("none",), (), None)
    # the Python API may give text (parsed the same) or typed values (kept as they are)
    assert CompareOptions(out=OUT, lr_grid="1e-3,2e-3").lr_grid == (0.001, 0.002)
    assert CompareOptions(out=OUT, eval_niah_lengths=[64, 32]).eval_niah_lengths == (64, 32)
    (cosine,) = CompareOptions(out=OUT, taper_list=["cosine "]).taper_list
    assert cosine.spec_string == "cosine:1.5:0.5"
    assert CompareOptions(out=OUT, tapers="").tapers == ()  # given empty: job.allocations says so


@pytest.mark.unit
def test_each_text_is_parsed_once(monkeypatch):
    """Made from text, each list option's parser runs once; replacing other fields, or every
    consumer that builds the reproducing command, parses nothing again."""
    calls: dict[str, int] = {}
    for name in set(PARSERS.values()):
        real = getattr(options_module, name)

        def counted(text, _real=real, _name=name):
            calls[_name] = calls.get(_name, 0) + 1
            return _real(text)

        monkeypatch.setattr(options_module, name, counted)
    opts = _options(["--out", "o", *EVERY_LIST])
    after_parse = dict(calls)
    # --tapers, --eval-niah-lengths, --lr-grid once each; --eval-tasks' list once (--families
    # not given: None, no text)
    assert after_parse == {
        "parse_tapers": 1,
        "parse_niah_lengths": 1,
        "parse_lr_grid": 1,
        "list_items": 1,
    }
    again = dataclasses.replace(opts, seeds=3)
    assert again.lr_grid is opts.lr_grid and again.tapers is opts.tapers
    run_arguments(again, 3, 1000)
    assert calls == after_parse


@pytest.mark.unit
@pytest.mark.parametrize(
    "argv,tokens",
    [
        (["--tune-lr", "--lr-grid", "1e-3,x"], ("--lr-grid", "'x'", "1e-3,2e-3")),
        (["--tune-lr", "--lr-grid", "1e-3"], ("--lr-grid", "at least two")),
        (["--tune-lr", "--lr-grid", "0,1"], ("--lr-grid", "> 0", "0")),
        (["--tune-lr", "--lr-grid", "1e-3,1e-3"], ("--lr-grid", "1e-3", "twice")),
        (["--lr-grid", "nan,1"], ("--lr-grid", "nan")),  # before --tune-lr's own check
        (["--eval-niah-lengths", "4k"], ("--eval-niah-lengths", "'4k'", "whole number")),
        (["--eval-niah-lengths", "0,64"], ("--eval-niah-lengths", "0", "positive")),
        (["--eval-niah-lengths", "64,64"], ("--eval-niah-lengths", "64", "twice")),
        (["--eval-niah-lengths", ","], ("--eval-niah-lengths", "empty", "4096,8192")),
        (["--paper", "scaling", "--preset-size", " , "], ("--preset-size", "' , '", "micro")),
    ],
)
def test_a_bad_list_fails_where_the_options_are_made(argv, tokens):
    with raises_naming(ConfigError, *tokens):
        _options(["--out", "o", *argv])
    flag, text = argv[-2], argv[-1]
    field = next(f.name for f in options_module.declared_options() if f.metadata["flag"] == flag)
    with raises_naming(ConfigError, *tokens):  # the Python API: the same parse, the same error
        CompareOptions(out=OUT, **{field: text})


# representative texts of each option, as a user writes them (spaces, order, exponents)
TEXTS = {
    "eval_tasks": ["none", "", "paper", "all", "niah", "wikitext,piqa", "piqa, niah_single_1"],
    "eval_niah_lengths": ["", "4096", "256,512", "16384, 4096,8192"],
    "lr_grid": [
        "1e-3,2e-3",
        "4e-3, 1e-3,2e-3",
        "0.0005,0.02",
        "1e-5,2e-5,1.5e-2",
        "8,0.25",
        "0.00123456789,3.3333333e-4",
    ],  # more digits than %g keeps: written in full
    "preset_size": ["micro", "micro,tiny,small", "440m, 760m,1.3b", "nano"],
    "families": ["transformer", "gated, hope,titans-mag", "titans-mac,titans-mal"],
}


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(TEXTS))
def test_list_text_reads_back_as_the_same_value(name):
    """parse(render(x)) == x: the text the reproducing command writes for each value."""
    for text in TEXTS[name]:
        value = getattr(CompareOptions(out=OUT, **{name: text}), name)
        rendered = list_text(value) if value is not None else None
        back = getattr(CompareOptions(out=OUT, **{name: rendered}), name)
        assert back == value, (name, text, rendered)


@pytest.mark.unit
@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--eval-tasks", "paper"],
        ["--eval-tasks", ""],
        ["--eval-tasks", "wikitext, piqa", "--eval-limit", "0"],
        ["--eval-tasks", "niah", "--eval-niah-lengths", "512, 256"],
        ["--tune-lr"],
        ["--tune-lr", "--lr-grid", "4e-3, 1e-3,2e-3", "--tune-seeds", "3"],
        ["--tune-lr", "--lr-grid", "1e-5,2.5e-4,8", "--lr-grid-extend", "2"],
    ],
)
def test_reproducing_arguments_parse_back_to_the_same_options(argv):
    opts = _options(["--out", "o", *argv])
    args = run_arguments(opts, opts.seeds, 1000)
    back = _reparsed(opts, args)
    for name in ("eval_tasks", "eval_niah_lengths", "lr_grid", "tune_lr", "eval_limit"):
        assert getattr(back, name) == getattr(opts, name), name
    assert run_arguments(back, back.seeds, 1000) == args  # and write the same text again


# ------------------------------------------------------------------------------ with the studies


@pytest.mark.parametrize(
    "tapers",
    [
        ["--tapers", "uniform;cosine:1.5:0.5;groups:1.5,1.0,0.5"],
        ["--tapers", "uniform,groups:1.5,1.0,0.5,cosine"],
        ["--taper", "cosine", "--taper", " linear:1.25:0.75 "],
        ["--tapers", "a=cosine;b=heads:cosine:1.25:0.75", "--taper", "kv:groups:0.5"],
        ["--tapers", "cosine+heads:cosine:1.25:0.75+kv:cosine:1.0:0.25"],
        [],
    ],
)
def test_reproducing_command_gives_the_same_allocations(tapers):
    from taperlm.compare.comparison import check_options
    from taperlm.compare.grid import build_grid
    from taperlm.compare.options import canonical_command

    def allocations(opts):
        allocs, base = check_options(opts)
        grid = build_grid(base, allocs, list(range(opts.seeds)), opts.paper)
        return [(a.name, a.label, a.spec_string) for a in allocs], canonical_command(opts, grid)

    opts = _options(["--preset", "transformer-tiny", "--out", "o", *tapers])
    first, command = allocations(opts)
    back = _reparsed(opts, shlex.split(command))
    assert allocations(back) == (first, command)


def test_study_commands_give_the_same_sizes_and_families():
    """--paper families / scaling / shapes write --preset-size and --families back as text that
    gives the same sizes and families."""
    from taperlm.compare import families, scaling, shapes

    for argv in (
        ["--paper", "families"],
        ["--paper", "families", "--preset-size", "tiny", "--families", "gated, hope,gated"],
    ):
        opts = _options(["--out", "o", *argv])
        subs = families.family_options(opts)
        back = _reparsed(opts, shlex.split(families._command(opts, subs, 1000)))
        assert families.family_presets(back) == families.family_presets(opts)
        assert families.preset_size(back) == families.preset_size(opts)
    for argv in (["--paper", "scaling"], ["--paper", "scaling", "--preset-size", "micro, tiny"]):
        opts = _options(["--out", "o", *argv])
        points = scaling.point_options(opts, scaling.plan_for(opts))
        back = _reparsed(opts, shlex.split(scaling.study_command(opts, points[0][3])))
        assert back.preset_size == opts.preset_size
        assert scaling.plan_for(back) == scaling.plan_for(opts)
    for argv in (["--paper", "shapes"], ["--paper", "shapes", "--preset-size", "micro"]):
        opts = _options(["--out", "o", *argv])
        points = shapes.point_options(opts, shapes.shape_points(opts.preset_size))
        back = _reparsed(opts, shlex.split(shapes.command(opts, points[0][1])))
        assert back.preset_size == opts.preset_size and back.paper == "shapes"
        again = shapes.point_options(back, shapes.shape_points(back.preset_size))
        assert [(p, o.tapers, o.tokens, o.seeds) for p, o in again] == [
            (p, o.tapers, o.tokens, o.seeds) for p, o in points
        ]


def test_a_bad_list_fails_before_any_work(tmp_path):
    """From the command line: the error names the option, and nothing is written."""
    from test_compare import _cli

    out = tmp_path / "cmp"
    rc, _, err = _cli(["compare", "--tune-lr", "--lr-grid", "1e-3,x", "--out", str(out)])
    assert rc != 0 and "--lr-grid" in err and "'x'" in err, err
    assert not out.exists()


def test_consumers_read_the_typed_values(monkeypatch):
    """The checks, the evaluation settings and the lr grid read the parsed values: with every
    parser made to fail after the options are made, they still run."""
    from taperlm.compare import families, grid, tuning
    from taperlm.compare.comparison import allocations, check_options, eval_settings

    opts = _options(["--preset", "transformer-tiny", "--out", "o", *EVERY_LIST])
    fams = _options(["--out", "o", "--paper", "families", "--families", "gated", "--preset-size", "tiny"])  # fmt: skip

    def parsed_again(*args, **kwargs):
        raise AssertionError(f"parsed again: {args}")

    for name in set(PARSERS.values()):
        monkeypatch.setattr(options_module, name, parsed_again)
    monkeypatch.setattr(grid, "split_taper_list", parsed_again)
    check_options(opts)
    assert [a.label for a in allocations(opts)][-2:] == ["groups:1.5,1.0,0.5", "linear:1.25:0.75"]
    settings = eval_settings(opts)
    assert settings.eval_tasks == ["niah_single_1", "niah_single_2"]
    assert settings.niah_lengths == [256, 128]
    assert tuning.lr_grid(opts.lr_grid, 1.0) == [0.001, 0.002, 0.004]
    assert families.family_presets(fams) == ["gated"] and families.preset_size(fams) == "tiny"


def _prepared(root: Path, tokenizer: str) -> Path:
    """A small prepared data dir (its vocabulary: `tokenizer`'s size)."""
    import random

    from taperlm.data.prepare import prepare

    rng = random.Random(0)
    words = "the cat dog runs fast slow over under a bird sings loud tree house river".split()
    lines = (" ".join(rng.choice(words) for _ in range(8)) + "." for _ in range(300))
    root.mkdir()
    (root / "text.txt").write_text("\n".join(lines) + "\n")
    prepare(str(root / "text.txt"), root / "data", tokenizer, val_tokens=300, progress=False)
    return root / "data"


def test_data_and_its_set_twin_name_one_folder_for_cells_vocabulary_and_evaluation(
    tmp_path, monkeypatch, capsys
):
    """`compare --data X --set data.dir=Y` once trained the cells on Y while the vocabulary and
    the evaluation came from X. Now the two are refused unless they name the same folder, and
    whichever layer gives data.dir (--data, --set, $TAPERLM_SET above both), the cells, the
    vocabulary and the evaluation read that one folder: checked on the options path, without
    training (check_options, data_dir_of, base_config)."""
    from taperlm.cli import main as cli_main
    from taperlm.compare.comparison import check_options, data_dir_of
    from taperlm.compare.recipe import base_config
    from taperlm.data.datadir import load_meta

    x, y = _prepared(tmp_path / "x", "bpe:300"), _prepared(tmp_path / "y", "bpe:280")
    vocab = {d: int(load_meta(d)["vocab_size"]) for d in (x, y)}
    assert vocab[x] != vocab[y]
    out = str(tmp_path / "cmp")
    argv = ["compare", "--data", str(x), "--set", f"data.dir={y}", "--out", out, "--dry-run"]
    assert cli_main(argv) == 2
    assert capsys.readouterr().err == (
        f"taperlm compare: error: --data {x} and --set data.dir={y} set data.dir to different "
        "values; give one of them (or the same value)\n"
    )
    with raises_naming(ConfigError, "--data", "data.dir"):  # the Python API too
        check_options(CompareOptions(out=OUT, data=x, overrides=[f"data.dir={y}"]))

    def folders(opts: CompareOptions) -> tuple[Path, str, int, str]:
        """(the folder read for the vocabulary and evaluation, the cells' data.dir, their
        vocabulary, the recipe named) of `opts`."""
        _, provisional = check_options(opts)
        data_dir = data_dir_of(opts, provisional)
        base = base_config(opts, data_dir, int(load_meta(data_dir)["vocab_size"]))
        return data_dir, base.data.dir, base.model.vocab_size, base.train.lr

    y_is = (y.resolve(), str(y.resolve()), vocab[y])
    monkeypatch.chdir(tmp_path)  # the same folder, spelt relative and absolute: accepted
    both = CompareOptions(out=OUT, data=Path("y/data"), overrides=[f"data.dir={y}"])
    assert folders(both)[:3] == y_is
    assert folders(CompareOptions(out=OUT, overrides=[f"data.dir={y}"]))[:3] == y_is
    assert folders(CompareOptions(out=OUT, data=y))[:3] == y_is
    # $TAPERLM_SET (which `taperlm compare` appends to --set) is above --data: all of it on Y
    monkeypatch.setenv("TAPERLM_SET", f"data.dir={y}")
    from_env = CompareOptions(out=OUT, data=x, overrides=[f"data.dir={y}"])
    assert folders(from_env)[:3] == y_is


def test_a_comparison_records_its_named_recipe(tmp_path):
    """compare's training recipes are named layers of the one assembly, next to presets."""
    from taperlm.compare.recipe import compare_recipe

    assert compare_recipe(CompareOptions(out=OUT), "transformer").name == "compare-main"
    micro = CompareOptions(out=OUT, preset="transformer-micro")
    assert compare_recipe(micro, "transformer").name == "compare-cpu"
    assert compare_recipe(micro, "titans").name == "compare-cpu-titans"
    paper = CompareOptions(out=OUT, preset="transformer-440m")
    recipe = compare_recipe(paper, "transformer")
    assert recipe.name == "paper-440m" and recipe.settings["train.seq_len"] == 4096


# the texts of one allocation's parts, each distinct from every spec a preset or a study uses
ALLOCATION_PARTS = ("cosine:1.375:0.625", "cosine:1.25:0.75", "cosine:1.0:0.25")


def test_an_allocation_is_parsed_once_and_stays_its_specs(  # not unit: check_options imports torch
    monkeypatch,
):
    """Each part of an allocation (MLP, head and KV taper) is parsed once, where the options
    are made; checking the options, building the grid (its cells' model configs), writing the
    reproducing command and reading the options again parse none of them again: every
    consumer reads the parsed specs."""
    from taperlm.compare.comparison import allocations, check_options
    from taperlm.compare.grid import build_grid
    from taperlm.compare.options import canonical_command
    from taperlm.spec.taper import TaperSpec

    parsed: list[str] = []
    real = TaperSpec.parse.__func__

    def counted(cls, text, multiple_of=None):
        parsed.append(text.strip())
        return real(cls, text, multiple_of)

    monkeypatch.setattr(TaperSpec, "parse", classmethod(counted))
    mlp, heads, kv = ALLOCATION_PARTS
    tapers = f"uniform;both={mlp}+heads:{heads}+kv:{kv}"
    opts = _options(["--preset", "transformer-tiny", "--out", "o", "--tapers", tapers])
    assert [parsed.count(t) for t in ALLOCATION_PARTS] == [1, 1, 1]
    (both,) = [a for a in opts.tapers if a.name == "both"]
    assert (both.spec.start, both.head_taper.start, both.kv_taper.end) == (1.375, 1.25, 0.25)
    allocs, base = check_options(opts)
    grid = build_grid(base, allocs, [0, 1], opts.paper)
    command = canonical_command(dataclasses.replace(opts, seeds=2), grid)
    assert allocations(opts)[1].spec_string == f"{mlp}+heads:{heads}+kv:{kv}"
    assert [parsed.count(t) for t in ALLOCATION_PARTS] == [1, 1, 1]
    # the written forms: the command's --tapers and every cell's model config
    assert f"both={mlp}+heads:{heads}+kv:{kv}" in command
    model = grid.cell("both", 1).config.model
    assert (model.head_taper.as_text(), model.kv_taper.as_text()) == (heads, kv)


# The modules of the report path, which read an allocation's specs and never parse its text.
REPORT_PATH = ("report", "statistics", "results", "scaling", "longrun", "families", "shapes")
# What parses a taper's text: the spec parser and everything built on it.
TAPER_PARSERS = {
    "TaperSpec.parse",
    "parse_allocation",
    "parse_allocations",
    "split_taper_list",
    "parse_tapers",
    "text_spec",
}


def _calls(path: Path) -> set[str]:
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func  # a name, or an attribute as OWNER.NAME (Stop.parse is no taper's)
            if isinstance(f, ast.Attribute):
                owner = f.value.id if isinstance(f.value, ast.Name) else ""
                names |= {f.attr, f"{owner}.{f.attr}"}
            else:
                names.add(getattr(f, "id", ""))
    return names


@pytest.mark.unit
def test_the_report_path_parses_no_taper_text():
    """No module of the report path calls a taper parser: no second parser of an allocation
    (the sweep's claims and plot, the scaling fit's start ratios, the trend's best taper read
    the parsed allocations, or write the text from the start ratio)."""
    src = Path(options_module.__file__).parent
    found = {m: sorted(_calls(src / f"{m}.py") & TAPER_PARSERS) for m in REPORT_PATH}
    assert found == {m: [] for m in REPORT_PATH}


def _mode_comparisons(path: Path, modes: set[str]) -> list[str]:
    """`file:line` of every comparison with a string literal that is a --paper mode's name:
    == or != with it, in or not in a literal tuple/list/set of such names."""
    import ast

    def literals(node: ast.AST) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return {v for e in node.elts for v in literals(e)}
        return set()

    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        for op, left, right in zip(node.ops, sides, sides[1:]):
            # x == "sweep", "sweep" != x, x in ("tokens", ...); not "sweep" in plots (a key of
            # a mapping that happens to share the name)
            named = literals(right) if isinstance(op, (ast.In, ast.NotIn)) else literals(left)
            if isinstance(op, (ast.Eq, ast.NotEq)):
                named |= literals(right)
            if named & modes:
                out.append(f"{path.name}:{node.lineno}")
    return out


@pytest.mark.unit
def test_no_mode_name_is_compared_outside_its_owner(tmp_path):
    """A --paper mode is asked what it is (`PaperMode`'s attributes, the study's own table)
    where it is declared, compare/options.py: no other module of the package compares a mode's
    name to a string."""
    root = Path(options_module.__file__).parents[1]  # src/taperlm
    modes = set(options_module.PAPER_MODES)
    found = [
        hit
        for path in sorted(root.rglob("*.py"))
        if path != Path(options_module.__file__)
        for hit in _mode_comparisons(path, modes)
    ]
    assert found == []
    # the check finds what it looks for (and not a key that shares a mode's name)
    probe = tmp_path / "probe.py"
    probe.write_text(
        'a = opts.paper == "sweep"\nb = mode in ("tokens", "x")\nc = "sweep" in plots\n',
        encoding="utf-8",
    )
    assert _mode_comparisons(probe, modes) == ["probe.py:1", "probe.py:2"]
