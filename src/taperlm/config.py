"""Typed configuration: model, data, training and the run that holds them; YAML load/save,
`--set key=value` overrides, and validation with specific errors (no torch import).

The resolved per-layer widths (`ModelConfig.mlp_widths`) are the authority: they are written by
`ModelConfig.resolve()` from the taper and never recomputed once present, so a checkpoint always
rebuilds the shapes it was trained with (DESIGN.md, principle 2).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from taperlm.errors import ConfigError, TaperError
from taperlm.io import atomic_write_text
from taperlm.taper import TaperSpec, solve_sizes

FAMILIES = ("transformer", "gated", "hope", "titans")
GATE_KINDS = ("elementwise", "headwise")
TITANS_VARIANTS = ("mac", "mag", "mal")


@dataclass
class HopeConfig:
    """Hope-attention: the MLP of every block is a Continuum Memory System (CMS), a chain of
    `levels` SwiGLU MLPs. Level widths of layer l are `level_fractions` x mlp_widths[l] (resolved
    into `HopeConfig.level_widths` by the model family; see docs/architectures.md). Level i's
    parameters take an optimizer step every `update_periods[i]` optimizer steps, accumulating
    gradients in between (the multi-timescale reading of Nested Learning).

    Fields:
        levels: number of CMS levels k (k = 1 with period 1 is exactly Transformer++).
        level_fractions: share of the layer's MLP width given to each level (sums to 1).
        update_periods: optimizer-step period C_i of each level (1 = every step).
        level_widths: resolved [layer][level] widths; written by the library, authoritative.
    """

    levels: int = 3
    level_fractions: list[float] = field(default_factory=lambda: [0.5, 0.25, 0.25])
    update_periods: list[int] = field(default_factory=lambda: [1, 4, 16])
    level_widths: list[list[int]] | None = None


@dataclass
class TitansConfig:
    """Titans: neural long-term memory (LMM) combined with attention, followed by a SwiGLU MLP.

    Fields:
        variant: mac (memory as context) | mag (memory as gate) | mal (memory as layer).
        memory_heads: number of memory heads H_m.
        memory_head_dim: per-head key/value width d_m of the memory.
        memory_depth: layers of the memory MLP (>= 2).
        memory_expansion: hidden width of the memory MLP as a multiple of memory_head_dim.
        chunk_size: tokens per chunk of the chunk-wise parallel update; part of the model.
        conv_kernel: kernel of the depthwise convolutions after the q/k/v projections.
        persistent_tokens: learned persistent memory tokens N_p.
        window: sliding attention window (mag, mal).
        segment_len: segment length of mac.
        max_inner_lr: upper bound of the data-dependent inner learning rate theta_t.
        memory_taper: second taper (spec string, e.g. cosine:1.5:0.5) on the per-layer memory
            hidden width; baseline memory_expansion x memory_head_dim; depth 2 only (deeper
            memories are not linear in the width, so a taper would change the budget).
        memory_multiple_of: every resolved memory width is a multiple of this.
        memory_widths: resolved per-layer memory hidden widths; written by the library.
    """

    variant: str = "mag"
    memory_heads: int = 4
    memory_head_dim: int = 64
    memory_depth: int = 2
    memory_expansion: int = 2
    chunk_size: int = 16
    conv_kernel: int = 4
    persistent_tokens: int = 4
    window: int = 512
    segment_len: int = 128
    max_inner_lr: float = 0.1
    memory_taper: str = "uniform"
    memory_multiple_of: int = 16
    memory_widths: list[int] | None = None


@dataclass
class ModelConfig:
    """A language model of one family with per-layer MLP widths.

    Fields:
        family: transformer | gated | hope | titans.
        vocab_size: tokenizer vocabulary size (the embedding and head rows).
        d_model: residual stream width.
        n_layers: number of blocks.
        n_heads: attention query heads.
        n_kv_heads: key/value heads (GQA); null = n_heads (plain multi-head attention).
        mlp_width: baseline SwiGLU width of the uniform model (the budget is n_layers x mlp_width).
        taper: the schedule that produced `mlp_widths` (provenance).
        mlp_widths: resolved per-layer widths, one per layer; authoritative once written.
        context_length: maximum sequence length (RoPE tables, evaluation windows).
        rope_theta: RoPE base.
        norm_eps: RMSNorm epsilon.
        tie_embeddings: share the token embedding with the output head.
        init_std: std of the normal init; residual output projections use init_std / sqrt(2 n_layers).
        gate: gated family only — elementwise (d x d gate) or headwise (d x H gate).
        hope: hope family options.
        titans: titans family options.
    """

    family: str = "transformer"
    vocab_size: int = 32000
    d_model: int = 1024
    n_layers: int = 24
    n_heads: int = 16
    n_kv_heads: int | None = None
    mlp_width: int = 2816
    taper: TaperSpec = field(default_factory=TaperSpec)
    mlp_widths: list[int] | None = None
    context_length: int = 4096
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    tie_embeddings: bool = False
    init_std: float = 0.02
    gate: str = "elementwise"
    hope: HopeConfig = field(default_factory=HopeConfig)
    titans: TitansConfig = field(default_factory=TitansConfig)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    def validate(self) -> None:
        """Check shapes and options; raise ConfigError naming the key and the fix."""
        if self.family not in FAMILIES:
            raise ConfigError(
                f"model.family {self.family!r} is unknown; choose one of {', '.join(FAMILIES)}"
            )
        for key in ("vocab_size", "d_model", "n_layers", "n_heads", "mlp_width", "context_length"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"model.{key} must be a positive integer, got {v!r}")
        for key in ("rope_theta", "norm_eps", "init_std"):
            v = getattr(self, key)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ConfigError(f"model.{key} must be a finite number > 0, got {v!r}")
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"model.d_model ({self.d_model}) must be divisible by model.n_heads ({self.n_heads})"
            )
        if self.head_dim % 2:
            raise ConfigError(f"head dim d_model/n_heads = {self.head_dim} must be even for RoPE")
        if self.n_kv_heads is not None and (self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads):
            raise ConfigError(
                f"model.n_kv_heads ({self.n_kv_heads}) must divide model.n_heads ({self.n_heads})"
            )
        if self.gate not in GATE_KINDS:
            raise ConfigError(
                f"model.gate {self.gate!r} is unknown; choose elementwise or headwise"
            )
        if self.mlp_widths is not None:
            if len(self.mlp_widths) != self.n_layers:
                raise ConfigError(
                    f"model.mlp_widths has {len(self.mlp_widths)} entries but model.n_layers is {self.n_layers}; "
                    "give one width per layer (or delete mlp_widths to resolve it from the taper)"
                )
            if any((not isinstance(w, int)) or w < 1 for w in self.mlp_widths):
                raise ConfigError(
                    f"model.mlp_widths must be positive integers, got {self.mlp_widths}"
                )
            if sum(self.mlp_widths) != self.n_layers * self.mlp_width:
                raise ConfigError(
                    f"model.mlp_widths sum to {sum(self.mlp_widths)} but the budget is n_layers x mlp_width = "
                    f"{self.n_layers * self.mlp_width}; the widths do not match this baseline "
                    "(delete mlp_widths to re-resolve them from the taper)"
                )
        if self.family == "titans":
            _validate_titans(self.titans, self.n_layers)
        if self.family == "hope":
            _validate_hope(self.hope, self.n_layers, self.mlp_widths)

    def resolve(self) -> ModelConfig:
        """Fill `mlp_widths` from the taper when absent, validate, and return self.

        Family-specific per-layer sizes (Hope level widths, Titans memory widths) are resolved by
        `taperlm.families.resolve_family_sizes`, which is called here as well.
        """
        self.validate()
        if self.mlp_widths is None:
            self.mlp_widths = solve_sizes(self.taper, self.n_layers, self.mlp_width)
        from taperlm.families import resolve_family_sizes  # no torch; avoids an import cycle

        resolve_family_sizes(self)
        self.validate()
        return self

    def with_taper(self, taper: TaperSpec) -> ModelConfig:
        """A copy of this config with a different taper, widths re-resolved at the same budget."""
        new = dataclasses.replace(self, taper=taper, mlp_widths=None)
        new.hope = dataclasses.replace(self.hope, level_widths=None)
        new.titans = dataclasses.replace(self.titans, memory_widths=None)
        return new.resolve()

    def baseline(self) -> ModelConfig:
        """The uniform model of the same budget (every taper turned off, the memory taper too)."""
        base = self.with_taper(TaperSpec(schedule="uniform", multiple_of=self.taper.multiple_of))
        if base.titans.memory_taper != "uniform":
            base.titans = dataclasses.replace(
                base.titans, memory_taper="uniform", memory_widths=None
            )
            base.resolve()
        return base


def _positive_int(value: Any, key: str, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{key} must be an integer >= {minimum}, got {value!r}")


def _validate_titans(t: TitansConfig, n_layers: int) -> None:
    """Titans options: shapes, chunking and the memory-width taper (ConfigError names the key)."""
    if t.variant not in TITANS_VARIANTS:
        raise ConfigError(f"model.titans.variant {t.variant!r} is unknown; choose mac, mag or mal")
    for key in (
        "memory_heads",
        "memory_head_dim",
        "memory_expansion",
        "chunk_size",
        "conv_kernel",
        "window",
        "segment_len",
        "memory_multiple_of",
    ):
        _positive_int(getattr(t, key), f"model.titans.{key}")
    _positive_int(t.memory_depth, "model.titans.memory_depth", 2)
    _positive_int(t.persistent_tokens, "model.titans.persistent_tokens", 0)
    if not isinstance(t.max_inner_lr, (int, float)) or not 0 < t.max_inner_lr <= 1:
        raise ConfigError(
            f"model.titans.max_inner_lr must be in (0, 1], got {t.max_inner_lr!r} "
            "(the inner step on ||M(k)-v||^2 diverges for large values)"
        )
    if t.variant == "mac" and t.segment_len % t.chunk_size:
        raise ConfigError(
            f"model.titans.segment_len ({t.segment_len}) must be a multiple of "
            f"model.titans.chunk_size ({t.chunk_size}) so memory chunks never straddle segments"
        )
    try:
        spec = TaperSpec.parse(t.memory_taper, t.memory_multiple_of)
    except TaperError as err:
        raise ConfigError(f"model.titans.memory_taper: {err}") from None
    if not spec.is_uniform and t.memory_depth != 2:
        raise ConfigError(
            f"model.titans.memory_taper {t.memory_taper!r} needs memory_depth 2 (got "
            f"{t.memory_depth}): deeper memories have width^2 parameters, so a taper would not "
            "keep the budget; use memory_taper: uniform"
        )
    base = t.memory_expansion * t.memory_head_dim
    if t.memory_widths is not None:
        w = t.memory_widths
        if len(w) != n_layers or any(not isinstance(x, int) or x < 1 for x in w):
            raise ConfigError(
                f"model.titans.memory_widths must be {n_layers} positive integers (one per "
                f"layer), got {w}; delete it to re-resolve from memory_taper"
            )
        if sum(w) != n_layers * base:
            raise ConfigError(
                f"model.titans.memory_widths sum to {sum(w)} but the budget is n_layers x "
                f"memory_expansion x memory_head_dim = {n_layers * base}; delete it to re-resolve"
            )


def _validate_hope(h: HopeConfig, n_layers: int, mlp_widths: list[int] | None) -> None:
    """Hope options: one fraction and one period per level; resolved widths split each layer."""
    _positive_int(h.levels, "model.hope.levels")
    for key in ("level_fractions", "update_periods"):
        n = len(getattr(h, key))
        if n != h.levels:
            raise ConfigError(
                f"model.hope.{key} has {n} entries but model.hope.levels is {h.levels}; "
                "give one per level"
            )
    if not all(math.isfinite(f) and f > 0 for f in h.level_fractions) or not (
        abs(sum(h.level_fractions) - 1) <= 1e-6
    ):
        raise ConfigError(
            f"model.hope.level_fractions must be positive and sum to 1, got {h.level_fractions}"
        )
    for i, p in enumerate(h.update_periods):
        _positive_int(p, f"model.hope.update_periods[{i}]")
    if h.level_widths is not None:
        rows = h.level_widths
        if len(rows) != n_layers or any(len(r) != h.levels for r in rows):
            raise ConfigError(
                f"model.hope.level_widths must be {n_layers} rows of {h.levels} widths; "
                "delete it to re-resolve from level_fractions"
            )
        for i, r in enumerate(rows):
            if any(not isinstance(x, int) or x < 1 for x in r):
                raise ConfigError(f"model.hope.level_widths[{i}] must be positive integers: {r}")
            if mlp_widths is not None and sum(r) != mlp_widths[i]:
                raise ConfigError(
                    f"model.hope.level_widths[{i}] = {r} sums to {sum(r)} but mlp_widths[{i}] is "
                    f"{mlp_widths[i]}; delete level_widths to re-resolve"
                )


@dataclass
class DataConfig:
    """Where training tokens come from.

    Fields:
        dir: folder written by `taperlm prepare` (shards, meta.json, tokenizer/).
    """

    dir: str = ""


@dataclass
class TrainConfig:
    """The training loop.

    Fields:
        seed: seed of init, data order and dropout-free RNG streams.
        tokens: total training tokens (steps = tokens / batch_tokens).
        batch_tokens: global batch in tokens per optimizer step (across ranks and micro-batches).
        micro_batch_size: sequences per forward pass per rank (accumulation fills the global batch).
        seq_len: training sequence length (<= model.context_length).
        lr: peak learning rate.
        min_lr_ratio: cosine decay floor as a fraction of lr.
        warmup_tokens: linear warmup length in tokens.
        weight_decay: AdamW decay on matrices (embeddings, norms and biases get none).
        beta1, beta2, eps: AdamW moments.
        grad_clip: max global grad norm (0 disables).
        precision: auto | fp32 | bf16 (auto = bf16 autocast on CUDA, fp32 on CPU).
        compile: wrap the model in torch.compile.
        parallel: ddp | fsdp (under torchrun; ignored for one process).
        device: auto | cpu | cuda.
        eval_every: steps between validation-loss evaluations (0 = only at the end).
        eval_tokens: validation tokens per evaluation.
        checkpoint_every: steps between checkpoints (0 = only at the end).
        keep_checkpoints: keep the newest k checkpoints.
        log_every: steps between metric lines.
        max_bad_steps: consecutive non-finite steps tolerated before the run stops.
        peak_flops: peak FLOP/s of one device for MFU (null = the built-in table on CUDA,
            no MFU on CPU).
    """

    seed: int = 0
    tokens: int = 1_000_000
    batch_tokens: int = 16384
    micro_batch_size: int = 8
    seq_len: int = 256
    lr: float = 4e-4
    min_lr_ratio: float = 0.1
    warmup_tokens: int = 100_000
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    precision: str = "auto"
    compile: bool = False
    parallel: str = "ddp"
    device: str = "auto"
    eval_every: int = 50
    eval_tokens: int = 65536
    checkpoint_every: int = 100
    keep_checkpoints: int = 2
    log_every: int = 10
    max_bad_steps: int = 5
    peak_flops: float | None = None


@dataclass
class RunConfig:
    """Everything a run needs: the model, the data and the training loop."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def resolve(self) -> RunConfig:
        self.model.resolve()
        return self


