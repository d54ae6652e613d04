"""Models and text for analysis commands: load a model (our run dir, a Hugging Face model dir, or
`hf:NAME`) with the tokenizer it was trained with, find the default corpus (WikiText-2 test, the
paper's choice for novelty), and cut the first N tokens of a text."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taperlm.errors import CheckpointError, ConfigError, DataError

WIKITEXT_TEST = Path("wikitext-2") / "wiki.test.raw"
_PKG_ROOT = Path(__file__).resolve().parents[3]  # the checkout root for an editable install


@dataclass
class LoadedModel:
    model: Any  # torch.nn.Module
    encode: Callable[[str], list[int]]
    name: str
    kind: str  # "run" | "hf"
    context_length: int | None


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
    - a Hugging Face model dir (has config.json), e.g. a `taperlm export`: loaded with
      trust_remote_code (it is a local folder the user chose; our exports need their code);
    - `hf:NAME`: any Hub causal LM (needs internet or the HF cache); remote code only when
      `trust_remote_code` is set.
    """
    if spec.startswith("hf:"):
        return _load_hf(spec[3:], spec, device, dtype, trust_remote_code)
    path = Path(spec)
    if path.is_dir() and any((path / f).is_file() for f in ("config.yaml", "manifest.json")):
        return _load_run(path, device, dtype, step)
    if path.is_dir() and (path / "config.json").is_file():
        return _load_hf(str(path), spec, device, dtype, True)
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
    import torch

    if dtype is None:
        return None
    table = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if dtype not in table:
        raise ConfigError(f"--dtype {dtype!r} is unknown; choose fp32, bf16 or fp16")
    return table[dtype]


def _load_run(run_dir: Path, device: str, dtype: str | None, step: int | None) -> LoadedModel:
    try:
        from taperlm.training.checkpoint import load_run_model
    except ImportError as err:
        raise CheckpointError(
            f"cannot load run {run_dir}: taperlm.training.checkpoint is unavailable ({err})"
        ) from None
    from taperlm.data.tokenizer import load_tokenizer

    model, run_cfg = load_run_model(run_dir, step=step, device=device)
    if (td := _torch_dtype(dtype)) is not None:
        model = model.to(td)
    data_dir = _resolve_data_dir(Path(run_cfg.data.dir), run_dir)
    tok = load_tokenizer(data_dir)
    if tok.vocab_size > run_cfg.model.vocab_size:
        raise DataError(
            f"tokenizer in {data_dir} has {tok.vocab_size} ids but the model's vocab_size is "
            f"{run_cfg.model.vocab_size}; the run's data.dir points at the wrong data"
        )
    model.eval()
    return LoadedModel(model, tok.encode, str(run_dir), "run", run_cfg.model.context_length)


def _resolve_data_dir(data_dir: Path, run_dir: Path) -> Path:
    """A run's data.dir may be relative to where training ran; try cwd, the run dir and its
    parent before giving up."""
    if not str(data_dir) or str(data_dir) == ".":
        raise DataError(
            f"run {run_dir} has no data.dir in its config, so its tokenizer is unknown; set "
            "data.dir in its config.yaml to the folder `taperlm prepare` wrote"
        )
    candidates = [data_dir] if data_dir.is_absolute() else [data_dir, run_dir / data_dir]
    if not data_dir.is_absolute():
        candidates.append(run_dir.parent / data_dir)
    for c in candidates:
        if c.is_dir():
            return c
    raise DataError(
        f"the tokenizer of run {run_dir} lives in its data dir {data_dir}, which does not exist "
        f"(tried {', '.join(map(str, candidates))}); re-create it with `taperlm prepare` or fix "
        "data.dir in the run's config.yaml"
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


def default_eval_text() -> Path:
    """WikiText-2 raw test: $TAPERLM_EVAL_DATA (a folder laid out like ../shared/data, or the
    file itself), else ../shared/data beside the checkout or the working directory."""
    env = os.environ.get("TAPERLM_EVAL_DATA")
    tried: list[Path] = []
    if env:
        p = Path(env)
        tried += [p] if p.is_file() else [p / WIKITEXT_TEST, p / "wiki.test.raw"]
    for root in (_PKG_ROOT, Path.cwd()):
        tried.append(root.parent / "shared" / "data" / WIKITEXT_TEST)
        tried.append(root / "shared" / "data" / WIKITEXT_TEST)
    for p in tried:
        if p.is_file():
            return p
    raise DataError(
        "no default text for novelty: WikiText-2 test (wikitext-2/wiki.test.raw) not found "
        f"(tried {', '.join(dict.fromkeys(map(str, tried)))}); set TAPERLM_EVAL_DATA to a folder "
        "laid out like ../shared/data, or pass --data FILE"
    )


def first_tokens(path: Path, encode: Callable[[str], list[int]], n_tokens: int) -> list[int]:
    """The first `n_tokens` token ids of a text file. Encodes a growing prefix (cut at a line
    end) instead of the whole file, with a margin of tokens past `n_tokens` so that the cut
    never changes a kept token; raises DataError when the file has fewer tokens."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"cannot read --data {path}: {err}") from None
    n_chars = max(4096, 8 * n_tokens)
    while True:
        end = text.find("\n", n_chars)
        prefix = text if end < 0 else text[: end + 1]
        ids = encode(prefix)
        if len(ids) >= n_tokens + 64 or len(prefix) == len(text):
            break
        n_chars *= 2
    if len(ids) < n_tokens:
        raise DataError(
            f"{path} has only {len(ids)} tokens, fewer than the {n_tokens} asked for; "
            "pass a smaller --tokens or a longer file"
        )
    return ids[:n_tokens]
