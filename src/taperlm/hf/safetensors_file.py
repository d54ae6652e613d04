"""Read a safetensors file that a stranger wrote, bounded: the header's length and JSON are
checked before anything else is read, every tensor's byte range must lie inside the file and
match its dtype and shape, and each tensor is read with one bounded read through
`taperlm.io.open_regular` (a FIFO or device is refused without blocking). No code runs: the
format is a JSON header and raw little-endian numbers.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import torch

from taperlm.errors import CheckpointError
from taperlm.io import open_regular, strict_json_loads

# A header lists names, dtypes, shapes and offsets: a few hundred bytes per tensor. 100 MiB is far
# beyond any real model's (Llama 3 405B: ~1 MiB) and keeps a crafted length from being allocated.
MAX_HEADER_BYTES = 100 << 20
DTYPES: dict[str, tuple[torch.dtype, int]] = {
    "F32": (torch.float32, 4),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
}


def read_header(path: str | Path) -> tuple[dict[str, dict[str, Any]], int]:
    """(tensor name -> {dtype, shape, start, end}, data offset) of the safetensors file `path`;
    CheckpointError for a damaged or crafted header, or a dtype taperlm does not load."""
    path = Path(path)
    with open_regular(path, what="safetensors file") as f:
        size = f.seek(0, 2)
        f.seek(0)
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path} is not a safetensors file: it has {size} bytes")
        (length,) = struct.unpack("<Q", head)
        if length > min(MAX_HEADER_BYTES, size - 8):
            raise CheckpointError(
                f"{path} is not a safetensors file, or it is damaged: its header claims {length} "
                f"bytes (the file has {size})"
            )
        raw = f.read(length)
    try:
        header = strict_json_loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: its safetensors header is not valid JSON ({err})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: its safetensors header is not a JSON object")
    data_start, data_size = 8 + length, size - 8 - length
    out: dict[str, dict[str, Any]] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        out[name] = _entry(path, name, entry, data_size)
    return out, data_start


def _entry(path: Path, name: str, entry: Any, data_size: int) -> dict[str, Any]:
    """One header entry checked: a known dtype, a shape of non-negative ints, and a byte range
    inside the data section whose length is the shape's."""
    bad = f"{path}: the safetensors entry {name!r}"
    if not isinstance(entry, dict):
        raise CheckpointError(f"{bad} is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPES:
        raise CheckpointError(
            f"{bad} has dtype {dtype!r}; taperlm imports {', '.join(DTYPES)} weights only (a "
            "quantized checkpoint cannot be imported: use its unquantized original)"
        )
    ok_shape = isinstance(shape, list) and all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
    )
    ok_offsets = (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(n, int) and not isinstance(n, bool) for n in offsets)
    )
    if not ok_shape or not ok_offsets:
        raise CheckpointError(f"{bad} has no valid shape and data_offsets")
    start, end = offsets
    nbytes = math.prod(shape) * DTYPES[dtype][1]
    if not 0 <= start <= end <= data_size or end - start != nbytes:
        raise CheckpointError(
            f"{bad} claims bytes {start}..{end} for {nbytes} bytes of {dtype} {shape}, outside "
            f"the file's {data_size} data bytes or of the wrong length: the file is damaged"
        )
    return {"dtype": dtype, "shape": tuple(shape), "start": start, "end": end}


def read_tensors(path: str | Path, names: list[str] | None = None) -> dict[str, torch.Tensor]:
    """Tensors of the safetensors file `path` (all, or `names`), as float32 on CPU."""
    header, data_start = read_header(path)
    wanted = list(header) if names is None else names
    out: dict[str, torch.Tensor] = {}
    with open_regular(path, what="safetensors file") as f:
        for name in wanted:
            e = header[name]
            f.seek(data_start + e["start"])
            buf = bytearray(f.read(e["end"] - e["start"]))
            if len(buf) != e["end"] - e["start"]:
                raise CheckpointError(f"{path} was truncated while {name!r} was read")
            dtype = DTYPES[e["dtype"]][0]
            t = torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype)
            out[name] = t.reshape(e["shape"]).float()
    bad = [name for name, t in out.items() if t.numel() and not bool(t.isfinite().all())]
    if bad:  # finite or refused: no run starts from these (as `checkpoint.store.require_finite`)
        raise CheckpointError(
            f"{path}: {len(bad)} tensor(s) hold NaN or inf ({', '.join(bad[:4])}); a run never "
            "starts from non-finite weights, so nothing was written. Re-download or re-export "
            "the checkpoint (the file is damaged, or the model diverged before it was saved)"
        )
    return out
