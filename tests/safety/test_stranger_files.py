"""Issue 41, classes 1, 2 (binary and compressed files), 3 and 5 (their messages): what a file
says can never reach outside its folder, inflate past what it declares, or block a command.

Two walks of src/ enumerate the classes, so that a reader or writer added later without the
safe primitives fails here:

* `test_every_open_is_a_safe_one`: every way a module opens or reads a file by name (open,
  Path.read_text/read_bytes, torch.load, numpy.memmap, safetensors, tokenizers' from_file,
  pyarrow, gzip, zstandard) is either `taperlm.files.io`'s `open_regular` / `read_bytes` /
  `read_text` / `check_regular` or listed in `RAW_OPENS` with the reason it is safe;
* `test_every_deletion_and_replace_is_listed`: every call that deletes, renames or replaces a
  path is listed in `REMOVALS` with the folder it acts in (each folder whose links
  `outdirs.check_folder` walks, or a path checked with `path_inside`).

Then, per class, crafted files through the commands and the library functions that read them.
A test that opens a FIFO runs the read in a thread with a timeout, so a regression fails
instead of hanging the suite.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
import shutil
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import fault_harness as H
from conftest import raises_naming
from taperlm.cli import main as cli_main
from taperlm.errors import CheckpointError, ConfigError, DataError, TaperlmError, UnsafeFileError
from taperlm.files.io import (
    check_stored_zip,
    error_text,
    links_leading_out,
    open_append,
    sha256_file,
)
from taperlm.files.outdirs import KINDS, OUTPUT_FOLDERS, check_folder, claim
from test_hostile_files import code_lines

SRC = Path(__file__).resolve().parents[2] / "src" / "taperlm"


# ----------------------------------------------------------------------------------------------
# the walks of src/

OPEN_PATTERNS = {
    "open()": re.compile(r"(?<!def )(?<![\w.])open\(|\bos\.open\(|\bos\.fdopen\("),
    "read_text": re.compile(r"\.read_text\((?!\s*[\w.]+\s*,\s*MAX)"),
    "read_bytes": re.compile(r"\.read_bytes\("),
    "torch.load": re.compile(r"\btorch\.load\("),
    "memmap": re.compile(r"\bmemmap\(|\bfromfile\("),
    "safetensors": re.compile(r"\bload_file\(|\bsafe_open\("),
    "tokenizers": re.compile(r"\bfrom_file\("),
    "pyarrow": re.compile(r"\bParquetFile\(|\bread_table\("),
    "decompress": re.compile(r"\bGzipFile\(|\bgzip\.open\(|\bZstdDecompressor\(|\blzma\.|\bbz2\."),
}

# (module, pattern) -> why it is safe. The safe primitives themselves live in files/io.py.
RAW_OPENS: dict[tuple[str, str], str] = {
    ("files/io.py", "open()"): "the primitives: open_regular (O_NONBLOCK + fstat), open_append "
    "(O_NOFOLLOW + fstat), atomic_output's fsync of its own temporary file, fsync_dir",
    ("cli.py", "open()"): "os.devnull for --quiet",
    (
        "spec/domains.py",
        "open()",
    ): "O_CREAT|O_EXCL probe file of a writability check (never follows)",
    (
        "files/runlock.py",
        "open()",
    ): "the lock file, after not_a_file refused a FIFO/folder there; a "
    "FIFO opened read-write does not block",
    ("runtime/cpus.py", "read_text"): "/proc and /sys/fs/cgroup files of the kernel",
    ("runtime/device.py", "read_text"): "/proc/meminfo and cgroup memory files of the kernel",
    ("files/runlock.py", "read_text"): "/proc/<pid>/stat of the kernel",
    ("evaluation/harness.py", "read_text"): "a task YAML inside the installed package",
    ("evaluation/harness.py", "open()"): "writes data/<task>.jsonl into the lm-eval tasks "
    "folder, whose links check_folder refused",
    ("data/shards.py", "open()"): "the writer's own temporary shard in a data dir whose links "
    "check_folder refused",
    ("data/datadir.py", "open()"): "os.open of .prepare.lock (O_NONBLOCK) after not_a_file "
    "and path_inside",
    ("data/shards.py", "memmap"): "after read_header opened the shard with open_regular and "
    "checked its size against the header",
    ("data/val_split.py", "memmap"): "a shard of the prepare's own work folder, named by "
    "ShardSet (checked against the names it writes)",
    ("data/readers.py", "decompress"): "over open_regular, read one bounded line at a time "
    "(bounded_line, max_line_bytes)",
    ("data/readers.py", "pyarrow"): "ParquetFile of a source after check_regular",
    ("data/corpus.py", "decompress"): "over open_regular, read(MAX_DOC_FILE_BYTES + 1)",
    ("data/tokenizer.py", "tokenizers"): "vocab.json/merges.txt after check_regular",
    ("checkpoint/store.py", "safetensors"): "model.safetensors of a format-1 "
    "checkpoint after check_regular and the manifest's size/hash check",
    (
        "checkpoint/store.py",
        "torch.load",
    ): "state.pt over open_regular (its manifest size) after check_stored_zip",
    ("checkpoint/store.py", "open()"): "_fsync_file of the state.pt this process "
    "just wrote into its own temporary checkpoint",
    ("checkpoint/safe_load.py", "torch.load"): "a DCP byte item, the bytes of a "
    "_Slice that check_stored_zip passed",
    ("checkpoint/loading.py", "safetensors"): "an export's model.safetensors after check_regular",
    ("data/tokenizer_bounds.py", "open()"): "os.devnull opened for writing: fd 2 silenced "
    "while the tokenizers library may print a Rust panic",
}


def _open_hits() -> set[tuple[str, str]]:
    found = set()
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        for code in code_lines(path):
            for name, pattern in OPEN_PATTERNS.items():
                if pattern.search(code):
                    found.add((rel, name))
    return found


@pytest.mark.unit
def test_every_open_is_a_safe_one():
    """Class 3 and 2, enumerated: a module that opens a file by name without the primitives
    (a FIFO would block it, a device never end, a huge file be read whole) must say why here."""
    hits = _open_hits()
    unknown = sorted(hits - set(RAW_OPENS))
    assert not unknown, (
        "new raw opens/reads of a file: use taperlm.files.io.open_regular / read_bytes / read_text / "
        f"check_regular, or add a reason to RAW_OPENS: {unknown}"
    )
    stale = sorted(set(RAW_OPENS) - hits)
    assert not stale, f"RAW_OPENS names uses that no longer exist: {stale}"


@pytest.mark.unit
def test_the_open_walk_would_catch_a_new_reader():
    assert OPEN_PATTERNS["open()"].search('with open(path, "rb") as f:')
    assert not OPEN_PATTERNS["open()"].search("with open_regular(path) as f:")
    assert OPEN_PATTERNS["read_text"].search('data = path.read_text(encoding="utf-8")')
    assert not OPEN_PATTERNS["read_text"].search("read_text(path, MAX_RECORD_BYTES, 'x')")
    assert OPEN_PATTERNS["read_bytes"].search("raw = p.read_bytes()")
    assert OPEN_PATTERNS["memmap"].search("np.memmap(path, dtype=d)")
    assert OPEN_PATTERNS["safetensors"].search("load_file(str(p))")
    assert OPEN_PATTERNS["decompress"].search("gzip.open(path)")


REMOVAL = re.compile(
    r"\brmtree\(|\.unlink\(|\bos\.remove\(|\bos\.unlink\(|\bos\.replace\(|\.rename\(|\.rmdir\("
)

# module -> where its deletions, renames and replacements act (every folder is one whose links
# outdirs.check_folder refused before the command wrote, or the path is checked by path_inside).
REMOVALS: dict[str, str] = {
    "files/io.py": "atomic_output / replace_dir: a temporary beside the target, renamed over it "
    "(os.replace replaces a link itself, never its target)",
    "spec/domains.py": "its own O_EXCL probe file",
    "training/run_dir.py": "the lock and marker it created in a run dir it created; after a "
    "failed import, what it created in the run dir it claimed (checkpoints/, the tokenizer copy, "
    "config.yaml, its lock and marker)",
    "checkpoint/store.py": "checkpoints/ of a run dir (check_folder walked it): temp "
    "dirs named by pid, step_* dirs renamed aside then removed",
    "hf/export.py": "its own staging folder inside the export folder",
    "files/outdirs.py": "install_files: its staged files moved in, and stale files of the folder's "
    "record (each name path_inside checked, and unchanged since it wrote them)",
    "evaluation/harness.py": "its own staging folder inside the lm-eval tasks folder",
    "compare/comparison.py": "its own temporary and target folders inside the compare folder",
    "data/val_split.py": "shards of the prepare's own work folder",
    "data/identity.py": "its own temporary and stale copies of the run's tokenizer",
    "data/datadir.py": "moves of shard names meta.json may hold (split_shards checks them, "
    "path_inside too) and of tokenizer/; stale shard names of the folder's own listing",
    "data/prepare.py": "the prepare's own work folder and state file",
    "data/shards.py": "the writer's own temporary shard and shards after the saved state",
}


@pytest.mark.unit
def test_every_deletion_and_replace_is_listed():
    """Class 1, enumerated: every module that deletes or replaces a path says in which folder
    (so a new one must show that a file named by a stranger cannot be reached)."""
    hits = set()
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        if any(REMOVAL.search(code) for code in code_lines(path)):
            hits.add(rel)
    unknown = sorted(hits - set(REMOVALS))
    assert not unknown, f"new deletions/replacements, say where in REMOVALS: {unknown}"
    stale = sorted(set(REMOVALS) - hits)
    assert not stale, f"REMOVALS names modules that no longer delete anything: {stale}"


# ----------------------------------------------------------------------------------------------
# class 1: every folder we write in


def _outside(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    victim.mkdir(exist_ok=True)
    (victim / "thesis.txt").write_text("years of work\n")
    return victim


@pytest.mark.unit
@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("where", ["sub", "file", "deep", "dangling"])
def test_every_output_folder_refuses_a_link_leading_out(tmp_path, kind, where):
    """Every folder kind a command writes (OUTPUT_FOLDERS) is walked before the command writes:
    a link inside it (a subfolder, a file, deeper, or dangling) that leads out is refused."""
    assert kind in set(OUTPUT_FOLDERS.values())
    folder = tmp_path / "out"
    claim(folder, kind)
    victim = _outside(tmp_path)
    link = {
        "sub": folder / "tensorboard",
        "file": folder / "metrics.jsonl",
        "deep": folder / "checkpoints" / "step_00000001",
        "dangling": folder / "new.json",
    }[where]
    link.parent.mkdir(parents=True, exist_ok=True)
    target = {"sub": victim, "file": victim / "thesis.txt", "deep": victim}.get(
        where, victim / "not-yet"
    )
    link.symlink_to(target)
    with raises_naming(ConfigError, str(folder), str(link.relative_to(folder)), "Remove the link"):
        check_folder(folder, kind, "--out")
    link.unlink()
    check_folder(folder, kind, "--out")  # without the link: accepted
    (folder / "inner").mkdir()
    (folder / "alias").symlink_to(folder / "inner")  # a link that stays inside is fine
    check_folder(folder, kind, "--out")


@pytest.mark.unit
def test_links_leading_out_finds_each_link(tmp_path):
    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    victim = _outside(tmp_path)
    (root / "a" / "b" / "x").symlink_to(victim / "thesis.txt")
    (root / "a" / "in").symlink_to(root / "a" / "b")
    (root / "loop").symlink_to(root / "loop")
    found = links_leading_out(root)
    assert [p.name for p, _ in found] == ["x"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return H.prepare_data(tmp_path_factory.mktemp("stranger"))


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("trained") / "run"
    assert cli_main([*H.train_argv(data, run), "--stop-after-steps", "2"]) == 0
    return run


def _run_cli(argv: list[str], capsys) -> tuple[int, str]:
    try:
        rc = cli_main(argv)
    except SystemExit as exc:
        rc = exc.code
    return rc, capsys.readouterr().err


def test_a_symlinked_tensorboard_folder_gets_nothing(trained, data, tmp_path, capsys):
    """The issue's sample: RUN/tensorboard linked to a folder of the user's; resume refuses
    before a byte is written there."""
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    victim = _outside(tmp_path)
    (run / "tensorboard").symlink_to(victim)
    rc, err = _run_cli(H.train_argv(data, run), capsys)
    assert rc == 2 and "tensorboard" in err and "leads outside it" in err, err
    assert sorted(p.name for p in victim.iterdir()) == ["thesis.txt"]


@pytest.mark.unit
def test_export_record_cannot_delete_outside(tmp_path):
    """An edited `.taperlm-export` record listing `../victim/thesis.txt` with its hash: the
    install refuses it, the file stays."""
    from taperlm.files.outdirs import install_files

    out = tmp_path / "out"
    claim(out, "export")
    victim = _outside(tmp_path)
    thesis = victim / "thesis.txt"
    for name in ("../victim/thesis.txt", str(thesis)):
        record = {"written_by": "taperlm", "files": {name: [sha256_file(thesis)]}}
        (out / KINDS["export"].marker).write_text(json.dumps(record))
        staging = out / ".staging"
        staging.mkdir(exist_ok=True)
        (staging / "config.json").write_text("{}")
        with raises_naming(UnsafeFileError, repr(name), str(out), "outside"):
            install_files(staging, out, "export", "--out", "export to another folder")
        assert thesis.read_text() == "years of work\n"


@pytest.mark.unit
def test_an_unfinished_commit_cannot_move_a_file_outside(data, tmp_path):
    """A data dir whose unfinished commit names a shard `../victim.txt`: finishing the commit
    (what the next prepare does first) refuses, and the file beside the data dir stays."""
    from taperlm.data.datadir import COMMIT_DIR, roll_forward

    out = tmp_path / "data"
    shutil.copytree(data, out)
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    pending = out / COMMIT_DIR
    pending.mkdir()
    meta = json.loads((out / "meta.json").read_text())
    meta["splits"]["train"]["shards"][0]["file"] = "../victim.txt"
    (pending / "meta.json").write_text(json.dumps(meta))
    (pending / "victim.txt").write_text("crafted\n")
    with raises_naming(DataError, "'../victim.txt'", "taperlm prepare", "train-00000.bin"):
        roll_forward(out)
    assert victim.read_text() == "mine\n"


@pytest.mark.parametrize("name", ["../victim.txt", "/etc/passwd", "sub/train-00000.bin"])
def test_meta_json_shard_names_are_names_prepare_writes(data, tmp_path, name):
    from taperlm.data.loader import open_split

    out = tmp_path / "data"
    shutil.copytree(data, out)
    meta = json.loads((out / "meta.json").read_text())
    meta["splits"]["val"]["shards"][0]["file"] = name
    (out / "meta.json").write_text(json.dumps(meta))
    with raises_naming(DataError, repr(name), "taperlm prepare", "val-00000.bin"):
        open_split(out, "val")


def _newest(run: Path) -> Path:
    return sorted((run / "checkpoints").glob("step_*"))[-1]


def _rehash(ckpt: Path) -> None:
    manifest = json.loads((ckpt / "manifest.json").read_text())
    for name in manifest["files"]:
        if (ckpt / name).is_file():
            manifest["files"][name] = {
                "sha256": H._sha256(ckpt / name),
                "bytes": (ckpt / name).stat().st_size,
            }
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


def _edit_index(ckpt: Path, change: Callable[[Any, Any], None], which: str = "model.") -> None:
    """Rewrite the `.metadata` of `ckpt` with `change(storage_info, index)` applied to the items
    whose key starts with `which`, and update the manifest's hashes (what an attacker does)."""
    from taperlm.checkpoint import safe_load

    meta = safe_load.read_metadata(ckpt)
    for index, info in meta.storage_data.items():
        if index.fqn.startswith(which):
            change(info, index)
    (ckpt / ".metadata").write_bytes(pickle.dumps(meta))
    _rehash(ckpt)


