"""What a newcomer meets first: logs without terminal escapes, presets whose own settings need no
note, sizes that say what they depend on, and every command's --help."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from taperlm.cli import COMMANDS, main
from taperlm.runtime.progress import progress_bar

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.unit
def test_progress_in_a_log_has_no_terminal_escapes():
    """Not a terminal: the main bar prints whole lines (no carriage returns, no cursor moves),
    transient bars (nested, `leave=False`) print nothing."""
    log = io.StringIO()
    main_bar = progress_bar(total=10, desc="train", file=log, position=0, dynamic_ncols=True)
    inner = progress_bar(total=5, desc="worker", file=log, position=1, leave=False)
    transient = progress_bar(total=5, desc="eval", file=log, leave=False)
    for bar in (inner, transient):
        bar.update(5)
        bar.close()
    main_bar.update(10)
    main_bar.close()
    text = log.getvalue()
    assert "\r" not in text and "\x1b" not in text
    assert text.splitlines()[-1].startswith("train: 100%|")
    assert "worker" not in text and "eval" not in text


@pytest.mark.unit
def test_every_preset_and_example_config_trains_its_own_tokens_without_a_note():
    """A preset's (and every configs/ example's) own train.tokens is whole steps: the trainer's
    rounding note is for tokens the user asked for."""
    from taperlm.config import load_run_config, run_config_from_dict
    from taperlm.config.presets import config_data, preset_names

    for name in preset_names():
        cfg = run_config_from_dict(config_data(None, name)[0], name).resolve()
        assert cfg.train.rounding_note() is None, name
    for path in sorted((REPO / "configs").glob("*.yaml")):
        assert load_run_config(path).resolve().train.rounding_note() is None, path.name


@pytest.mark.unit
def test_list_presets_says_what_the_size_depends_on(capsys):
    """transformer-micro is 2.24M with its own 8,192-token vocabulary and 1.06M in compare
    (2,048 tokens): the listing shows the vocabulary, the size without embeddings, and why."""
    assert main(["plan", "--list-presets"]) == 0
    out = capsys.readouterr().out
    header, nano, micro = out.splitlines()[:3]
    assert header.split() == [
        "preset",
        "layers",
        "d_model",
        "mlp_width",
        "vocab",
        "params",
        "non-emb",
    ]
    assert nano.split() == ["transformer-nano", "4", "64", "176", "512", "0.27M", "0.20M"]
    assert micro.split() == ["transformer-micro", "6", "96", "256", "8,192", "2.24M", "0.66M"]
    assert "sizes the vocabulary to its data's tokenizer" in " ".join(out.split())
    # non-emb is the total less the embedding and output rows (untied): compare's 1.06M micro
    assert main(["plan", "--preset", "transformer-micro", "--set", "model.vocab_size=2048"]) == 0
    assert "1,058,016" in capsys.readouterr().out  # = 0.66M + 2 x 2,048 x 96


def test_every_help_starts_fast_and_says_what_the_command_does():
    """`taperlm --help` and every `taperlm COMMAND --help` as a newcomer runs them: exit 0,
    the command's one-line purpose, and no torch import for help."""
    probe = (
        "import sys; from taperlm.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n    rc = e.code\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', rc)"
    )
    for argv in (["--help"], *[[name, "--help"] for name in COMMANDS]):
        done = subprocess.run(
            [sys.executable, "-c", probe, *argv], capture_output=True, text=True, check=True
        )
        assert done.stdout.rstrip().endswith("NO-TORCH 0"), (argv, done.stdout[-300:])
        purpose = COMMANDS.get(argv[0], "Tapered Language Models")
        assert purpose in " ".join(done.stdout.split()), argv


@pytest.mark.unit
@pytest.mark.parametrize("command", ["train", "compare"])
def test_set_help_names_the_environment_overrides(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert "$TAPERLM_SET" in capsys.readouterr().out


def test_compare_without_data_says_which_corpus_it_trains_on(tmp_path, monkeypatch):
    """No --data: compare keeps its own corpus (the main job's numbers depend on its tokenizer)
    and says so, naming a folder `taperlm prepare` wrote here that it does not use."""
    from taperlm.compare.comparison import DEFAULT_CORPUS_TOKENIZER, default_corpus_note

    monkeypatch.chdir(tmp_path)
    note = default_corpus_note(tmp_path / "cache")
    assert "built-in corpus" in note and DEFAULT_CORPUS_TOKENIZER in note and "--data" in note
    assert "prepared here" not in note
    (tmp_path / "data" / "default").mkdir(parents=True)
    (tmp_path / "data" / "default" / "meta.json").write_text("{}")
    assert "data/default (prepared here) is used only with --data" in default_corpus_note(
        tmp_path / "cache"
    )


@pytest.mark.parametrize("unbuffered", [False, True], ids=["block-buffered", "unbuffered"])
@pytest.mark.parametrize(
    "argv",
    [["plan", "--list-presets"], ["plan", "--preset", "transformer-440m", "--taper", "cosine"]],
)
def test_output_piped_into_a_reader_that_stopped_is_not_an_error(argv, unbuffered):
    """`taperlm plan ... | head -1`: once the reader has closed the pipe, the command ends quietly
    with status 0, no BrokenPipeError traceback (the CLI catches it for every command). The
    pipe's read end is closed before the command writes, so every write fails."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    code = "import sys; from taperlm.cli import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    # both stdout modes: block-buffered (a user's default: what is left is written by the final
    # flush) and unbuffered (PYTHONUNBUFFERED, as some shells and CI set it)
    env.pop("PYTHONUNBUFFERED", None)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, *argv], stdout=write_end, stderr=subprocess.PIPE,
            text=True, env=env, timeout=120,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr
