"""Read a safetensors file that a stranger wrote, bounded: the header's length and JSON are
checked before anything else is read, every tensor's byte range must lie inside the file and
match its dtype and shape, and each tensor is read with one bounded read through
`taperlm.files.io.open_regular` (a FIFO or device is refused without blocking). No code runs: the
format is a JSON header and raw little-endian numbers.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Any

import torch

from taperlm.errors import CheckpointError
from taperlm.files.io import open_regular, quoted, strict_json_loads

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
            # The length is the file's first 8 bytes read as a number: quoted only when the
            # file looks like a safetensors file (its JSON header starts right after it).
            if f.read(1) != b"{":
                raise CheckpointError(
                    f"{path} is not a safetensors file: it does not start with a header length "
                    "and a JSON header"
                )
            raise CheckpointError(
                f"{path} is not a safetensors file, or it is damaged: its header claims {length} "
                f"bytes (the file has {size})"
            )
        raw = f.read(length)
    try:
        header = strict_json_loads(raw.decode("utf-8"), "header")
    except (UnicodeDecodeError, ValueError) as err:  # MalformedFileError is a ValueError
        raise CheckpointError(f"{path}: its safetensors header is not valid JSON ({err})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: its safetensors header is not a JSON object")
    data_start, data_size = 8 + length, size - 8 - length
    out: dict[str, dict[str, Any]] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        out[name] = _entry(path, name, entry, data_size)
    _check_layout(path, out, data_size)
    return out, data_start


def _check_layout(path: Path, entries: dict[str, dict[str, Any]], data_size: int) -> None:
    """The rule of the reference reader (the safetensors library): the tensors' byte ranges,
    in order, tile the data section exactly -- no two overlap (two tensors sharing bytes would
    alias: a write to one changes the other), no gap, nothing after the last."""
    end, after = 0, None
    for name, e in sorted(entries.items(), key=lambda item: (item[1]["start"], item[1]["end"])):
        if e["start"] != end:
            what = "overlaps the tensor before it" if e["start"] < end else "leaves a gap before it"
            raise CheckpointError(
                f"{path}: the safetensors entry {quoted(name, 100)} (bytes {e['start']}..{e['end']})"
                f" {what}{'' if after is None else f' ({quoted(after, 100)}, ending at {end})'}; "
                "tensors must tile the data section, as the safetensors library requires: the "
                "file is damaged or crafted"
            )
        end, after = e["end"], name
    if end != data_size:
        raise CheckpointError(
            f"{path}: its tensors end at byte {end} of its {data_size} data bytes; the rest "
            "belongs to no tensor, which the safetensors library refuses: the file is damaged or "
            "crafted"
        )


# safetensors dtypes taperlm does not load, by why (the names of the format's spec).
_QUANTIZED = ("I8", "U8", "I4", "U4", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4")
_OTHER = ("BOOL", "I16", "U16", "I32", "U32", "I64", "U64", "C64")


def _dtype_advice(dtype: Any) -> str:
    """What a dtype taperlm does not load is, and what to do (a float64 checkpoint is not told
    it is quantized)."""
    ours = ", ".join(DTYPES)
    if dtype == "F64":
        return (
            f" (float64); taperlm imports {ours} weights: save the checkpoint in float32 "
            "(e.g. model.float().save_pretrained(...)) and import that"
        )
    if dtype in _QUANTIZED:
        return (
            f", a quantized or 8-bit-or-narrower format; taperlm imports {ours} weights: import "
            "the unquantized original"
        )
    if dtype in _OTHER:
        return f", not a floating-point weight; taperlm imports {ours} weights"
    return f", not a safetensors dtype; taperlm imports {ours} weights"


def _entry(path: Path, name: str, entry: Any, data_size: int) -> dict[str, Any]:
    """One header entry checked: a known dtype, a shape of non-negative ints, and a byte range
    inside the data section whose length is the shape's."""
    bad = f"{path}: the safetensors entry {name!r}"
    if not isinstance(entry, dict):
        raise CheckpointError(f"{bad} is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPES:
        raise CheckpointError(f"{bad} has dtype {quoted(dtype, 40)}{_dtype_advice(dtype)}")
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
