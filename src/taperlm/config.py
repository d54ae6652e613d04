"""Typed configuration: model, data, training and the run that holds them; YAML load/save,
`--set key=value` overrides, and validation with specific errors (no torch import).

The resolved per-layer sizes (`ModelConfig.mlp_widths`, `layer_heads`, `layer_kv_heads`) are the
authority: they are written by `ModelConfig.resolve()` from the tapers and never recomputed once
present, so a checkpoint always rebuilds the shapes it was trained with (docs/training.md, run directories).

What differs between model families (their options, checks and per-layer sizes) lives in
`taperlm.families`; a model config carries only its own family's section (`hope:`, `titans:`,
...). Configs written by taperlm 0.1, which carried every family's section, still load.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from taperlm.domains import (
    MAX_BATCH,
    MAX_CONTEXT,
    MAX_COUNT,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_SEED,
    MAX_TOKENS,
    MAX_VOCAB,
    MAX_WIDTH,
    Domain,
    check_domains,
    check_field,
    setting,
    up_to,
)
from taperlm.errors import ConfigError, TaperError
from taperlm.families import FAMILIES, get_family
from taperlm.io import atomic_write_text, not_a_file
from taperlm.kv_taper import KVHeads, kv_heads_removed, kv_step, mlp_width_credit, solve_kv_heads
from taperlm.solver import solve_sizes
from taperlm.taper import TaperSpec, read_rho_mlp


@dataclass
class ModelConfig:
    """A language model of one family with per-layer MLP widths and attention heads.

    Fields:
        family: transformer | gated | hope | titans (`taperlm.families.FAMILIES`).
        vocab_size: tokenizer vocabulary size (the embedding and head rows).
        d_model: residual stream width.
        n_layers: number of blocks.
        n_heads: attention query heads of the uniform model (head dim = d_model / n_heads).
        n_kv_heads: key/value heads (GQA); null = n_heads (plain multi-head attention).
        mlp_width: baseline SwiGLU width of the uniform model (the budget is n_layers x mlp_width).
        taper: the schedule that produced `mlp_widths` (provenance).
        mlp_widths: resolved per-layer widths, one per layer; authoritative once written.
        head_taper: taper spec of the query heads per layer (same language as `taper`, e.g.
            cosine:1.25:0.75) at the fixed head dim; every layer keeps the group size
            n_heads / kv_heads, so its KV heads follow its query heads (docs/tapers.md).
        layer_heads: resolved query heads per layer (sum n_layers x n_heads, multiples of the
            group size); null = n_heads in every layer. Authoritative once written.
        kv_taper: taper spec of the KV heads per layer (same language; multipliers of the
            layer's default H_l / g KV heads, any mean; custom integers are counts). Each layer
            gets the nearest divisor of its query heads, and the MLP widths take up the K/V
            parameters saved, at the same total (taperlm.kv_taper, docs/tapers.md).
        layer_kv_heads: resolved KV heads per layer (each divides the layer's query heads);
            null = H_l / g. Authoritative once written.
        context_length: maximum sequence length (RoPE tables, evaluation windows).
        rope_theta: RoPE base.
        norm_eps: RMSNorm epsilon.
        tie_embeddings: share the token embedding with the output head.
        init_std: std of the normal init; residual output projections use init_std / sqrt(2 n_layers).
        init: how init_std applies to each matrix: `fixed` = init_std for every matrix (the
            residual output projections / sqrt(2 n_layers)); `fan_in` = each matrix's std
            follows its own fan-in, init_std * sqrt(d_model / fan_in) (the same / sqrt(2
            n_layers) for residual outputs), so a layer's MLP output variance at init does not
            depend on that layer's width (docs/compare.md, "Initialisation schemes").
        options: the family's own options (e.g. `taperlm.families.hope.HopeConfig`), written as
            the section named after the family (`hope:`) and read as `cfg.hope`; None for a
            family without options. Built without them (or with another family's, e.g. when the
            family is replaced), a config gets its family's defaults.
    """

    family: str = setting("transformer", Domain.choice_of(lambda: FAMILIES, "{families}"))
    vocab_size: int = setting(32000, up_to(MAX_VOCAB))
    d_model: int = setting(1024, up_to(MAX_WIDTH))
    n_layers: int = setting(24, up_to(MAX_LAYERS))
    n_heads: int = setting(16, up_to(MAX_HEADS))
    n_kv_heads: int | None = setting(None, up_to(MAX_HEADS))
    mlp_width: int = setting(2816, up_to(MAX_WIDTH))
    taper: TaperSpec = field(default_factory=TaperSpec)
    mlp_widths: list[int] | None = setting(None, up_to(MAX_WIDTH))
    head_taper: str = setting("uniform", "text")
    layer_heads: list[int] | None = setting(None, up_to(MAX_HEADS))
    kv_taper: str = setting("uniform", "text")
    layer_kv_heads: list[int] | None = setting(None, up_to(MAX_HEADS))
    context_length: int = setting(4096, up_to(MAX_CONTEXT))
    rope_theta: float = setting(10000.0, "(0, inf)")
    norm_eps: float = setting(1e-6, "(0, inf)")
    tie_embeddings: bool = False
    init_std: float = setting(0.02, "(0, inf)")
    init: str = setting("fixed", "{fixed, fan_in}")
    options: Any = field(default=None, metadata={"section": True})

    def __post_init__(self) -> None:
        # No options, or another family's (e.g. after dataclasses.replace(cfg, family=...)):
        # this family's defaults, just as a YAML section of another family is ignored.
        fam = FAMILIES.get(self.family) if isinstance(self.family, str) else None
        if fam is None:
            return
        others = tuple(f.options for f in FAMILIES.values() if f.options and f is not fam)
        if self.options is None or (others and isinstance(self.options, others)):
            self.options = fam.options() if fam.options else None

    def __getattr__(self, name: str) -> Any:
        # `cfg.hope`, `cfg.titans`, ...: the options under their YAML section name. Only called
        # for names that are not attributes; dunder lookups (copy, pickle) must fail normally.
        family = self.__dict__.get("family")
        if not name.startswith("__") and name == family and name in FAMILIES:
            options = self.__dict__.get("options")
            if options is not None:
                return options
        if not name.startswith("__") and name in FAMILIES:
            raise AttributeError(
                f"model.{name} holds the options of family {name!r}; this model is {family!r}"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def group_size(self) -> int:
        """Query heads per KV head (1 = multi-head attention); the same in every layer."""
        return self.n_heads // self.kv_heads

    def attention_heads(self, layer: int) -> tuple[int, int]:
        """(query heads, KV heads) of layer `layer`: `layer_heads` when resolved, else the
        uniform n_heads / kv_heads. Every block and budget formula reads heads through this."""
        q = self.n_heads if self.layer_heads is None else self.layer_heads[layer]
        if self.layer_kv_heads is not None:
            return q, self.layer_kv_heads[layer]
        return q, q // self.group_size

    def head_taper_spec(self) -> TaperSpec:
        """`head_taper` parsed, with steps of one KV group (TaperError if it is not valid)."""
        return TaperSpec.parse(self.head_taper, multiple_of=self.group_size)

    def kv_taper_spec(self) -> TaperSpec:
        """`kv_taper` parsed (TaperError if it is not valid)."""
        return TaperSpec.parse(self.kv_taper, multiple_of=1)

    def solve_kv_heads(self) -> KVHeads:
        """The KV taper solved against this config's query heads (counts, asked, notes)."""
        q = [self.attention_heads(i)[0] for i in range(self.n_layers)]
        step = kv_step(self.d_model, self.head_dim, self.taper.multiple_of)
        return solve_kv_heads(self.kv_taper_spec(), q, self.group_size, step)

    def validate(self) -> None:
        """Check shapes and options; raise ConfigError naming the key and the fix."""
        fam = get_family(self.family)
        check_domains(self, "model")
        _check_taper(self.taper, "model.taper")
        if fam.options is not None and isinstance(self.options, fam.options):
            check_domains(self.options, f"model.{self.family}")
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"model.d_model ({self.d_model}) must be divisible by model.n_heads ({self.n_heads})"
            )
        if self.head_dim % 2:
            raise ConfigError(f"head dim d_model/n_heads = {self.head_dim} must be even for RoPE")
        if self.n_kv_heads is not None and self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"model.n_kv_heads ({self.n_kv_heads}) must divide model.n_heads ({self.n_heads})"
            )
        self._validate_heads(fam)
        self._validate_kv_heads(fam)
        if self.mlp_widths is not None:
            if len(self.mlp_widths) != self.n_layers:
                raise ConfigError(
                    f"model.mlp_widths has {len(self.mlp_widths)} entries but model.n_layers is {self.n_layers}; "
                    "give one width per layer (or delete mlp_widths to resolve it from the taper)"
                )
            credit = mlp_width_credit(self)
            if sum(self.mlp_widths) != self.n_layers * self.mlp_width + credit:
                kv = f" + {credit} from the KV taper" if credit else ""
                raise ConfigError(
                    f"model.mlp_widths sum to {sum(self.mlp_widths)} but the budget is n_layers x mlp_width{kv} = "
                    f"{self.n_layers * self.mlp_width + credit}; the widths do not match this baseline "
                    "(delete mlp_widths to re-resolve them from the taper)"
                )
        if fam.options is None and self.options is not None:
            raise ConfigError(
                f"model.family {self.family!r} has no options, but {type(self.options).__name__} "
                "options are set"
            )
        if fam.options is not None and not isinstance(self.options, fam.options):
            raise ConfigError(
                f"model.{self.family} must be {fam.options.__name__} options, got "
                f"{type(self.options).__name__}"
            )
        fam.validate(self)

    def _check_head_spec(
        self, fam: Any, key: str, parse: Any, resolved: Any, noun: str, example: str
    ) -> None:
        """A head or KV taper (`model.KEY`) parses, is not a novelty allocation (rho_mlp measures
        the MLP), and tapers only a family with attention."""
        try:
            spec = parse()
        except TaperError as err:
            raise ConfigError(f"model.{key}: {err}") from None
        if spec.measured:
            raise ConfigError(
                f"model.{key}: novelty allocations act on MLP widths (rho_mlp measures the "
                f"MLP); give the {noun} a schedule such as {example}"
            )
        if (not spec.is_uniform or resolved is not None) and not fam.attention:
            raise ConfigError(
                f"model.{key}: the {self.family} family has no attention {noun} to taper; "
                f"use {key}: uniform"
            )

    def _validate_heads(self, fam: Any) -> None:
        """The head taper parses, and resolved heads are whole KV groups at the same budget
        (their types and ranges are the fields' domains)."""
        self._check_head_spec(
            fam, "head_taper", self.head_taper_spec, self.layer_heads, "heads", "cosine:1.25:0.75"
        )
        heads = self.layer_heads
        if heads is None:
            return
        g = self.group_size
        if len(heads) != self.n_layers or any(
            not isinstance(h, int) or isinstance(h, bool) or h < g or h % g for h in heads
        ):
            raise ConfigError(
                f"model.layer_heads must be {self.n_layers} positive multiples of the group size "
                f"n_heads/kv_heads = {g} (one per layer), got {heads}; delete it to re-resolve "
                "from model.head_taper"
            )
        if sum(heads) != self.n_layers * self.n_heads:
            raise ConfigError(
                f"model.layer_heads sum to {sum(heads)} but the budget is n_layers x n_heads = "
                f"{self.n_layers * self.n_heads}; delete it to re-resolve from model.head_taper"
            )

    def _validate_kv_heads(self, fam: Any) -> None:
        """The KV taper parses, and resolved KV heads divide each layer's query heads and save
        a whole number of MLP width steps."""
        self._check_head_spec(
            fam,
            "kv_taper",
            self.kv_taper_spec,
            self.layer_kv_heads,
            "KV heads",
            "cosine:1.0:0.5 or groups:0.5",
        )
        kv = self.layer_kv_heads
        if kv is None:
            return
        q = self.layer_heads or [self.n_heads] * self.n_layers
        if len(kv) != self.n_layers or any(
            not isinstance(k, int) or isinstance(k, bool) or k < 1 or h % k for k, h in zip(kv, q)
        ):
            raise ConfigError(
                f"model.layer_kv_heads must be {self.n_layers} positive integers, each dividing "
                f"its layer's query heads {q}, got {kv}; delete it to re-resolve from "
                "model.kv_taper"
            )
        step = kv_step(self.d_model, self.head_dim, self.taper.multiple_of)
        if kv_heads_removed(self) % step:
            raise ConfigError(
                f"model.layer_kv_heads {kv} remove {kv_heads_removed(self)} KV heads in total, "
                f"not a multiple of {step}: their parameters are not a whole number of MLP width "
                f"steps (multiple_of {self.taper.multiple_of}); delete it to re-resolve from "
                "model.kv_taper"
            )

    def resolve(self) -> ModelConfig:
        """Fill `layer_heads` from the head taper, `layer_kv_heads` from the KV taper,
        `mlp_widths` from the taper (taking up the K/V parameters the KV taper saves) and the
        family's per-layer sizes (e.g. Hope level widths, Titans memory widths) when absent,
        validate, and return self."""
        self.validate()
        heads = self.head_taper_spec()
        if self.layer_heads is None and not heads.is_uniform:
            try:
                self.layer_heads = solve_sizes(
                    heads, self.n_layers, self.n_heads, what="query head count"
                )
            except TaperError as err:
                raise ConfigError(f"model.head_taper {self.head_taper!r}: {err}") from None
        if self.layer_kv_heads is None and not self.kv_taper_spec().is_uniform:
            try:
                self.layer_kv_heads = self.solve_kv_heads().counts
            except TaperError as err:
                raise ConfigError(f"model.kv_taper {self.kv_taper!r}: {err}") from None
        if self.mlp_widths is None:
            total = self.n_layers * self.mlp_width + mlp_width_credit(self)
            try:
                self.mlp_widths = solve_sizes(
                    self.taper, self.n_layers, self.mlp_width, total=total
                )
            except TaperError as err:
                if not mlp_width_credit(self):
                    raise
                raise TaperError(
                    f"{err} (the MLP widths take up the {mlp_width_credit(self):+d} units of "
                    f"width the KV taper {self.kv_taper!r} frees)"
                ) from None
        get_family(self.family).resolve(self)
        self.validate()
        return self

    def with_taper(
        self, taper: TaperSpec, head_taper: str | None = None, kv_taper: str | None = None
    ) -> ModelConfig:
        """A copy of this config with a different taper (and head / KV taper, when given),
        sizes re-resolved at the same budget."""
        fam = get_family(self.family)
        options = fam.fresh_options(self.options)
        heads: dict[str, Any] = {}
        if head_taper is not None:  # the KV heads follow the query heads: re-resolve them too
            heads = {"head_taper": head_taper, "layer_heads": None, "layer_kv_heads": None}
        if kv_taper is not None:
            heads |= {"kv_taper": kv_taper, "layer_kv_heads": None}
        return dataclasses.replace(
            self, taper=taper, mlp_widths=None, options=options, **heads
        ).resolve()

    def baseline(self) -> ModelConfig:
        """The uniform model of the same budget (every taper turned off: MLP widths, heads and
        a family's own)."""
        fam = get_family(self.family)
        uniform = TaperSpec(schedule="uniform", multiple_of=self.taper.multiple_of)
        options = None if self.options is None else fam.fresh_options(fam.untapered(self.options))
        return dataclasses.replace(
            self,
            taper=uniform,
            mlp_widths=None,
            head_taper="uniform",
            layer_heads=None,
            kv_taper="uniform",
            layer_kv_heads=None,
            options=options,
        ).resolve()


