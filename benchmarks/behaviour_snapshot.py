"""A snapshot of the CLI's observable behaviour, to show that a refactor changed none of it.

`--out DIR` runs a fixed list of `taperlm` commands (every --help, `plan` over presets, families
and tapers, `prepare` of a corpus written here, tiny `train` runs of every family and schedule,
`eval`, `novelty`, `allocate`, `generate`, `export`, `prune` and a tiny `compare`) against the
source tree `--src` in a temporary working folder, and writes one text file per item: the
command, its exit code, stdout, stderr, and every file it wrote (text files normalised in full,
others by sha256; a checkpoint's tensors one hash each). `--compare A B` names the items that
differ between two snapshots (exit 1 if any); `diff -r A B` shows how.

Everything is run with one torch thread on the CPU, so the numbers are bit-identical from one
run to the next on the same machine and torch; what is inherently not reproducible is replaced
by a placeholder (NORMALISE and the JSON keys in TIME_KEYS): wall-clock times, throughput, dates,
absolute paths, process ids, versions, and the pickled DCP index (`.metadata`: it holds the
temporary path and a random save id, so it is summarised by its entries instead).
Run time: about 3 CPU-minutes, 70 commands (15 minutes of wall time on 2 cores at load average
10-12). benchmarks/README.md, "Behaviour snapshot".
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import random
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from outputs import FOLDER_MARKER, claim_folder, folder_problem, write_output

REPO = Path(__file__).resolve().parents[1]
ENTRY = "import sys; from taperlm.cli import main; sys.exit(main())"
INDEX = "index.json"  # the items in the order they ran, with exit codes

# The tiny training shape of tests/conftest.py's TINY_RUN_SETS (2 layers, d_model 32; steps of
# 256 tokens in two micro-batches of 4 x 32), 8 steps, every step logged, a validation loss
# and a checkpoint every 4 steps, per-layer gradient norms every 2.
TINY = [
    "model.n_layers=2",
    "model.d_model=32",
    "model.n_heads=2",
    "model.mlp_width=96",
    "model.vocab_size=512",
    "model.context_length=64",
    "train.seq_len=32",
    "train.micro_batch_size=4",
    "train.batch_tokens=256",
    "train.tokens=2048",
    "train.warmup_tokens=512",
    "train.lr=0.003",
    "train.log_every=1",
    "train.eval_every=4",
    "train.eval_tokens=256",
    "train.checkpoint_every=4",
    "train.log_grads_every=2",
]

# Text that differs between two runs of the same code: (pattern, replacement), applied in order
# to stdout, stderr and every text file (after the working folder's path became <WORK>).
NORMALISE: list[tuple[re.Pattern[str], str]] = [
    (re.compile(p), r)
    for p, r in [
        # a traceback's frames name source lines, which a refactor moves: its last line stays
        (r"Traceback \(most recent call last\):\n(?:[ \t].*\n)+", "Traceback: <frames>\n"),
        # dates and times of day (ISO, report headers, session records)
        (r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?( ?UTC|Z|[+-]\d{2}:?\d{2})?", "<DATE>"),
        # process ids in temporary names (checkpoints/.tmp-step_00000008-7597)
        (r"(\.tmp-[\w.-]*?)-\d+\b", r"\1-<PID>"),
        # throughput
        (r"[\d,]+(\.\d+)? ?(tokens/s|tok/s|items/s|it/s|steps/s)", r"<RATE> \2"),
        # progress bars of other libraries (tqdm): "[00:00<00:00, 9.1 it/s]", "[00:00<?, ?it/s]"
        (r"\[\d+:\d{2}(:\d{2})?<[^\]\n]*\]", "[<TIME>]"),
        # durations: "0.4 min", "8 s elapsed", "(0.1s)", "ETA 0.2 min", "0.1 CPU-min"
        (r"\b\d[\d,]*(\.\d+)? ?(ms|s|sec|seconds|min|CPU-min|h)\b", r"<TIME> \2"),
        # prepare's phase breakdown: "(tokenizer 0.1, tokenize 0.1, finish 0.0, commit 0.0)"
        (r"\b(tokenizer|tokenize|finish|commit|read|write) \d+\.\d+\b", r"\1 <TIME>"),
        # versions
        (r"\btaperlm \d+\.\d+(\.\d+)?[\w.+-]*", "taperlm <VERSION>"),
        (r"\btorch \d+\.\d+(\.\d+)?[\w.+-]*", "torch <VERSION>"),
        (r"Matplotlib version ?\d+\.\d+(\.\d+)?[\w.+-]*", "Matplotlib <VERSION>"),
        # the machine's CPU count (compare's scheduling message)
        (r"\b\d+ usable CPU\(s\)", "<N> usable CPU(s)"),
        (r"\b\d+(\.\d+)? busy with other processes", "<N> busy with other processes"),
    ]
]

# JSON keys whose values are times, rates, dates or versions: the key stays, its value becomes
# "<dropped>" (so a key that appears or vanishes still shows).
TIME_KEYS = re.compile(
    r"^(.*_s|.*_seconds|seconds|elapsed|wall|times|run_times|created|started|finished_at|"
    r"tokens_per_s|items_per_s|mfu|taperlm_version|torch_version|python_version|pid|host|"
    r"hostname)$"
)

# Markdown table columns holding times or rates (their cells become "<dropped>").
TIME_COLUMNS = re.compile(r"tokens/s|tok/s|items/s|seconds|\btime\b|wall|min/run", re.I)

# Text files recorded by the hash of their normalised text: longer than LARGE_TEXT characters,
# or a tokenizer's vocabulary (copied into every run dir; its bytes are what matters).
LARGE_TEXT = 100_000
HASHED_TEXT = {"tokenizer.json", "vocab.json", "merges.txt"}

TEXT_SUFFIXES = {".json", ".jsonl", ".yaml", ".yml", ".md", ".txt", ".csv", ".lst", ".raw", ""}


# ---------------------------------------------------------------------------------------------
# normalisation


def normalise_text(text: str, roots: list[tuple[str, str]]) -> str:
    """`text` with absolute paths (`roots`: (path, placeholder)) and NORMALISE applied, and
    markdown table cells under TIME_COLUMNS dropped."""
    for path, placeholder in roots:
        text = text.replace(path, placeholder)
    for pattern, replacement in NORMALISE:
        text = pattern.sub(replacement, text)
    return _drop_time_columns(text)


def normalise_output(text: str, roots: list[tuple[str, str]]) -> str:
    """A command's stdout: a JSON document (`--json`) normalised as JSON (TIME_KEYS dropped) and
    printed with indent 2 in its own key order, anything else as text."""
    try:
        value = json.loads(text)
    except ValueError:
        return normalise_text(text, roots)
    if not isinstance(value, (dict, list)):
        return normalise_text(text, roots)
    return json.dumps(normalise_json(value, roots), indent=2, ensure_ascii=False) + "\n"


def _drop_time_columns(text: str) -> str:
    out, header = [], None
    for line in text.split("\n"):
        if line.startswith("|") and line.rstrip().endswith("|"):
            cells = line.strip().strip("|").split("|")
            if header is None:
                header = [i for i, c in enumerate(cells) if TIME_COLUMNS.search(c)]
            elif header and not set(line) <= set("|-: "):
                cells = [" <dropped> " if i in header else c for i, c in enumerate(cells)]
                line = "|" + "|".join(cells) + "|"
        else:
            header = None
        out.append(line)
    return "\n".join(out)


def normalise_json(value: Any, roots: list[tuple[str, str]]) -> Any:
    """`value` with TIME_KEYS' values dropped and every string normalised like text."""
    if isinstance(value, dict):
        return {
            k: "<dropped>" if TIME_KEYS.match(str(k)) else normalise_json(v, roots)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [normalise_json(v, roots) for v in value]
    if isinstance(value, str):
        return normalise_text(value, roots)
    return value


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def describe_file(path: Path, rel: str, roots: list[tuple[str, str]]) -> tuple[list[str], bool]:
    """The lines that record one written file (its normalised text, or size and sha256), and
    whether normalising changed it (then its bytes vary from run to run)."""
    data = path.read_bytes()
    name = path.name
    if name == ".metadata":  # DCP's pickled index: temp path and a random save id inside
        return [f"== {rel}: DCP index", *dcp_index(path.parent)], True
    if path.suffix in TEXT_SUFFIXES and _is_text(data):
        text = data.decode("utf-8")
        if path.suffix == ".json":
            value = json.loads(text)
            plain = json.dumps(value, indent=1, ensure_ascii=False)
            if name == "manifest.json" and ".metadata" in value.get("files", {}):
                # its size varies with the temporary path's length too
                value["files"][".metadata"] = "<DCP index, see .metadata>"
            body = json.dumps(normalise_json(value, roots), indent=1, ensure_ascii=False)
        elif path.suffix == ".jsonl":
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
            plain = "\n".join(json.dumps(r) for r in rows)
            body = "\n".join(json.dumps(normalise_json(r, roots)) for r in rows)
        else:
            plain, body = text, normalise_text(text, roots)
        if len(body) > LARGE_TEXT or name in HASHED_TEXT:
            digest = sha256_bytes(body.encode())
            lines = [
                f"== {rel}: text, normalised, {body.count(chr(10)) + 1} lines, sha256 {digest}"
            ]
            return lines, body != plain
        return [f"== {rel}: text, normalised", body], body != plain
    return [f"== {rel}: {len(data)} bytes, sha256 {sha256_bytes(data)}"], False


def _is_text(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return b"\0" not in data


# The globals a DCP index (`.metadata`, a pickle) holds: plain dataclasses and enums of DCP,
# torch.Size and dtypes, paths, OrderedDict. The index is unpickled with only these allowed
# (no plain pickle load), although every checkpoint read here was written by this snapshot.
DCP_GLOBALS = {
    "torch.distributed.checkpoint.metadata": {
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
        "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.distributed.checkpoint.planner": {"LoadItemType", "WriteItemType"},
    "torch": {"Size"},
    "torch.serialization": {"_get_layout"},
    "pathlib": {"Path", "PosixPath", "PurePosixPath"},
    "collections": {"OrderedDict"},
}  # fmt: skip


def dcp_reader(checkpoint: Path) -> Any:
    """torch's DCP file-system reader of `checkpoint` whose index is read with DCP_GLOBALS only."""
    import pickle

    import torch
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class Index(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if name in DCP_GLOBALS.get(module, ()) or (
                module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
            ):
                return super().find_class(module, name)
            raise pickle.UnpicklingError(f"{checkpoint}/.metadata holds {module}.{name}")

    class Reader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            with open(checkpoint / ".metadata", "rb") as f:
                meta = Index(f).load()
            meta.storage_meta = meta.storage_meta or StorageMeta()
            meta.storage_meta.load_id = self.load_id
            return meta

    return Reader(str(checkpoint))


def dcp_index(checkpoint: Path) -> list[str]:
    """The entries of a DCP checkpoint's index (name, shape/type, where in which shard)."""
    meta = dcp_reader(checkpoint).read_metadata()
    lines = []
    for key, item in meta.state_dict_metadata.items():
        size = getattr(item, "size", None)
        kind = f"tensor {tuple(size)} {item.properties.dtype}" if size is not None else "bytes"
        lines.append(f"{key}: {kind}")
    for index, info in meta.storage_data.items():
        lines.append(
            f"  {index.fqn} {index.offset} -> {info.relative_path}@{info.offset}+{info.length}"
        )
    return lines


def tensor_hashes(checkpoint: Path) -> list[str]:
    """sha256 of every tensor (and the value of every other entry) of a DCP checkpoint, read
    with torch's own DCP reader (not taperlm's), so a refactor of the reader cannot hide a
    change of the numbers."""
    import warnings

    import torch
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group: loading in one process"
        state = _load_state_dict_from_keys(storage_reader=dcp_reader(checkpoint))
    lines = []
    for key, value in _flatten(state):
        if isinstance(value, torch.Tensor):
            raw = value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
            lines.append(f"{key}: {tuple(value.shape)} {value.dtype} {sha256_bytes(raw.tobytes())}")
        else:
            lines.append(f"{key}: {value!r}")
    return lines


def _flatten(value: Any, prefix: str = ""):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _flatten(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _flatten(v, f"{prefix}.{i}")
    else:
        yield prefix, value


# ---------------------------------------------------------------------------------------------
# running


class Snapshot:
    """Runs the items in `work` against `src` and writes their records into `out`."""

    def __init__(self, out: Path, src: Path, work: Path) -> None:
        self.out = out  # the snapshot folder
        self.src = src  # the source tree on PYTHONPATH
        self.work = work  # the temporary working folder every command runs in
        self.index: list[dict[str, Any]] = []  # what INDEX lists
        # sha256 of written files whose bytes vary from run to run (their text is recorded
        # normalised) -> a placeholder, for the records that cite them (an export's file list)
        self.varying: dict[str, str] = {}
        real = os.path.realpath(work)
        self.roots = [(p, "<WORK>") for p in dict.fromkeys([real, str(work)])]
        self.roots += [(str(src), "<SRC>"), (str(REPO), "<REPO>"), (sys.executable, "<PYTHON>")]
        self.env = self._environment()

    def _environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TAPERLM_", "WANDB_"))}
        env.update(
            PYTHONPATH=str(self.src),
            OMP_NUM_THREADS="1",  # one torch thread: bit-identical numbers run to run
            MKL_NUM_THREADS="1",
            CUDA_VISIBLE_DEVICES="",  # the CPU, whatever the machine has
            TAPERLM_EVAL_DATA="none",  # no ../shared/data: only the files made here
            TAPERLM_CACHE=str(self.work / "cache"),
            XDG_CACHE_HOME=str(self.work / "cache"),
            HF_HUB_OFFLINE="1",
            HF_DATASETS_OFFLINE="1",
            WANDB_MODE="disabled",
            TOKENIZERS_PARALLELISM="false",
            PYTHONHASHSEED="0",
            COLUMNS="80",  # argparse wraps --help at the terminal's width
            LC_ALL="C.UTF-8",
            TZ="UTC",
        )
        return env

    def run(
        self, name: str, argv: list[str], files: list[str] = (), hashes: bool = True
    ) -> subprocess.CompletedProcess:
        """Run `taperlm ARGV` and record it as item `name` with the files under the paths
        `files` (relative to the working folder), checkpoints' tensors included (`hashes`)."""
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-c", ENTRY, *argv],
            cwd=self.work,
            env=self.env,
            capture_output=True,
            text=True,
        )
        lines = [
            "$ taperlm " + normalise_text(shlex.join(argv), self.roots),
            f"exit code: {proc.returncode}",
            "--- stdout",
            normalise_output(proc.stdout, self.roots),
            "--- stderr",
            normalise_text(proc.stderr, self.roots),
        ]
        for rel in files:
            lines += self._files(rel, hashes)
        self._write(name, lines, proc.returncode, time.monotonic() - start)
        return proc

    def _files(self, rel: str, hashes: bool) -> list[str]:
        root = self.work / rel
        if not root.exists():
            return [f"--- files under {rel}: none (does not exist)"]
        paths = sorted(p for p in ([root] if root.is_file() else root.rglob("*")) if p.is_file())
        lines = [f"--- files under {rel}: {len(paths)}"]
        lines += [f"{p.relative_to(self.work)}" for p in paths]
        for p in paths:
            described, varies = describe_file(p, str(p.relative_to(self.work)), self.roots)
            lines += described
            if varies:
                digest = sha256_bytes(p.read_bytes())
                self.varying[digest] = f"<sha256 of {p.relative_to(self.work)}: it varies>"
        if hashes:
            for ckpt in sorted({p.parent for p in paths if p.name == ".metadata"}):
                lines += [f"== {ckpt.relative_to(self.work)}: tensors", *tensor_hashes(ckpt)]
        return lines

    def record(self, name: str, lines: list[str]) -> None:
        """An item that is not a command (e.g. the inputs this script wrote)."""
        self._write(name, lines, 0, 0.0)

    def _write(self, name: str, lines: list[str], rc: int, seconds: float) -> None:
        text = "\n".join(lines).rstrip("\n") + "\n"
        for digest, placeholder in self.varying.items():
            text = text.replace(digest, placeholder)
        write_output(self.out / f"{name}.txt", text)
        self.index.append({"item": name, "exit_code": rc})
        print(f"{name}: exit {rc}, {seconds:.1f} s", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# inputs made here (deterministic)

WORDS = (
    "river stone light small market quiet north table garden letter window winter summer old "
    "new green road house music paper silver morning evening bridge forest field teacher "
    "child city island harbour lamp clock story engine bread salt horse cloud storm tower "
    "village number answer question simple early late bright dark warm cold open close"
).split()


def corpus_rows(n_docs: int = 60, seed: int = 0) -> list[dict[str, str]]:
    """`n_docs` documents of seeded word salad in sentences and paragraphs."""
    rng = random.Random(seed)
    docs = []
    for d in range(n_docs):
        paragraphs = []
        for _ in range(rng.randint(1, 3)):
            sentences = [
                " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 12))).capitalize() + "."
                for _ in range(rng.randint(3, 8))
            ]
            paragraphs.append(" ".join(sentences))
        docs.append({"text": f"Document {d}.\n\n" + "\n\n".join(paragraphs)})
    return docs


def eval_files(root: Path) -> list[str]:
    """A few items of four zero-shot tasks in the local layout of ../shared/data (our own
    sentences): piqa, arc_easy, lambada_openai and wikitext. Returns the files written."""
    piqa = [
        {"goal": "Keep bread fresh", "sol1": "Close the bag.", "sol2": "Leave it in the rain."},
        {"goal": "Light a dark room", "sol1": "Open the window.", "sol2": "Close the door."},
        {"goal": "Cross the river", "sol1": "Walk on the bridge.", "sol2": "Read a letter."},
    ]
    arc = [
        {"query": "Question: What falls from a cloud?", "choices": ["rain", "stone", "bread", "salt"], "gold": 0},
        {"query": "Question: Which one is warm?", "choices": ["winter", "snow", "summer", "ice"], "gold": 2},
    ]  # fmt: skip
    lambada = [
        {"context": "The old horse walked along the quiet", "continuation": "road"},
        {"context": "In the morning the teacher opened the", "continuation": "window"},
    ]
    wiki = (
        " \n = River Stone = \n \n The river stone is small and quiet . It lies in the old "
        "market of the city . \n \n = = Story = = \n \n A child found the stone in 1900 . \n"
    )
    files = {
        "piqa/valid.jsonl": "".join(json.dumps(r) + "\n" for r in piqa),
        "piqa/valid-labels.lst": "0\n0\n0\n",
        "arc/arc_easy_test.jsonl": "".join(json.dumps(r) + "\n" for r in arc),
        "lambada/lambada_openai.jsonl": "".join(json.dumps(r) + "\n" for r in lambada),
        "wikitext-2/wiki.test.raw": wiki,
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return list(files)


# ---------------------------------------------------------------------------------------------
# the items


def help_items(s: Snapshot) -> None:
    """`taperlm --help`, `--version`, bare `taperlm`, and the --help of every subcommand found
    in the help text (recursively, for nested subcommands)."""
    s.run("cli-version", ["--version"])
    s.run("cli-bare", [])
    todo = [[]]
    while todo:
        path = todo.pop(0)
        name = "help-" + ("-".join(path) or "taperlm")
        proc = s.run(name, [*path, "--help"])
        todo += [[*path, sub] for sub in subcommands(proc.stdout)]


def subcommands(help_text: str) -> list[str]:
    """Subcommand names listed in an argparse help: the entries under a positional whose
    usage shows `COMMAND ...` or `{a,b} ...` (argparse's form for subparsers)."""
    usage = help_text.split("\n\n", 1)[0]
    match = re.search(r"(\{[\w,-]+\}|[A-Z_]+) \.\.\.", usage)
    if not match:
        return []
    token = match.group(1)
    if token.startswith("{"):
        return token.strip("{}").split(",")
    names, inside = [], False
    for line in help_text.splitlines():
        if line.strip() == token:
            inside = True
            continue
        if inside:
            m = re.match(r"^    (\w[\w-]*)(\s{2,}|$)", line)
            if m:
                names.append(m.group(1))
            elif not line.startswith("      ") or not line.strip():
                break
    return names


# `plan` items: (name, arguments after `taperlm plan`); only --block-configs and --plot write.
PLANS = [
    ("plan-list-presets", "--list-presets"),
    ("plan-transformer-micro-uniform", "--preset transformer-micro"),
    ("plan-transformer-440m-cosine", "--preset transformer-440m --taper cosine:1.5:0.5"),
    ("plan-transformer-440m-cosine-json", "--preset transformer-440m --taper cosine:1.5:0.5 --json"),
    ("plan-transformer-760m-groups", "--preset transformer-760m --taper groups:1.5,1.0,0.5"),
    ("plan-gated-small-linear", "--preset gated-small --taper linear:1.4:0.6"),
    ("plan-gated-small-linear-json", "--preset gated-small --taper linear:1.4:0.6 --json"),
    ("plan-hope-tiny-cosine", "--preset hope-tiny --taper cosine:1.5:0.5"),
    ("plan-hope-nano-periods-dump",
     "--preset hope-nano --set model.hope.update_periods=[1,2,4] --dump-config"),
    ("plan-titans-mag-micro-cosine-json", "--preset titans-mag-micro --taper cosine:1.5:0.5 --json"),
    ("plan-titans-mac-tiny-sigmoid", "--preset titans-mac-tiny --taper sigmoid:1.5:0.5:8"),
    ("plan-titans-mal-small-custom",
     "--preset titans-mal-small --taper custom:768,640,640,576,512,512,512,512,448,384,384,256"),
    ("plan-transformer-440m-head-taper",
     "--preset transformer-440m --taper cosine:1.5:0.5 --head-taper linear:1.5:0.5"),
    ("plan-transformer-micro-kv-taper", "--preset transformer-micro --kv-taper cosine:1.0:0.25"),
    ("plan-transformer-1.3b-gpus-fsdp",
     "--preset transformer-1.3b --taper cosine:1.5:0.5 --gpus 8 --parallel fsdp "
     "--activation-checkpointing --micro-batch 4"),
    ("plan-transformer-nano-set-dump",
     "--preset transformer-nano --set model.n_layers=6 --set train.lr=1e-3 --multiple-of 8 "
     "--dump-config"),
    ("plan-transformer-440m-block-configs",
     "--preset transformer-440m --taper cosine:1.5:0.5 --multiple-of 256 "
     "--block-configs plan/blocks.json"),
    ("plan-transformer-tiny-plot",
     "--preset transformer-tiny --taper cosine:1.5:0.5 --plot plan/widths.png"),
    ("plan-error-bad-taper", "--preset transformer-tiny --taper cosine:1.5"),
    ("plan-error-unknown-key", "--preset hope-nano --set model.update_periods=[1,2]"),
    ("plan-error-unknown-preset", "--preset transformer-9b"),
]  # fmt: skip


def plan_items(s: Snapshot) -> None:
    for name, args in PLANS:
        argv = ["plan", *shlex.split(args)]
        s.run(name, argv, files=[a for a in argv if a.startswith("plan/")])


def prepare_items(s: Snapshot) -> None:
    """`prepare` of a seeded JSONL corpus, and of a plain-text one with the first's tokenizer."""
    rows = corpus_rows()
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (s.work / "corpus.jsonl").write_text(text, encoding="utf-8")
    s.record(
        "input-corpus", [f"corpus.jsonl: {len(rows)} docs, sha256 {sha256_bytes(text.encode())}"]
    )
    plain = "\n\n".join(r["text"] for r in rows[:20]) + "\n"
    (s.work / "corpus.txt").write_text(plain, encoding="utf-8")
    s.record("input-corpus-txt", [f"corpus.txt: sha256 {sha256_bytes(plain.encode())}"])
    common = "--workers 1 --no-progress"
    s.run(
        "prepare",
        shlex.split(
            f"prepare --source corpus.jsonl --tokenizer bpe:512 --out data --val-fraction 0.1 {common}"
        ),
        files=["data"],
    )
    s.run("prepare-txt-reuse-tokenizer", shlex.split(
        "prepare --source corpus.txt --tokenizer data --out data-txt --val-tokens 300 "
        f"--max-doc-chars 2000 {common}"
    ), files=["data-txt"])  # fmt: skip


# `train` items: (run name, preset, more arguments), each with TINY; "resumed" is stopped after 3
# steps (item train-resumed-part1), then the same command again resumes it to step 8: the same
# numbers as train-cosine, a resume being exact.
TRAINS = [
    ("uniform", "transformer-tiny", ""),
    ("cosine", "transformer-tiny", "--taper cosine:1.5:0.5"),
    ("resumed", "transformer-tiny", "--taper cosine:1.5:0.5"),
    ("accum4", "transformer-tiny", "--taper linear:1.25:0.75 --set train.micro_batch_size=2"),
    ("wsd", "transformer-tiny",
     "--taper groups:1.5,0.5 --set train.schedule=wsd --set train.decay_fraction=0.25"),
    ("hope", "hope-tiny", "--taper cosine:1.5:0.5 --set model.hope.update_periods=[1,2,4]"),
    ("titans-mag", "titans-mag-tiny", "--taper cosine:1.5:0.5"),
    ("gated-heads", "gated-tiny", "--set model.n_heads=4 --head-taper linear:1.5:0.5"),
    ("kv-taper", "transformer-tiny", "--set model.n_heads=4 --kv-taper groups:1.0,0.5"),
]  # fmt: skip


def train_items(s: Snapshot) -> None:
    for name, preset, extra in TRAINS:
        argv = ["train", "--preset", preset, "--data", "data", "--out", f"runs/{name}"]
        argv += ["--no-progress", *[a for kv in TINY for a in ("--set", kv)], *shlex.split(extra)]
        if name == "resumed":
            part = [*argv, "--stop-after-steps", "3"]
            s.run(f"train-{name}-part1", part, files=[f"runs/{name}"])
        s.run(f"train-{name}", argv, files=[f"runs/{name}"])


# Commands on the trained runs: (name, arguments, paths whose files are recorded). The eval
# tasks read the files `eval_files` writes; novelty and generate --out need an existing parent
# folder (eval --out makes its own), made before these run.
USES = [
    ("eval-val-json", "eval runs/cosine --tasks val --json", []),
    ("eval-tasks",
     "eval runs/cosine --tasks val,piqa,arc_easy,lambada_openai,wikitext --data-dir evaldata "
     "--limit 16 --step 4 --samples --out eval/cosine.json", ["eval"]),
    ("eval-hope", "eval runs/hope --tasks val,piqa --data-dir evaldata --json", []),
    ("novelty", "novelty runs/cosine --data corpus.txt --tokens 256 --json "
     "--out novelty/cosine.json", ["novelty"]),
    ("novelty-table", "novelty runs/titans-mag --data corpus.txt --tokens 128", []),
    ("allocate", "allocate --from novelty/cosine.json --preset transformer-tiny "
     + " ".join(f"--set {kv}" for kv in TINY) + " --json --out allocate/run.yaml", ["allocate"]),
    ("generate-sampled", "generate runs/cosine --prompt 'The river' --max-new-tokens 24 --seed 3 "
     "--temperature 0.9 --top-k 20", []),
    ("generate-greedy-nocache", "generate runs/hope --max-new-tokens 16 --temperature 0 "
     "--no-cache --out generate/hope.txt", ["generate"]),
    ("generate-titans", "generate runs/titans-mag --prompt Old --max-new-tokens 16 --seed 1 "
     "--top-p 0.9", []),
    ("export-hf", "export runs/cosine --out export/hf", ["export/hf"]),
    ("export-gguf", "export runs/uniform --format gguf --out export/uniform.gguf",
     ["export/uniform.gguf"]),
    ("export-llama", "export runs/uniform --format llama --out export/llama", ["export/llama"]),
    ("eval-export", "eval export/hf --tasks piqa,wikitext --data-dir evaldata --json", []),
    ("prune", "prune runs/uniform --out runs/pruned --params 0.8 --taper cosine:1.5:0.5 "
     "--data data --calibration-tokens 256 --json", ["runs/pruned"]),
]  # fmt: skip


def model_items(s: Snapshot) -> None:
    """eval, novelty, allocate, generate, export and prune on the trained runs."""
    files = eval_files(s.work / "evaldata")
    digests = [sha256_bytes((s.work / "evaldata" / f).read_bytes()) for f in files]
    s.record("input-eval-files", [f"evaldata/{f}: sha256 {d}" for f, d in zip(files, digests)])
    for folder in ("novelty", "generate"):
        (s.work / folder).mkdir()
    for name, args, paths in USES:
        s.run(name, shlex.split(args), files=paths)


def compare_items(s: Snapshot) -> None:
    argv = [
        "compare", "--preset", "transformer-nano", "--tapers", "uniform;cosine:1.5:0.5",
        "--seeds", "2", "--stop", "fixed", "--min-seeds", "2", "--tokens", "2048", "--data", "data",
        "--val-tokens", "512", "--novelty-tokens", "256", "--jobs", "1", "--threads", "1",
        "--out", "cmp", "--no-progress",
        "--set", "train.batch_tokens=256", "--set", "train.micro_batch_size=4",
        "--set", "train.seq_len=32", "--set", "model.context_length=64",
        "--set", "train.warmup_tokens=512",
    ]  # fmt: skip
    s.run("compare", argv, files=["cmp"])
    s.run("compare-again-cached", argv, files=["cmp/report.json"], hashes=False)


ITEMS: list[Callable[[Snapshot], None]] = [
    help_items,
    plan_items,
    prepare_items,
    train_items,
    model_items,
    compare_items,
]


def snapshot(out: Path, src: Path) -> int:
    claim_folder(out)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="taperlm-snapshot-") as tmp:
        s = Snapshot(out, src, Path(tmp))
        for items in ITEMS:
            items(s)
    index = {"src": "<SRC>", "items": s.index}
    write_output(out / INDEX, json.dumps(index, indent=1) + "\n")
    print(
        f"wrote {len(s.index)} items to {out} in {time.monotonic() - start:.0f} s", file=sys.stderr
    )
    return 0


# ---------------------------------------------------------------------------------------------
# comparing two snapshots


def compare(a: Path, b: Path, context: int = 3, max_lines: int = 40) -> int:
    """Print the items that differ between snapshots `a` and `b` (a short diff of each);
    exit code 1 if any does."""
    names_a = {p.name for p in a.iterdir() if p.name != FOLDER_MARKER}
    names_b = {p.name for p in b.iterdir() if p.name != FOLDER_MARKER}
    differ = 0
    for name in sorted(names_a | names_b):
        if name not in names_b or name not in names_a:
            print(f"{name}: only in {a if name in names_a else b}")
            differ += 1
            continue
        ta = (a / name).read_text(encoding="utf-8").splitlines()
        tb = (b / name).read_text(encoding="utf-8").splitlines()
        if ta != tb:
            differ += 1
            diff = list(
                difflib.unified_diff(ta, tb, str(a / name), str(b / name), lineterm="", n=context)
            )
            print(f"{name}: differs")
            for line in diff[:max_lines]:
                print(f"  {line[:200]}")
            if len(diff) > max_lines:
                print(
                    f"  ... {len(diff) - max_lines} more diff lines (diff -u {a / name} {b / name})"
                )
    total = len(names_a | names_b)
    print(f"{differ} of {total} items differ" if differ else f"identical: {total} items")
    return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument(
        "--out",
        type=Path,
        help="write a snapshot into this new or empty folder (or one a snapshot wrote)",
    )
    mode.add_argument(
        "--compare",
        nargs=2,
        type=Path,
        metavar=("DIR_A", "DIR_B"),
        help="the items that differ between two snapshots (exit 1 if any)",
    )
    p.add_argument(
        "--src",
        type=Path,
        default=REPO / "src",
        help="source tree to snapshot (PYTHONPATH) [this checkout's src]",
    )
    a = p.parse_args(argv)  # fmt: skip
    if a.compare:
        return compare(*a.compare)
    problem = folder_problem(a.out)
    if problem:
        p.error(problem)
    src = a.src.resolve()
    if not (src / "taperlm" / "cli.py").is_file():
        p.error(f"--src {a.src}: no taperlm/cli.py there")
    return snapshot(a.out, src)


if __name__ == "__main__":
    sys.exit(main())
