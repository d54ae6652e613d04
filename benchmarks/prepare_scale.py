"""`taperlm prepare` at growing input sizes: peak memory (RSS), peak disk and throughput.

The input is generated: paragraphs drawn (seeded) from the default corpus when its Debian
packages are installed, else from tiny-shakespeare in ../shared/data, joined into documents of
1-12 paragraphs. `memory` prepares one generated file per size and samples, every 0.1 s, the RSS
of the prepare process and of each worker process (psutil) and the bytes under the output
folder; `throughput` times the tokenization stage for each worker count with a fixed tokenizer
(so tokenizer training is not in the time) and estimates the time for 120 GB of text; `reader`
measures the CPU time of what the single reading process does per byte (read, parse, hash,
pickle), the ceiling of many workers.

    python benchmarks/prepare_scale.py memory --sizes 50MB,500MB,2GB --kind txt --workers 2 \
        --prepare-args "--tokenizer-sample-chars 50e6"
    python benchmarks/prepare_scale.py throughput --size 100MB --workers 1,2
    python benchmarks/prepare_scale.py reader --size 100MB   # the reading process's own cost
    python benchmarks/prepare_scale.py --smoke          # seconds; what the tests run

Results go to benchmarks/results/prepare_*.json and are printed as Markdown tables.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
SHAKESPEARE = HERE.parent.parent / "shared" / "data" / "corpora" / "tinyshakespeare" / "input.txt"
TARGET_BYTES = 120e9  # about 30B tokens of web text, the paper's 440M run


def parse_size(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(B|KB|MB|GB)?", text.strip().upper())
    if not m:
        raise argparse.ArgumentTypeError(f"size like 50MB or 2GB, got {text!r}")
    return int(float(m.group(1)) * {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9}[m.group(2) or "B"])


def paragraphs(small: bool = False) -> tuple[list[str], str]:
    """Real paragraphs to draw from, and where they come from. The default corpus is preferred
    (its Debian packages must be installed); `small` (the smoke run) takes tiny-shakespeare,
    which loads in milliseconds."""
    from taperlm.data import corpus

    if not small:
        try:
            docs = corpus.cap_chars(corpus.iter_default_corpus(), 30_000_000)
            paras = [p for d in docs for p in d.text.split("\n\n") if len(p) > 40]
            return paras, "default corpus (Debian documentation) paragraphs"
        except corpus.DataError:
            pass
    if SHAKESPEARE.is_file():
        text = SHAKESPEARE.read_text(encoding="utf-8")
        return [p for p in text.split("\n\n") if p.strip()], "tiny-shakespeare paragraphs"
    words = "the a model layer width taper budget token train data shard loss".split()
    rng = np.random.default_rng(0)
    paras = [" ".join(rng.choice(words, size=60)) + "." for _ in range(500)]
    return paras, "random words (no corpus available)"


def make_input(path: Path, size: int, kind: str, paras: list[str], seed: int = 0) -> int:
    """Write about `size` bytes of text (documents of 1-12 random paragraphs) as `kind`: a .txt
    file, JSONL (plain, gzip or zstd), or Parquet (a row group per 4,096 documents, zstd)."""
    rng = np.random.default_rng(seed)
    written = 0
    if kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = pa.schema([("text", pa.string())])
        with pq.ParquetWriter(path, schema, compression="zstd") as writer:
            while written < size:
                texts = list(_documents(rng, paras, 4096))
                writer.write_table(pa.table({"text": texts}, schema=schema))
                written += sum(len(t.encode()) for t in texts)
        return path.stat().st_size
    if kind == "jsonl.zst":
        import zstandard

        f = zstandard.ZstdCompressor().stream_writer(open(path, "wb"))  # noqa: SIM115
    else:
        f = (gzip.open if kind == "jsonl.gz" else open)(path, "wb")
    with f:
        while written < size:
            for text in _documents(rng, paras, 4096):
                if kind == "txt":
                    data = (text + "\n\n").encode()
                else:
                    data = (json.dumps({"text": text}, ensure_ascii=False) + "\n").encode()
                f.write(data)
                written += len(data)
                if written >= size:
                    break
    return path.stat().st_size


def _documents(rng, paras: list[str], n: int):
    picks = rng.integers(0, len(paras), size=(n, 12))
    counts = rng.integers(1, 13, size=n)
    for row, k in zip(picks, counts):
        yield "\n\n".join(paras[i] for i in row[:k])


def _tree_rss(proc) -> tuple[int, int, int]:
    """(sum of RSS over the process and its descendants, its own RSS, largest child RSS)."""
    import psutil

    try:
        own = proc.memory_info().rss
        kids = []
        for c in proc.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                kids.append(c.memory_info().rss)
    except psutil.Error:
        return 0, 0, 0
    return own + sum(kids), own, max(kids, default=0)


def _dir_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, name)).st_size
    return total


def run_prepare(argv: list[str], out: Path) -> dict[str, Any]:
    """Run `taperlm prepare` in a fresh process, sampling memory and disk every 0.1 s."""
    import psutil

    cmd = [sys.executable, "-m", "taperlm.cli", "prepare", *argv, "--out", str(out)]
    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc = psutil.Process(child.pid)
    peak = {"total": 0, "main": 0, "worker": 0, "disk": 0}
    main_cpu = 0.0
    while child.poll() is None:
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            main_cpu = times.user + times.system
        total, own, worker = _tree_rss(proc)
        peak["total"] = max(peak["total"], total)
        peak["main"] = max(peak["main"], own)
        peak["worker"] = max(peak["worker"], worker)
        if out.exists():
            peak["disk"] = max(peak["disk"], _dir_bytes(out))
        time.sleep(0.1)
    stdout, stderr = child.communicate()
    wall = time.perf_counter() - t0
    if child.returncode != 0:
        raise RuntimeError(f"prepare failed ({child.returncode}): {stderr[-2000:]}")
    meta = json.loads((out / "meta.json").read_text())
    stages = dict(re.findall(r"(\w+) ([\d.]+)[,)]", stdout.split(" s (", 1)[1]))
    return {
        "wall_s": wall,
        "stages_s": {k: float(v) for k, v in stages.items()},
        "main_cpu_s": main_cpu,  # the prepare process itself (last sample before it exited)
        "peak_rss_total_mb": peak["total"] / 1e6,
        "peak_rss_main_mb": peak["main"] / 1e6,
        "peak_rss_worker_mb": peak["worker"] / 1e6,
        "peak_disk_mb": peak["disk"] / 1e6,
        "output_mb": _dir_bytes(out) / 1e6,
        "tokens": meta["splits"]["train"]["tokens"] + meta["splits"]["val"]["tokens"],
        "documents": meta["source"]["documents"],
        "chars": meta["source"]["chars"],
        "summary": stdout.strip(),
    }


def memory(args, work: Path, paras, source: str) -> dict[str, Any]:
    rows = []
    for size in args.sizes:
        path = work / f"input-{size}.{args.kind}"
        nbytes = make_input(path, size, args.kind, paras)
        out = work / f"out-{size}"
        argv = [
            "--source",
            str(path),
            "--tokenizer",
            args.tokenizer,
            "--workers",
            str(args.workers),
        ]
        argv += ["--no-progress", *args.extra]
        res = run_prepare(argv, out)
        rows.append({"input_bytes": nbytes, **res})
        print(f"{nbytes / 1e6:,.0f} MB: {json.dumps({k: v for k, v in res.items() if k != 'summary'})}", flush=True)  # fmt: skip
        path.unlink()
        subprocess.run(["rm", "-rf", str(out)], check=True)
    return {"kind": args.kind, "tokenizer": args.tokenizer, "workers": args.workers,
            "prepare_args": args.extra, "source_text": source, "rows": rows}  # fmt: skip


def throughput(args, work: Path, paras, source: str) -> dict[str, Any]:
    path = work / f"input.{args.kind}"
    nbytes = make_input(path, args.size, args.kind, paras)
    tok_dir = work / "tok"
    run_prepare(["--source", str(path), "--tokenizer", args.tokenizer, "--workers", "1",
                 "--max-chars", "20000000", "--no-progress"], tok_dir)  # fmt: skip
    rows = []
    for workers in args.workers_list:
        out = work / f"out-w{workers}"
        res = run_prepare(["--source", str(path), "--tokenizer", str(tok_dir), "--workers",
                           str(workers), "--no-progress"], out)  # fmt: skip
        t = res["stages_s"]["tokenize"]
        rows.append({"workers": workers, "tokenize_s": t, "mb_per_s": nbytes / 1e6 / t,
                     "main_mb_per_cpu_s": nbytes / 1e6 / max(res["main_cpu_s"], 1e-9),
                     "tokens_per_s": res["tokens"] / t, **res})  # fmt: skip
        print(f"workers {workers}: {rows[-1]['mb_per_s']:.2f} MB/s, {rows[-1]['tokens_per_s']:,.0f} tokens/s; the prepare process used 1 CPU second per {rows[-1]['main_mb_per_cpu_s']:.1f} MB", flush=True)  # fmt: skip
        subprocess.run(["rm", "-rf", str(out)], check=True)
    one = rows[0]["mb_per_s"] if rows[0]["workers"] == 1 else None
    for r in rows:
        r["speedup"] = r["mb_per_s"] / one if one else None
        r["hours_for_120GB"] = TARGET_BYTES / 1e6 / r["mb_per_s"] / 3600
    return {"kind": args.kind, "input_bytes": nbytes, "tokenizer": args.tokenizer,
            "source_text": source, "rows": rows}  # fmt: skip


def reader(args, work: Path, paras, source: str) -> dict[str, Any]:
    """What the one reading process does per byte besides writing shards: read and parse the
    source, draw each document's validation hash, pickle batches for the workers (CPU time)."""
    import pickle

    from taperlm.data.corpus import open_source
    from taperlm.data.prepare import doc_hash

    rows = []
    for kind in ("txt", "jsonl", "jsonl.gz", "jsonl.zst", "parquet"):
        path = work / f"reader.{kind}"
        nbytes = make_input(path, args.size, kind, paras)
        t0 = time.process_time()
        batch, size, chars = [], 0, 0
        for doc, _ in open_source(str(path)).read():
            doc_hash(doc.text, 0)
            batch.append(doc.text)
            size += len(doc.text)
            if size >= 1 << 20:
                pickle.dumps(batch)
                chars += size
                batch, size = [], 0
        chars += size
        cpu = time.process_time() - t0
        rows.append({"kind": kind, "file_bytes": nbytes, "chars": chars, "cpu_s": cpu,
                     "mb_per_cpu_s": chars / 1e6 / cpu})  # fmt: skip
        print(f"{kind}: {chars / 1e6 / cpu:.1f} M characters of text per CPU second", flush=True)
        path.unlink()
    return {"source_text": source, "text_bytes": args.size, "rows": rows}