# ----------------------------------------------------------------------------------------------
# dict <-> dataclass, with specific errors for unknown keys and wrong types


def to_dict(obj: Any) -> Any:
    """Plain-Python (YAML-safe) form of a config dataclass."""
    if isinstance(obj, TaperSpec):
        return obj.to_dict()
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(x) for x in obj]
    return obj


def from_dict(cls: type, data: Any, where: str = "") -> Any:
    """Build dataclass `cls` from a dict, rejecting unknown keys and mistyped values by name."""
    if cls is TaperSpec:
        return _taper_from(data, where or "taper")
    if not isinstance(data, dict):
        raise ConfigError(
            f"{where or 'config'} must be a mapping, got {type(data).__name__}: {data!r}"
        )
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    # key=str: YAML keys may be ints/bools/None (`1: 2`), which neither sort with str nor match.
    unknown = sorted((k for k in data if k not in names), key=str)
    if unknown:
        close = {u: _closest(str(u), names) for u in unknown}
        hint = "; ".join(
            f"{u!r}" + (f" (did you mean {c!r}?)" if c else "") for u, c in close.items()
        )
        raise ConfigError(
            f"unknown key(s) in {where or 'config'}: {hint}. Valid keys: {', '.join(sorted(names))}"
        )
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else key
        kwargs[key] = _coerce(hints[key], value, path)
    return cls(**kwargs)