def _copy(trained: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    return run


def _set(attr: str, value: Any) -> Callable[[Any, Any], None]:
    return lambda info, _index: setattr(info, attr, value)


INDEX_EDITS = {
    "other checkpoint": ("model.", _set("relative_path", "../step_00000001/__0_0.distcp")),
    "absolute path": ("model.", _set("relative_path", "/etc/passwd")),
    "dev zero (optimizer bytes)": ("optimizer.param_groups", _set("relative_path", "/dev/zero")),
    "zstd transform": ("model.", _set("transform_descriptors", ["stream.zstd"])),
    "past the end": ("model.", _set("length", 1 << 40)),
    "negative offset": ("model.", _set("offset", -5)),
}


@pytest.mark.parametrize("case", sorted(INDEX_EDITS))
def test_the_index_reads_only_what_the_manifest_verified(trained, tmp_path, case):
    """Classes 1 and 2: `.metadata` naming a file outside the checkpoint, an absolute path,
    /dev/zero, a decoding transform (torch's stream.zstd), or a range past the file: nothing is
    read, for inference (eval/generate/export) and for a resume."""
    from taperlm.checkpoint import store

    run = _copy(trained, tmp_path)
    ckpt = _newest(run)
    which, change = INDEX_EDITS[case]
    _edit_index(ckpt, change, which)
    store.verify_checkpoint(ckpt)  # the attacker rehashed: the files verify
    if which == "model.":
        with raises_naming(CheckpointError, str(ckpt), "crafted", "delete this checkpoint") as got:
            store.load_model_state(ckpt)
        assert "weights_only" not in str(got.value)
    else:  # the optimizer's items are read by a resume only
        import torch

        from taperlm.config import load_run_config
        from taperlm.models import TaperedLM
        from taperlm.training.checkpointer import restore_training

        cfg = load_run_config(run / "config.yaml")
        cfg.resolve()
        model = TaperedLM(cfg.model)
        optimizer = torch.optim.AdamW(model.parameters())
        with raises_naming(CheckpointError, str(ckpt), "crafted", "delete this checkpoint"):
            restore_training(ckpt, model, optimizer, [])


def test_a_manifest_naming_a_file_outside_is_refused(trained, tmp_path):
    from taperlm.checkpoint import store

    run = _copy(trained, tmp_path)
    ckpt = _newest(run)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"]["../step_00000001/__0_0.distcp"] = manifest["files"]["__0_0.distcp"]
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    with raises_naming(CheckpointError, str(ckpt), "'../step_00000001/__0_0.distcp'", "delete"):
        store.verify_checkpoint(ckpt)


# ----------------------------------------------------------------------------------------------
# class 2: archives that inflate


def _deflated_copy(raw: bytes) -> bytes:
    src = zipfile.ZipFile(io.BytesIO(raw))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for info in src.infolist():
            z.writestr(info.filename, src.read(info.filename))
    return out.getvalue()


def test_a_deflated_state_pt_is_refused_before_torch_reads_it(trained, tmp_path):
    """The issue's 973 KB state.pt that inflates to 1 GB: torch's reader inflates DEFLATE
    members; taperlm refuses any compressed member first (torch never writes one)."""
    import torch

    from taperlm.checkpoint import store

    run = _copy(trained, tmp_path)
    ckpt = _newest(run)
    state = ckpt / "state.pt"
    deflated = _deflated_copy(state.read_bytes())
    assert torch.load(io.BytesIO(deflated), weights_only=True)["step"] == 2  # torch reads it
    state.write_bytes(deflated)
    _rehash(ckpt)
    with raises_naming(CheckpointError, "state.pt", "compressed"):
        store.load_train_state(ckpt)


def test_a_deflated_shard_item_is_refused_before_torch_reads_it(trained, tmp_path):
    """The same inside a DCP shard: one model tensor's item re-zipped with DEFLATE, appended to
    its shard and pointed at by the index (the hashes rewritten): refused, not inflated."""
    from taperlm.checkpoint import store

    run = _copy(trained, tmp_path)
    ckpt = _newest(run)
    done: list[str] = []

    def deflate(info: Any, index: Any) -> None:
        if done:
            return
        shard = ckpt / info.relative_path
        raw = shard.read_bytes()
        item = _deflated_copy(raw[info.offset : info.offset + info.length])
        shard.write_bytes(raw + item)
        info.offset, info.length = len(raw), len(item)
        done.append(index.fqn)

    _edit_index(ckpt, deflate)
    assert done
    store.verify_checkpoint(ckpt)
    with raises_naming(CheckpointError, str(ckpt), "compressed"):
        store.load_model_state(ckpt)


def test_check_stored_zip_accepts_torch_and_refuses_the_rest():
    import torch

    buf = io.BytesIO()
    torch.save({"a": torch.zeros(4)}, buf)
    raw = buf.getvalue()
    check_stored_zip(io.BytesIO(raw), len(raw), "x")  # what torch writes passes
    with raises_naming(UnsafeFileError, "x holds", "compressed"):
        check_stored_zip(io.BytesIO(_deflated_copy(raw)), len(raw), "x")
    with raises_naming(UnsafeFileError, "x is", "archive"):
        check_stored_zip(io.BytesIO(b"not a zip at all" * 10), 160, "x")
    # a member stored in the central directory but deflated in its local header
    lying = bytearray(raw)
    lying[8:10] = (8).to_bytes(2, "little")  # the first local header's method: DEFLATE
    with raises_naming(UnsafeFileError, "x holds", "compressed"):
        check_stored_zip(io.BytesIO(bytes(lying)), len(raw), "x")


@pytest.mark.unit
def test_a_zst_with_one_huge_line_is_refused_within_its_bound(tmp_path):
    """A 20 MB line compressed to a few KB with --max-doc-chars 1000: refused after at most
    12 x 1000 + 1 MiB bytes (the bound), not decompressed whole."""
    import tracemalloc

    zstd = pytest.importorskip("zstandard")
    from taperlm.data.readers import max_line_bytes, read_local

    line = b'{"text": "' + b"a" * (20 << 20) + b'"}\n'
    path = tmp_path / "bomb.jsonl.zst"
    path.write_bytes(zstd.ZstdCompressor().compress(line))
    assert path.stat().st_size < 100_000
    tracemalloc.start()
    try:
        with raises_naming(DataError, str(path), "line", "longer than"):
            list(read_local([path], tmp_path, cap=1000))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * max_line_bytes(1000), peak
    ok = tmp_path / "ok.jsonl.zst"  # a document longer than the cap is still cut, not refused
    ok.write_bytes(zstd.ZstdCompressor().compress(b'{"text": "' + b"b " * 4000 + b'"}\n'))
    assert len(list(read_local([ok], tmp_path, cap=1000))) >= 8


def test_error_text_is_bounded_and_never_advises_weights_only():
    import torch

    class P:
        def __reduce__(self):
            return (os.system, ("true",))

    buf = io.BytesIO()
    torch.save({"x": P()}, buf)
    buf.seek(0)
    with pytest.raises(Exception) as got:
        torch.load(buf, weights_only=True)
    text = error_text(got.value)
    assert "weights_only" not in text and "posix.system" in text, text
    assert len(error_text(ValueError("x" * 100_000))) < 400


@pytest.mark.unit
def test_a_parquet_page_declaring_too_much_is_refused_from_its_footer(tmp_path):
    """The Parquet form of the line bomb: one 20 MB value compressed to a few KB is refused
    from the footer's declared sizes, before a page is decompressed; a document above the cap
    but within the bound is still read and cut."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from taperlm.data.readers import read_local

    path = tmp_path / "bomb.parquet"
    pq.write_table(pa.table({"text": ["a" * (20 << 20)]}), path, compression="zstd")
    assert path.stat().st_size < 100_000
    with raises_naming(DataError, str(path), "text"):
        list(read_local([path], tmp_path, cap=1000))
    ok = tmp_path / "ok.parquet"
    pq.write_table(pa.table({"text": ["b " * 4000]}), ok, compression="zstd")
    assert len(list(read_local([ok], tmp_path, cap=1000))) >= 8


@pytest.mark.unit
def test_no_printed_message_is_unbounded(monkeypatch, capsys):
    """Whatever a message quotes from a file (a 10 MB key name), the CLI prints a bounded line."""
    from taperlm.commands import plan
    from taperlm.files.io import MAX_MESSAGE

    def crafted(args):
        raise CheckpointError("checkpoint X does not fit: " + "k" * (10 << 20))

    monkeypatch.setattr(plan, "run", crafted)
    rc, err = _run_cli(["plan", "--preset", "transformer-micro"], capsys)
    assert rc == 2 and len(err) < MAX_MESSAGE + 200 and "characters ...]" in err


# ----------------------------------------------------------------------------------------------
# class 3: nothing we open blocks; class 5: messages


def _no_block(fn: Callable[[], Any], timeout: float = 20.0) -> BaseException | None:
    """Run `fn` in a thread; fail if it is still running after `timeout` (it blocked)."""
    done: list[BaseException | None] = []

    def target():
        try:
            fn()
            done.append(None)
        except BaseException as err:
            done.append(err)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    assert done, "the call blocked on a FIFO"
    return done[0]


def _fifo(path: Path) -> Path:
    if path.exists() or path.is_symlink():
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    os.mkfifo(path)
    return path


def _data_case(rel: str, call: str) -> Callable[[Path, Path, Path], Any]:
    def case(data: Path, run: Path, tmp: Path) -> Any:
        from taperlm.data.datadir import exclusive, load_meta
        from taperlm.data.loader import open_split
        from taperlm.data.tokenizer import load_tokenizer

        d = tmp / "data"
        shutil.copytree(data, d)
        _fifo(d / rel)
        if call == "meta":
            return load_meta(d)
        if call == "split":
            return open_split(d, "train")
        if call == "tokenizer":
            return load_tokenizer(d)
        with exclusive(d):
            return None

    return case


def _ckpt_case(rel: str, call: str) -> Callable[[Path, Path, Path], Any]:
    def case(data: Path, run: Path, tmp: Path) -> Any:
        from taperlm.checkpoint import store

        r = tmp / "run"
        shutil.copytree(run, r)
        ckpt = _newest(r)
        _fifo(ckpt / rel)
        if call == "verify":
            return store.verify_checkpoint(ckpt)
        if call == "state":
            return store.load_train_state(ckpt)
        return store.load_model_state(ckpt, verify=False)

    return case


def _run_case(rel: str, call: Callable[[Path], Any]) -> Callable[[Path, Path, Path], Any]:
    def case(data: Path, run: Path, tmp: Path) -> Any:
        r = tmp / "run"
        shutil.copytree(run, r)
        _fifo(r / rel)
        return call(r)

    return case


def _metrics(r: Path) -> Any:
    from taperlm.training.metrics import read_metrics

    return read_metrics(r / "metrics.jsonl")


def _config(r: Path) -> Any:
    from taperlm.config import load_run_config

    return load_run_config(r / "config.yaml")


def _data_record(r: Path) -> Any:
    from taperlm.data.identity import read_record

    return read_record(r)


def _novelty(data: Path, run: Path, tmp: Path) -> Any:
    from taperlm.analysis.sources import first_tokens

    return first_tokens(_fifo(tmp / "text.txt"), lambda t: list(t.encode()), 64)


def _source(data: Path, run: Path, tmp: Path) -> Any:
    from taperlm.data.readers import read_local

    return list(read_local([_fifo(tmp / "a.jsonl")], tmp, cap=1000))


def _append(data: Path, run: Path, tmp: Path) -> Any:
    with open_append(_fifo(tmp / "sessions.jsonl"), "sessions file") as f:
        f.write("x\n")


def _result(data: Path, run: Path, tmp: Path) -> Any:
    from taperlm.compare.cell import read_result

    _fifo(tmp / "result.json")
    assert read_result(tmp) is None  # a damaged result is recomputed
    raise UnsafeFileError("FIFO: recomputed")


FIFO_CASES: dict[str, Callable[[Path, Path, Path], Any]] = {
    "data meta.json": _data_case("meta.json", "meta"),
    "data shard": _data_case("train-00000.bin", "split"),
    "data .prepare.lock": _data_case(".prepare.lock", "lock"),
    "data tokenizer.json": _data_case("tokenizer/tokenizer.json", "tokenizer"),
    "checkpoint .metadata": _ckpt_case(".metadata", "verify"),
    "checkpoint state.pt": _ckpt_case("state.pt", "state"),
    "checkpoint manifest.json": _ckpt_case("manifest.json", "verify"),
    "checkpoint shard (unverified load)": _ckpt_case("__0_0.distcp", "model"),
    "run metrics.jsonl": _run_case("metrics.jsonl", _metrics),
    "run config.yaml": _run_case("config.yaml", _config),
    "run data.json": _run_case("data.json", _data_record),
    "novelty --data": _novelty,
    "prepare --source file": _source,
    "appended file": _append,
    "compare result.json": _result,
}

# What each message must say (class 5): the kind of file, never "not found" or "not seekable".
FIFO_WORDS = re.compile(r"FIFO|named pipe")


@pytest.mark.parametrize("case", sorted(FIFO_CASES))
def test_a_fifo_never_blocks_and_is_named(case, data, trained, tmp_path):
    err = _no_block(lambda: FIFO_CASES[case](data, trained, tmp_path))
    assert isinstance(err, TaperlmError), repr(err)
    text = str(err)
    assert FIFO_WORDS.search(text), text
    for wrong in ("not found", "not seekable", "has no meta.json", "does not exist"):
        assert wrong not in text, text
    assert "\n" not in text


def _input_options() -> list[tuple[str, str]]:
    from taperlm.cli import COMMANDS, build_parser, subcommand_parser
    from taperlm.spec.domains import PathArg

    parser = build_parser()
    found = []
    for name in COMMANDS:
        for action in subcommand_parser(parser, name)._actions:
            if isinstance(action.type, PathArg) and action.type.role == "input":
                found.append(
                    (name, action.option_strings[0] if action.option_strings else action.dest)
                )
    return found


INPUT_OPTIONS = _input_options()


@pytest.mark.unit
def test_the_input_options_are_enumerated():
    assert ("novelty", "--data") in INPUT_OPTIONS and ("train", "--config") in INPUT_OPTIONS
    assert len(INPUT_OPTIONS) >= 15


@pytest.mark.unit
@pytest.mark.parametrize("command,option", INPUT_OPTIONS)
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_every_input_option_refuses_a_special_file(tmp_path, command, option, kind):
    """Class 3, every open of a user-supplied path: each input path option of each command
    (found in the parsers) given a FIFO or a device is one ConfigError naming the option and
    the kind, before the command reads anything."""
    import argparse

    from taperlm.cli import build_parser, subcommand_parser
    from taperlm.spec.domains import check_arguments

    sub = subcommand_parser(build_parser(), command)
    args = argparse.Namespace(**{a.dest: a.default for a in sub._actions})
    path = _fifo(tmp_path / "special") if kind == "fifo" else Path("/dev/zero")
    action = next(a for a in sub._actions if option in (a.dest, *a.option_strings))
    setattr(args, action.dest, action.type(str(path)))
    err = _no_block(lambda: check_arguments(sub, args))
    assert isinstance(err, ConfigError), repr(err)
    shown = option if option.startswith("-") else option.upper()  # a positional: RUN
    assert str(err).startswith(f"{shown} {path} is "), str(err)
    assert ("FIFO" in str(err)) == (kind == "fifo") and "device" in str(err), str(err)


def test_novelty_data_fifo_through_the_cli(trained, tmp_path, capsys):
    """The issue's sample: `novelty RUN --data FIFO` hung; now one line, exit 2."""
    fifo = _fifo(tmp_path / "text.txt")
    box: dict[str, Any] = {}
    argv = ["novelty", str(trained), "--data", str(fifo), "--tokens", "64"]
    assert _no_block(lambda: box.update(out=_run_cli(argv, capsys)), 60) is None
    rc, text = box["out"]
    assert rc == 2 and "FIFO" in text and text.count("\n") == 1, text


def test_a_fifo_run_file_fails_the_resume_clearly(data, trained, tmp_path, capsys):
    """A FIFO where a run file should be (metrics.jsonl) hangs no resume: a one-line error."""
    run = _copy(trained, tmp_path)
    _fifo(run / "metrics.jsonl")
    box: dict[str, Any] = {}
    err = _no_block(lambda: box.update(out=_run_cli(H.train_argv(data, run), capsys)), 120)
    assert err is None
    rc, text = box["out"]
    assert rc == 2 and FIFO_WORDS.search(text) and "Traceback" not in text, text


def test_a_state_pt_without_loader_is_a_clear_error(data, trained, tmp_path, capsys):
    import torch

    run = _copy(trained, tmp_path)
    ckpt = _newest(run)
    state = torch.load(ckpt / "state.pt", weights_only=True)
    del state["loader"]
    torch.save(state, ckpt / "state.pt")
    _rehash(ckpt)
    rc, err = _run_cli(H.train_argv(data, run), capsys)
    assert rc == 2, err
    assert "has no 'loader' entry" in err and "KeyError" not in err.split("(")[0], err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_checkpoint_errors_say_it_once(trained, tmp_path):
    """A shard that fails DCP's read: one message naming the checkpoint once, no torch advice."""
    from taperlm.checkpoint import store

    run = _copy(trained, tmp_path)
    ckpt = _newest(run)
    shard = ckpt / "__0_0.distcp"
    shard.write_bytes(b"\0" * shard.stat().st_size)
    _rehash(ckpt)
    with pytest.raises(CheckpointError) as got:
        store.load_model_state(ckpt)
    text = str(got.value)
    assert text.count("delete this checkpoint") == 1, text
    assert "weights_only" not in text and "\n" not in text, text
