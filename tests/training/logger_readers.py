"""Read back what the loggers wrote: TensorBoard event files with TensorBoard's own reader
(EventAccumulator, which applies purge_step as the TensorBoard UI does) and W&B offline run files
(`run-ID.wandb`: a W&B header, then LevelDB log-format records, each a protobuf `Record` of
wandb's own schema)."""

from __future__ import annotations

import json
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def tb_scalars(logdir: Path) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} of every scalar TensorBoard shows for `logdir` (each step once)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    out: dict[str, dict[int, float]] = {}
    for tag in acc.Tags()["scalars"]:
        events = acc.Scalars(tag)
        steps = [e.step for e in events]
        assert len(steps) == len(set(steps)), f"{tag}: a step shown twice: {steps}"
        out[tag] = {e.step: e.value for e in events}
    return out


def tb_texts(logdir: Path) -> dict[str, str]:
    """{tag: text} of the text summaries (the newest of each tag)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    acc.Reload()
    texts = {}
    for tag in acc.Tags()["tensors"]:
        event = acc.Tensors(tag)[-1]
        texts[tag] = event.tensor_proto.string_val[0].decode()
    return texts


# W&B's transaction log: a 7-byte header (":W&B", magic 0xBEE1, version 0), then the LevelDB
# log format: 32 KiB blocks of records, each with a 7-byte header (crc32c: 4, length: 2,
# type: 1 = full, 2 = first, 3 = middle, 4 = last fragment); a block's tail shorter than a
# header is padding.
_BLOCK, _HEADER = 32768, 7


def _wandb_payloads(path: Path):
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, parts = _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        if kind == 0:  # zero padding at a block's end
            pos += left
            continue
        chunk = data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            parts = chunk
        elif kind == 3:
            parts += chunk
        elif kind == 4:
            yield parts + chunk
            parts = b""


@dataclass
class WandbRun:
    """One offline W&B run file: its run record and history rows."""

    path: Path
    run_id: str = ""
    name: str = ""
    group: str = ""
    project: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)  # each with its "_step"


def wandb_runs(wandb_dir: Path, wait: float = 30.0) -> list[WandbRun]:
    """Every offline run under `wandb_dir` (a WANDB_DIR's wandb/ folder), oldest first. wandb's
    service process finishes writing a run file a moment after `finish()` returns: each file is
    read again until it holds the run's exit record (or `wait` seconds passed)."""
    runs = []
    for path in sorted(wandb_dir.glob("offline-run-*/run-*.wandb")):
        deadline = time.monotonic() + wait
        run = _read_run(path)
        while run is None and time.monotonic() < deadline:
            time.sleep(0.1)
            run = _read_run(path)
        assert run is not None, f"{path} has no exit record after {wait} s"
        runs.append(run)
    return runs


def _read_run(path: Path) -> WandbRun | None:
    """The run in one file, None while its exit record is not written yet."""
    from wandb.proto import wandb_internal_pb2 as pb

    run, finished = WandbRun(path), False
    for payload in _wandb_payloads(path):
        rec = pb.Record()
        rec.ParseFromString(payload)
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            r = rec.run
            run.run_id, run.name, run.group = r.run_id, r.display_name, r.run_group
            run.project = r.project
            run.config = {u.key: json.loads(u.value_json) for u in r.config.update}
        elif kind == "history":
            run.rows.append(
                {
                    i.key or "/".join(i.nested_key): json.loads(i.value_json)
                    for i in rec.history.item
                }
            )
        elif kind == "exit":
            finished = True
    return run if finished else None