def _taper_from(data: Any, where: str) -> TaperSpec:
    if isinstance(data, str):
        return TaperSpec.parse(data)
    if isinstance(data, dict):
        spec = from_dict_plain(TaperSpec, data, where)
        try:
            spec.validate()
        except TaperError as err:
            raise ConfigError(f"{where}: {err}") from None
        return spec
    raise ConfigError(
        f"{where} must be a taper spec string (e.g. cosine:1.5:0.5) or a mapping, got {data!r}"
    )


def from_dict_plain(cls: type, data: dict, where: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted((k for k in data if k not in names), key=str)
    if unknown:
        raise ConfigError(
            f"unknown key(s) in {where}: {', '.join(map(repr, unknown))}. Valid keys: {', '.join(sorted(names))}"
        )
    return cls(**{k: _coerce(hints[k], v, f"{where}.{k}") for k, v in data.items()})


def _coerce(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(a, value, path)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"{path}: invalid value {value!r}")
    if dataclasses.is_dataclass(tp) or tp is TaperSpec:
        return from_dict(tp, value, path)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{path} must be a list, got {type(value).__name__}: {value!r}")
        (inner,) = args
        return [_coerce(inner, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{path} must be true or false, got {value!r}")
    if tp in (int, float) and isinstance(value, str):
        # YAML 1.1 reads `1e-3` and `2e6` as strings; accept numeric strings.
        with contextlib.suppress(ValueError):
            value = float(value.replace("_", ""))
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{path} must be an integer, got {type(value).__name__}: {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{path} must be a number, got {type(value).__name__}: {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{path} must be a string, got {type(value).__name__}: {value!r}")
    return value


def _closest(name: str, options: set[str]) -> str | None:
    import difflib

    m = difflib.get_close_matches(name, sorted(options), n=1, cutoff=0.6)
    return m[0] if m else None


# ----------------------------------------------------------------------------------------------
# YAML and overrides


def load_yaml(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(
            f"config file {p} is not valid YAML{where}: {getattr(err, 'problem', err)}"
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {p} is not UTF-8 text") from None
    if data is None:
        raise ConfigError(f"config file {p} is empty")
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {p} must hold a mapping (model:, data:, train:), got {type(data).__name__}"
        )
    return data


def run_config_from_dict(data: dict, source: str = "config") -> RunConfig:
    """A RunConfig from a dict; a bare model mapping (family:, d_model:, ...) is accepted too."""
    if "model" not in data and "family" in data:
        data = {"model": data}
    try:
        return from_dict(RunConfig, data, "")
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None


def save_yaml(cfg: RunConfig | ModelConfig, path: str | Path) -> None:
    """Write a config as YAML atomically (write to a temporary file, then rename)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(p, dump_yaml(cfg))


def dump_yaml(cfg: Any) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=None, width=100)


def load_run_config(path: str | Path) -> RunConfig:
    return run_config_from_dict(load_yaml(path), str(path))


def parse_override(text: str) -> tuple[str, Any]:
    """`model.d_model=512` -> ("model.d_model", 512); the value is parsed as YAML."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {text!r}: expected key=value, e.g. --set model.n_layers=12")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply dotted `key=value` overrides to a nested config dict (in place, returned).

    A key without a section prefix (`d_model=512`) is looked up in model, then train, then data.
    """
    for text in overrides:
        key, value = parse_override(text)
        parts = key.split(".")
        if parts[0] not in ("model", "data", "train"):
            section = _section_of(parts[0])
            if section is None:
                raise ConfigError(
                    f"--set {text!r}: unknown key {parts[0]!r}; use model.KEY, train.KEY or data.KEY"
                )
            parts = [section, *parts]
        node = data
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {text!r}: {p!r} is not a section")
        node[parts[-1]] = value
        if parts[0] == "model" and _affects_sizes(parts[1:]):
            clear_resolved_sizes(data["model"])
    return data


_SIZE_KEYS = {"taper", "mlp_width", "n_layers", "family", "hope", "titans"}
_RESOLVED_KEYS = {"mlp_widths", "level_widths", "memory_widths"}


def _affects_sizes(path: list[str]) -> bool:
    """Whether overriding model.<path> changes the resolved per-layer sizes."""
    return bool(path) and path[0] in _SIZE_KEYS and path[-1] not in _RESOLVED_KEYS


def clear_resolved_sizes(model: dict) -> None:
    """Drop resolved per-layer sizes from a model dict so `resolve()` recomputes them from the
    (changed) taper; used when the taper, baseline or depth is overridden."""
    model.pop("mlp_widths", None)
    for sub in ("hope", "titans"):
        if isinstance(model.get(sub), dict):
            model[sub].pop("level_widths", None)
            model[sub].pop("memory_widths", None)


def _section_of(key: str) -> str | None:
    for section, cls in (("model", ModelConfig), ("train", TrainConfig), ("data", DataConfig)):
        if key in {f.name for f in dataclasses.fields(cls)}:
            return section
    return None