@dataclass
class DataConfig:
    """Where training tokens come from.

    Fields:
        dir: folder written by `taperlm prepare` (shards, meta.json, tokenizer/).
    """

    dir: str = setting("", "text")


@dataclass
class TrainConfig:
    """The training loop.

    Fields:
        seed: seed of init, data order and dropout-free RNG streams.
        paired_init: draw every weight matrix from its own stream keyed by (seed, parameter
            name), the SwiGLU MLPs in blocks of 16 hidden units, instead of one sequential
            stream: the same distribution, but models that differ only in per-layer widths
            start from the same weights wherever their shapes agree (the common random numbers
            of a paired comparison: `--set train.paired_init=true` in `taperlm compare`).
        tokens: total training tokens; the run makes tokens / batch_tokens optimizer steps,
            rounded up to a whole step (the trainer says so when it rounds).
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
        compile: compile the model with torch.compile (see compile_scope).
        compile_scope: model (one graph for the whole model) | blocks (each block compiled on
            its own, "regional": faster to compile, one recompile per distinct block shape).
        activation_checkpointing: none | full (keep only each block's input for backward and
            recompute the block; same losses, less activation memory, ~1/3 more compute).
        parallel: ddp | fsdp (under torchrun; ignored for one process).
        fsdp_param_dtype: auto | bf16 | fp32: dtype FSDP2 gathers parameters in for compute
            (auto = bf16 when the run computes in bf16, else fp32). Sharded weights, gradients
            and optimizer state stay fp32.
        fsdp_reduce_dtype: fp32 | bf16: dtype FSDP2 reduce-scatters gradients in.
        async_checkpoint: write checkpoint shards in a background thread while training goes
            on (committed once every rank has written; the final checkpoint is synchronous).
        device: auto | cpu | cuda.
        eval_every: steps between validation-loss evaluations (0 = only at the end).
        eval_tokens: validation tokens per evaluation (0 = no validation).
        checkpoint_every: steps between checkpoints (0 = only at the end).
        keep_checkpoints: keep the newest k checkpoints.
        log_every: steps between metric lines (0 = only at the end).
        max_bad_steps: consecutive non-finite steps tolerated before the run stops.
        peak_flops: peak FLOP/s of one device for MFU (null = the built-in table on CUDA,
            no MFU on CPU).
        restore_nonfinite: keep a copy of the weights and optimizer state from before each
            step, so that a step that leaves a NaN/inf in them (with a finite loss) is undone
            and skipped like a non-finite loss (one more copy of both in device memory); false:
            such a step stops the run instead. Either way no non-finite state is checkpointed.
        loggers: live loggers beside RUN/metrics.jsonl: any of tensorboard (RUN/tensorboard),
            wandb (Weights & Biases; offline without credentials or with WANDB_MODE=offline);
            rank 0 only; a failing logger is a warning, never a stop (docs/training.md).
        log_grads_every: steps between per-layer gradient norms in metrics.jsonl and the
            loggers (0 = never).
        log_project: the W&B project.
        log_group: the W&B group of the run (empty = none; `taperlm compare` groups its cells).
        log_name: the logged run's name (empty = the run dir's name).

    Every field declares its allowed values beside it (`taperlm.domains.setting`).
    """

    seed: int = setting(0, f"[0, {MAX_SEED}]")
    paired_init: bool = False
    tokens: int = setting(62 * 16384, up_to(MAX_TOKENS))  # ~1M: whole steps of the default batch
    batch_tokens: int = setting(16384, up_to(MAX_TOKENS))
    micro_batch_size: int = setting(8, up_to(MAX_BATCH))
    seq_len: int = setting(256, up_to(MAX_CONTEXT))
    lr: float = setting(4e-4, "(0, inf)")
    min_lr_ratio: float = setting(0.1, "[0, 1]")
    warmup_tokens: int = setting(100_000, up_to(MAX_TOKENS, 0))
    weight_decay: float = setting(0.1, "[0, inf)")
    beta1: float = setting(0.9, "[0, 1)")
    beta2: float = setting(0.95, "[0, 1)")
    eps: float = setting(1e-8, "(0, inf)")
    grad_clip: float = setting(1.0, "[0, inf)")
    precision: str = setting("auto", "{auto, fp32, bf16}")
    compile: bool = False
    compile_scope: str = setting("model", "{model, blocks}")
    activation_checkpointing: str = setting("none", "{none, full}")
    parallel: str = setting("ddp", "{ddp, fsdp}")
    fsdp_param_dtype: str = setting("auto", "{auto, bf16, fp32}")
    fsdp_reduce_dtype: str = setting("fp32", "{fp32, bf16}")
    async_checkpoint: bool = False
    device: str = setting("auto", "{auto, cpu, cuda}")
    eval_every: int = setting(50, up_to(MAX_COUNT, 0))
    eval_tokens: int = setting(65536, up_to(MAX_TOKENS, 0))
    checkpoint_every: int = setting(100, up_to(MAX_COUNT, 0))
    keep_checkpoints: int = setting(2, up_to(MAX_COUNT))
    log_every: int = setting(10, up_to(MAX_COUNT, 0))
    max_bad_steps: int = setting(5, up_to(MAX_COUNT))
    peak_flops: float | None = setting(None, "(0, inf)")
    restore_nonfinite: bool = True
    loggers: list[str] = setting([], "{tensorboard, wandb}")
    log_grads_every: int = setting(100, up_to(MAX_COUNT, 0))
    log_project: str = setting("taperlm", "text")
    log_group: str = setting("", "text")
    log_name: str = setting("", "text")

    @property
    def steps(self) -> int:
        """Optimizer steps: `tokens / batch_tokens` rounded up to a whole step, so a run trains
        at least the tokens asked for (40,960 tokens in batches of 16,384 = 3 steps, 49,152)."""
        return max(1, -(-int(self.tokens) // int(self.batch_tokens)))

    def rounding_note(self) -> str | None:
        """What rounding `tokens` up to whole steps changed, or None when nothing was."""
        trained = self.steps * self.batch_tokens
        if trained == self.tokens:
            return None
        return (
            f"train.tokens {self.tokens:,} is not a whole number of steps of train.batch_tokens "
            f"{self.batch_tokens:,}: training {self.steps} steps = {trained:,} tokens (rounded up)"
        )


@dataclass
class RunConfig:
    """Everything a run needs: the model, the data and the training loop."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def validate(self) -> None:
        """Every section's declared domains (the model's own checks included)."""
        self.model.validate()
        check_domains(self.data, "data")
        check_domains(self.train, "train")

    def resolve(self) -> RunConfig:
        self.model.resolve()
        check_domains(self.data, "data")
        check_domains(self.train, "train")
        return self


# ----------------------------------------------------------------------------------------------
# dict <-> dataclass, with specific errors for unknown keys and wrong types


def to_dict(obj: Any) -> Any:
    """Plain-Python (YAML-safe) form of a config dataclass; a model's options are written as the
    section named after its family."""
    if isinstance(obj, TaperSpec):
        return obj.to_dict()
    if dataclasses.is_dataclass(obj):
        out = {name: to_dict(getattr(obj, name)) for name in config_keys(type(obj))}
        if isinstance(obj, ModelConfig) and obj.options is not None:
            out[obj.family] = to_dict(obj.options)
        return out
    if isinstance(obj, (list, tuple)):
        return [to_dict(x) for x in obj]
    return obj


def config_keys(cls: type) -> list[str]:
    """The keys of config dataclass `cls` in a YAML mapping (a model's options are not one: they
    are the section named after its family)."""
    return [f.name for f in dataclasses.fields(cls) if not f.metadata.get("section")]


def from_dict(cls: type, data: Any, where: str = "") -> Any:
    """Build dataclass `cls` from a dict, rejecting unknown keys and mistyped values by name."""
    if cls is TaperSpec:
        return _taper_from(data, where or "taper")
    if not isinstance(data, dict):
        raise ConfigError(
            f"{where or 'config'} must be a mapping, got {type(data).__name__}: {data!r}"
        )
    if cls is ModelConfig:
        return _model_from(data, where)
    return _dataclass_from(cls, data, where)


def _dataclass_from(cls: type, data: dict, where: str, sections: tuple[str, ...] = ()) -> Any:
    hints = typing.get_type_hints(cls)
    names = set(config_keys(cls))
    # key=str: YAML keys may be ints/bools/None (`1: 2`), which neither sort with str nor match.
    unknown = sorted((k for k in data if k not in names), key=str)
    if unknown:
        valid = names | set(sections)
        close = {u: _closest(str(u), valid) for u in unknown}
        hint = "; ".join(f"{u!r}" + _did_you_mean(u, c, where) for u, c in close.items())
        raise ConfigError(
            f"unknown key(s) in {where or 'config'}: {hint}. Valid keys: {', '.join(sorted(valid))}"
        )
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else key
        kwargs[key] = _coerce(hints[key], value, path)
        check_field(cls, key, kwargs[key], path)
    return cls(**kwargs)


def _did_you_mean(key: Any, close: str | None, where: str) -> str:
    """` (did you mean 'lr'?)`, or for a key of another section ` (it belongs in train:)`."""
    home = (
        section_of(key)
        if isinstance(key, str) and where in ("", "model", "data", "train")
        else None
    )
    if home and not where:
        return f" (it belongs in {home}:)"
    if home and home != where:
        return f" (it belongs in {home}:, not {where}:)"
    return f" (did you mean {close!r}?)" if close else ""


def _model_from(data: dict, where: str) -> ModelConfig:
    """A ModelConfig: the shared keys, plus the section named after its family read into the
    family's options. Sections of other families (every 0.1 config carried all of them) are
    ignored, and each family may upgrade keys of older layouts first (`Family.upgrade`)."""
    at = f"{where}." if where else ""
    family = _coerce(str, data.get("family", ModelConfig.family), f"{at}family")
    if family not in FAMILIES:
        raise ConfigError(f"{at}family {family!r} is unknown; choose one of {', '.join(FAMILIES)}")
    for fam in FAMILIES.values():
        data = fam.upgrade(data, where)
    fam = FAMILIES[family]
    shared = {k: v for k, v in data.items() if k not in FAMILIES}
    cfg = _dataclass_from(ModelConfig, shared, where, (family,) if fam.options else ())
    section = data.get(family, {}) if fam.options is not None else None
    if family in data and fam.options is None:
        raise ConfigError(f"{at}{family}: the {family} family has no options; delete the section")
    cfg.options = None if section is None else from_dict(fam.options, section, f"{at}{family}")
    return cfg


def _taper_from(data: Any, where: str) -> TaperSpec:
    if isinstance(data, str):
        return TaperSpec.parse(data)
    if isinstance(data, dict):
        spec = from_dict_plain(TaperSpec, data, where)
        _check_taper(spec, where)
        if spec.schedule == "novelty" and not spec.rho_mlp and not spec.needs_pilot:
            # a hand-written mapping may name only the measurement: read it once
            try:
                spec = spec.with_novelty(read_rho_mlp(spec.source))
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
    kwargs = {}
    for key, value in data.items():
        kwargs[key] = _coerce(hints[key], value, f"{where}.{key}")
        check_field(cls, key, kwargs[key], f"{where}.{key}")
    return cls(**kwargs)


def _check_taper(spec: TaperSpec, where: str) -> None:
    """A taper's declared domains, then its own checks (as ConfigError naming `where`)."""
    check_domains(spec, where)
    try:
        spec.validate()
    except TaperError as err:
        raise ConfigError(f"{where}: {err}") from None


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
            try:
                return float(value)
            except OverflowError:
                raise ConfigError(
                    f"{path} must be a number a float can hold, got {value}"
                ) from None
        raise ConfigError(f"{path} must be a number, got {type(value).__name__}: {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        hint = " (YAML reads unquoted yes/no/on/off/true/false as booleans: quote it)"
        raise ConfigError(
            f"{path} must be a string, got {type(value).__name__}: {value!r}"
            + (hint if isinstance(value, bool) else "")
        )
    return value


def _closest(name: str, options: set[str]) -> str | None:
    import difflib

    m = difflib.get_close_matches(name, sorted(options), n=1, cutoff=0.6)
    return m[0] if m else None


# ----------------------------------------------------------------------------------------------
# YAML and overrides


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping that gives one key twice (YAML forbids it; PyYAML keeps the last silently)."""


class StrictLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that rejects a key given twice in one mapping, at every depth: with
    the plain loader a second `train:` replaces the whole first section without a word.
    A key written explicitly may still override one brought in by a `<<:` merge."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:
                    continue  # an unhashable key: the base class reports it
                if first is not key_node:
                    raise DuplicateKeyError(
                        None,
                        None,
                        f"key {key!r} is given twice (first at line {first.start_mark.line + 1}); "
                        "the later one would silently replace the earlier -- keep one",
                        key_node.start_mark,
                    )
        return super().construct_mapping(node, deep=deep)


def strict_yaml_load(text: str) -> Any:
    """`yaml.safe_load` that raises DuplicateKeyError on a key given twice."""
    return yaml.load(text, Loader=StrictLoader)  # a SafeLoader subclass: builds no objects


def load_yaml(path: str | Path) -> dict:
    p = Path(path)
    kind = not_a_file(p)
    if kind:
        raise ConfigError(f"config file {p} is {kind}, not a file; give a YAML file")
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist")
    try:
        data = strict_yaml_load(p.read_text(encoding="utf-8"))
    except DuplicateKeyError as err:
        mark = err.problem_mark
        raise ConfigError(f"config file {p}, line {mark.line + 1}: {err.problem}") from None
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


def parse_override(text: str, origin: str = "--set") -> tuple[str, Any]:
    """`model.d_model=512` -> ("model.d_model", 512); the value is parsed as YAML."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"{origin} {text!r}: expected key=value, e.g. model.n_layers=12")
    try:
        value = strict_yaml_load(raw) if raw.strip() else ""
    except DuplicateKeyError as err:
        raise ConfigError(f"--set {text!r}: {err.problem}") from None
    except yaml.YAMLError:
        value = raw
    return key.strip(), value


OVERRIDES_ENV = "TAPERLM_SET"


def env_overrides() -> list[str]:
    """The `key=value` overrides in $TAPERLM_SET (separated by spaces, shell-quoted where a
    value has one), which every command that builds run configs (train, plan, compare) applies
    after its own --set: a way to run any documented command smaller or on other settings
    without editing it (e.g. a quick smoke run of a script)."""
    import os
    import shlex

    try:
        return shlex.split(os.environ.get(OVERRIDES_ENV, ""))
    except ValueError as err:
        raise ConfigError(f"{OVERRIDES_ENV}: {err}") from None


def apply_overrides(
    data: dict, overrides: list[str], origin: str = "--set", notes: list[str] | None = None
) -> dict:
    """Apply dotted `key=value` overrides to a nested config dict (in place, returned).

    A key without a section prefix (`d_model=512`) is looked up in model, then train, then data.
    Each key and value is checked as it is applied (`_check_override`), so that a typo is blamed
    on `origin` (the option or variable that gave it), not on the config file or preset.
    A later override of a key wins (scripts append to a base list); a value that replaces a
    different one already in `data` (a config file's, an earlier --set's) is appended to
    `notes` when it is given.
    """
    for text in overrides:
        key, value = parse_override(text, origin)
        parts = key.split(".")
        if parts[0] not in ("model", "data", "train"):
            section = section_of(parts[0])
            if section is None:
                raise ConfigError(
                    f"{origin} {text!r}: unknown key {parts[0]!r}; use model.KEY, train.KEY or "
                    "data.KEY"
                )
            parts = [section, *parts]
        dotted = ".".join(parts)
        _check_override(data, parts, value, f"{origin} {text!r}")
        node = data
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{origin} {text!r}: {p!r} is not a section")
        old = node.get(parts[-1], value)
        if notes is not None and old != value:
            notes.append(f"{origin} {dotted}={value!r} replaces {old!r}")
        node[parts[-1]] = value
        if parts[0] == "model" and _affects_sizes(parts[1:]):
            clear_resolved_sizes(data["model"])
    return data


def _check_override(data: dict, parts: list[str], value: Any, where: str) -> None:
    """ConfigError naming `where` for an unknown key (with the closest valid one) or a value of
    the wrong type or outside its domain. Keys inside a nested value (a taper mapping) are left
    to the full config check."""
    if parts[0] == "model" and len(parts) > 2 and parts[1] in FAMILIES:
        cls, rest, at = FAMILIES[parts[1]].options, parts[2:], f"model.{parts[1]}"
        if cls is None:
            raise ConfigError(f"{where}: the {parts[1]} family has no options")
    else:
        cls = {"model": ModelConfig, "train": TrainConfig, "data": DataConfig}[parts[0]]
        rest, at = parts[1:], parts[0]
    if len(rest) != 1:
        return
    name = rest[0]
    valid = set(config_keys(cls)) | (set(FAMILIES) if cls is ModelConfig else set())
    if name not in valid:
        close = _closest(name, valid)
        raise ConfigError(
            f"{where}: unknown key(s) in {at}: {name!r}"
            + (f" (did you mean {close!r}?)" if close else "")
            + f". Valid keys: {', '.join(sorted(valid))}"
        )
    if name in FAMILIES or name in ("taper", "head_taper", "kv_taper"):  # specs: the full check
        return
    hint = typing.get_type_hints(cls)[name]
    try:
        check_field(cls, name, _coerce(hint, value, f"{at}.{name}"), f"{at}.{name}")
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None


_SIZE_KEYS = {
    *("taper", "mlp_width", "n_layers", "family", "head_taper", "n_heads", "n_kv_heads"),
    "kv_taper",
}


def _affects_sizes(path: list[str]) -> bool:
    """Whether overriding model.<path> changes the resolved per-layer sizes: a taper, a
    baseline size (MLP width, heads), the depth, the family or any family option (except a
    resolved size itself)."""
    if not path or (path[0] not in _SIZE_KEYS and path[0] not in FAMILIES):
        return False
    resolved = {"mlp_widths", "layer_heads", "layer_kv_heads"} | {
        k for fam in FAMILIES.values() for k in fam.resolved
    }
    return path[-1] not in resolved


def clear_resolved_sizes(model: dict) -> None:
    """Drop resolved per-layer sizes from a model dict so `resolve()` recomputes them from the
    (changed) taper; used when the taper, baseline or depth is overridden."""
    model.pop("mlp_widths", None)
    model.pop("layer_heads", None)
    model.pop("layer_kv_heads", None)
    for fam in FAMILIES.values():
        section = model.get(fam.name)
        if isinstance(section, dict):
            for key in fam.resolved:
                section.pop(key, None)


def file_notes(data: dict, cfg: RunConfig) -> list[str]:
    """What a config file holds that the resolved `cfg` does not use, as notes: sections of
    other families (kept loadable for 0.1 configs, which carried all of them) and written
    per-layer widths that its taper would not give (written sizes are the authority)."""
    model = data.get("model") if isinstance(data.get("model"), dict) else {}
    notes = [
        f"model.{name}: ignored -- model.family is {cfg.model.family!r} (set model.family: "
        f"{name} to use it)"
        for name in FAMILIES
        if name in model and name != cfg.model.family
    ]
    m = cfg.model
    if model.get("mlp_widths") is not None and not m.taper.needs_pilot:
        with contextlib.suppress(TaperError, ConfigError):
            if solve_sizes(m.taper, m.n_layers, m.mlp_width) != m.mlp_widths:
                notes.append(
                    f"model.mlp_widths are used as written, not the widths its taper "
                    f"({m.taper.schedule}) gives; delete mlp_widths to resolve them from it"
                )
    return notes


def section_of(key: str) -> str | None:
    """The config section (model, train, data) a bare `--set` key belongs to, if any; a family's
    options section (`hope`, ...) belongs to model."""
    if key in FAMILIES:
        return "model"
    for section, cls in (("model", ModelConfig), ("train", TrainConfig), ("data", DataConfig)):
        if key in config_keys(cls):
            return section
    return None