def markdown(result: dict[str, Any], mode: str) -> str:
    if mode == "memory":
        lines = ["| input | tokens | wall | peak RSS: all processes | main | one worker | peak disk / output |",
                 "|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for r in result["rows"]:
            lines.append(
                f"| {r['input_bytes'] / 1e6:,.0f} MB | {r['tokens']:,} | {r['wall_s']:.0f} s | "
                f"{r['peak_rss_total_mb']:,.0f} MB | {r['peak_rss_main_mb']:,.0f} MB | "
                f"{r['peak_rss_worker_mb']:,.0f} MB | {r['peak_disk_mb']:,.0f} / {r['output_mb']:,.0f} MB |"
            )
        return "\n".join(lines)
    if mode == "reader":
        lines = ["| kind | M characters of text per CPU second |", "|---|---:|"]
        lines += [f"| {r['kind']} | {r['mb_per_cpu_s']:.1f} |" for r in result["rows"]]
        return "\n".join(lines)
    lines = [
        "| workers | MB/s | tokens/s | speed-up | 120 GB would take |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        speed = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
        lines.append(f"| {r['workers']} | {r['mb_per_s']:.2f} | {r['tokens_per_s']:,.0f} | {speed} | "
                     f"{r['hours_for_120GB']:,.1f} h |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", nargs="?", choices=["memory", "throughput", "reader"], default="memory")
    p.add_argument("--sizes", default="50MB,500MB,2GB")
    p.add_argument("--size", type=parse_size, default=parse_size("100MB"))
    p.add_argument(
        "--kind", choices=["txt", "jsonl", "jsonl.gz", "jsonl.zst", "parquet"], default="txt"
    )
    p.add_argument("--workers", default="2", help="memory: one count; throughput: a list")
    p.add_argument("--tokenizer", default="bpe:8192")
    p.add_argument("--work", type=Path, default=None, help="folder for inputs and outputs")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, both modes, no results file")
    p.add_argument(
        "--prepare-args", default="", help='more prepare arguments, e.g. "--shard-tokens 1e6"'
    )
    args = p.parse_args(argv)
    args.extra = shlex.split(args.prepare_args)
    args.sizes = [parse_size(s) for s in args.sizes.split(",")]
    args.workers_list = [int(w) for w in str(args.workers).split(",")]
    args.workers = args.workers_list[0]
    if args.smoke:
        args.sizes, args.size, args.workers_list = [300_000], 300_000, [1]
        args.tokenizer, args.extra = "bpe:300", ["--tokenizer-sample-chars", "100000"]
    paras, source = paragraphs(small=args.smoke)
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        modes = ["memory", "throughput", "reader"] if args.smoke else [args.mode]
        for mode in modes:
            run = {"memory": memory, "throughput": throughput, "reader": reader}[mode]
            result = run(args, Path(tmp), paras, source)
            print(markdown(result, mode))
            if not args.smoke:
                RESULTS.mkdir(exist_ok=True)
                name = (
                    f"prepare_{mode}.json"
                    if mode == "reader"
                    else f"prepare_{mode}_{args.kind}.json"
                )
                (RESULTS / name).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
