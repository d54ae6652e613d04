"""Models and text for analysis commands: load a model (our run dir, a Hugging Face model dir, or
`hf:NAME`) with the tokenizer it was trained with, and cut the first N tokens of a text."""

from __future__ import annotations

import codecs
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from taperlm.checkpoint.loading import check_tokenizer, load_run, resolve_data_dir, run_root
from taperlm.data.identity import check_run_data
from taperlm.data.loader import open_split
from taperlm.errors import ConfigError, DataError, UnsafeFileError
from taperlm.files.io import error_text, open_regular


@dataclass
class LoadedModel:
    model: Any  # torch.nn.Module
    encode: Callable[[str], list[int]]
    name: str
    kind: str  # "run" | "hf"
    context_length: int | None
    data_dir: Path | None = None  # a run's data dir (its val split is the fallback text)
    run_dir: Path | None = None  # a run's directory (its record of the data it trained on)


def load_model(
    spec: str,
    device: str = "cpu",
    dtype: str | None = None,
    trust_remote_code: bool = False,
    step: int | None = None,
) -> LoadedModel:
    """MODEL argument -> model in eval mode + its tokenizer's encode.

    - a run dir (has config.yaml): newest complete checkpoint (or `step`), tokenizer of its
      data dir; a checkpoint dir (has manifest.json) loads that checkpoint;
    - a Hugging Face model dir (has config.json), e.g. a `taperlm export` (loaded by the model
      classes taperlm registers with transformers, never by the folder's own code files);
    - `hf:NAME`: any Hub causal LM (needs internet or the HF cache).
    Code shipped with a model (config `auto_map`, a folder's .py files) runs only when
    `trust_remote_code` is set, for folders and hf:NAME alike.
    """
    if spec.startswith("hf:"):
        return _load_hf(spec[3:], spec, device, dtype, trust_remote_code)
    path = Path(spec)
    if path.is_dir() and any((path / f).is_file() for f in ("config.yaml", "manifest.json")):
        return _load_run(path, device, dtype, step)
    if path.is_dir() and (path / "config.json").is_file():
        return _load_hf(str(path), spec, device, dtype, trust_remote_code)
    if not path.exists():
        raise ConfigError(
            f"MODEL {spec!r} does not exist; give a run dir (with config.yaml), a Hugging Face "
            "model dir (with config.json) or hf:NAME (e.g. hf:gpt2)"
        )
    raise ConfigError(
        f"MODEL {spec!r} is neither a run dir (no config.yaml) nor a Hugging Face model dir "
        "(no config.json); point at the run/export folder or use hf:NAME"
    )


def _torch_dtype(dtype: str | None):
    if dtype is None:
        return None
    table = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if dtype not in table:
        raise ConfigError(f"--dtype {dtype!r} is unknown; choose fp32, bf16 or fp16")
    return table[dtype]


def _load_run(run_dir: Path, device: str, dtype: str | None, step: int | None) -> LoadedModel:
    model, tok, run_cfg = load_run(run_dir, step=step, device=device)
    if (td := _torch_dtype(dtype)) is not None:
        model = model.to(td)
    root = run_root(run_dir)
    return LoadedModel(
        model,
        tok.encode,
        str(run_dir),
        "run",
        run_cfg.model.context_length,
        resolve_data_dir(root, run_cfg),
        root,
    )


def _load_hf(
    name: str, spec: str, device: str, dtype: str | None, trust_remote_code: bool
) -> LoadedModel:
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise ConfigError(
            "loading Hugging Face models needs transformers: pip install 'taperlm[hf]'"
        ) from None
    kw: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if (td := _torch_dtype(dtype)) is not None:
        kw["dtype"] = td
    try:
        tok = AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(name, **kw)
    except ValueError as err:  # transformers: the model needs its own code, which was not allowed
        if trust_remote_code or "trust_remote_code" not in str(err):
            raise
        raise ConfigError(
            f"{spec} ships its own model code (auto_map in its config); it was not run. If you "
            "trust its source, pass --trust-remote-code"
        ) from None
    except OSError as err:
        raise ConfigError(
            f"cannot load Hugging Face model {spec!r}: {err}. Check the name, the connection "
            "(weights are downloaded on first use) or the folder's files"
        ) from None
    model.to(device).eval()

    def encode(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False, verbose=False)["input_ids"])

    cfg = model.config
    ctx = None
    for attr in ("n_positions", "max_position_embeddings", "n_ctx", "context_length"):
        v = getattr(cfg, attr, None)
        if isinstance(v, int) and v > 0:
            ctx = v
            break
    return LoadedModel(model, encode, spec, "hf", ctx)


MAX_BYTES_PER_TOKEN = 64  # generous: a BPE token of natural text covers a few bytes


def first_tokens(
    path: Path,
    encode: Callable[[str], list[int]],
    n_tokens: int,
    options: tuple[str, str] = ("--data", "--tokens"),
) -> list[int]:
    """The first `n_tokens` token ids of a text file. Encodes a growing prefix (cut at a line
    end) instead of the whole file, with a margin of tokens past `n_tokens` so that the cut
    never changes a kept token; raises DataError when the file has fewer tokens. `options`
    names the calling command's (file, token count) options, which the errors tell to change."""
    file_option, tokens_option = options
    limit = max(1 << 20, MAX_BYTES_PER_TOKEN * (n_tokens + 64))
    try:  # only the prefix that can hold the tokens is read, whatever the file's size
        with open_regular(path, what=f"{file_option} file") as f:
            raw = f.read(limit)
            whole = not f.read(1)
        text = codecs.getincrementaldecoder("utf-8")("strict").decode(raw, final=whole)
    except UnsafeFileError as err:
        raise DataError(str(err)) from None
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"cannot read {file_option} {path}: {error_text(err)}") from None
    n_chars = max(4096, 8 * n_tokens)
    while True:
        end = text.find("\n", n_chars)
        prefix = text if end < 0 else text[: end + 1]
        ids = encode(prefix)
        if len(ids) >= n_tokens + 64 or len(prefix) == len(text):
            break
        n_chars *= 2
    if len(ids) < n_tokens:
        where = "" if whole else f" in its first {limit:,} bytes (all that is read for them)"
        raise DataError(
            f"{path} has only {len(ids)} tokens{where}, fewer than the {n_tokens} asked for; "
            f"pass a smaller {tokens_option}, or a longer file with {file_option}"
        )
    return ids[:n_tokens]


def first_val_tokens(
    data_dir: Path, n_tokens: int, option: str, run_dir: Path | None = None
) -> list[int]:
    """The first `n_tokens` token ids of a prepared data dir's validation split (the text novelty
    falls back to without WikiText-2); DataError when the split is shorter (naming the `option`
    that asked for `n_tokens`), or when `run_dir` was trained on other data than `data_dir` now
    holds (its tokens would stand for other text)."""

    if run_dir is not None:
        check_tokenizer(run_dir, data_dir)
    if run_dir is not None and (why := check_run_data(run_dir, data_dir, ("val",))):
        raise DataError(
            f"the data dir {data_dir} of run {run_dir} changed since the run was trained: "
            f"{why}. Restore that data, or pass the text to measure with --data FILE"
        )
    _, tokens = open_split(data_dir, "val")
    if len(tokens) < n_tokens:
        raise DataError(
            f"the val split of {data_dir} has {len(tokens)} tokens, fewer than {option} "
            f"{n_tokens}; lower it"
        )
    return [int(t) for t in tokens[:n_tokens]]
