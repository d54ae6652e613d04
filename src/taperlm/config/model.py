"""The model section: `ModelConfig`, its checks, and `resolve()`, which writes the per-layer sizes.

The resolved per-layer sizes (`ModelConfig.mlp_widths`, `layer_heads`, `layer_kv_heads`) are the
authority: they are written by `ModelConfig.resolve()` from the tapers and never recomputed once
present, so a checkpoint always rebuilds the shapes it was trained with (docs/training.md, run directories).

What differs between model families (their options, checks and per-layer sizes) lives in
`taperlm.families`; a model config carries only its own family's section (`hope:`, `titans:`,
...).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from taperlm.config.budget import memory_floor
from taperlm.config.kv_taper import (
    KVHeads,
    kv_heads_removed,
    kv_step,
    mlp_width_credit,
    solve_kv_heads,
)
from taperlm.errors import ConfigError, TaperError
from taperlm.families import FAMILIES, get_family
from taperlm.files.io import quoted
from taperlm.spec.domains import (
    MAX_CONTEXT,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_VOCAB,
    MAX_WIDTH,
    Domain,
    check_domains,
    setting,
    up_to,
)
from taperlm.spec.solver import solve_sizes
from taperlm.spec.taper import TEXT_SPEC, TaperSpec, text_spec

# How init_std applies to each matrix (`ModelConfig.init`).
InitScheme = Literal["fixed", "fan_in"]
# How RoPE's frequencies are rescaled (`RopeScaling.type`): the kinds whose frequencies taperlm
# computes as transformers does (transformers' `rope_type` of the same name).
RopeType = Literal["linear", "llama3"]
# Which attention projections have a bias (`ModelConfig.attention_bias`): none (Llama, Mistral,
# Qwen3), q/k/v (Qwen2, Qwen2.5), or q/k/v and the output (Llama's attention_bias: true).
AttentionBias = Literal["none", "qkv", "qkvo"]


@dataclass
class RopeScaling:
    """RoPE frequencies rescaled for a longer context than the model was first trained for, as
    transformers computes them for the `rope_type` of the same name (`taperlm.models.layers.
    Rotary`): `linear` divides every frequency by `factor`; `llama3` (Llama 3.1 and later)
    divides the low frequencies (wavelengths longer than original_context / low_freq_factor) by
    `factor`, keeps the high ones (shorter than original_context / high_freq_factor) and blends
    linearly in between. Imported checkpoints carry it; export writes it back."""

    type: RopeType = setting("llama3", RopeType)
    """linear | llama3: which rescaling (transformers' rope_type)."""
    factor: float = setting(8.0, "(0, inf)")
    """how much longer the context is than the original one: frequencies are divided by it."""
    low_freq_factor: float = setting(1.0, "(0, inf)")
    """llama3: wavelengths longer than original_context / low_freq_factor are fully rescaled."""
    high_freq_factor: float = setting(4.0, "(0, inf)")
    """llama3: wavelengths shorter than original_context / high_freq_factor are kept; must be
    larger than low_freq_factor."""
    original_context: int = setting(8192, up_to(MAX_CONTEXT))
    """llama3: the context length of the original training (transformers'
    original_max_position_embeddings)."""

    def validate(self, where: str) -> None:
        """The factors' relation (their ranges are the fields' domains)."""
        check_domains(self, where)
        if self.type == "llama3" and not self.high_freq_factor > self.low_freq_factor:
            raise ConfigError(
                f"{where}: llama3 RoPE scaling needs high_freq_factor > low_freq_factor, got "
                f"{self.high_freq_factor} and {self.low_freq_factor}"
            )


def check_taper_spec(spec: TaperSpec, where: str) -> None:
    """A taper's declared domains, then its own checks (as ConfigError naming `where`)."""
    check_domains(spec, where)
    try:
        spec.validate()
    except TaperError as err:
        raise ConfigError(f"{where}: {err}") from None


def _head_spec(text: str) -> TaperSpec:
    """A head or KV taper spec parsed from `text`, in steps of 1 (the head taper's step of one
    KV group depends on the model: `ModelConfig.head_taper_spec`)."""
    return TaperSpec.parse(text, multiple_of=1)


@dataclass
class ModelConfig:
    """A language model of one family with per-layer MLP widths and attention heads."""

    family: str = setting("transformer", Domain.choice_of(lambda: FAMILIES, "{families}"))
    """transformer | gated | hope | titans (`taperlm.families.FAMILIES`)."""
    vocab_size: int = setting(32000, up_to(MAX_VOCAB))
    """tokenizer vocabulary size (the embedding and head rows)."""
    d_model: int = setting(1024, up_to(MAX_WIDTH))
    """residual stream width."""
    n_layers: int = setting(24, up_to(MAX_LAYERS))
    """number of blocks."""
    n_heads: int = setting(16, up_to(MAX_HEADS))
    """attention query heads of the uniform model (head dim = d_model / n_heads)."""
    n_kv_heads: int | None = setting(None, up_to(MAX_HEADS))
    """key/value heads (GQA); null = n_heads (plain multi-head attention)."""
    mlp_width: int = setting(2816, up_to(MAX_WIDTH))
    """baseline SwiGLU width of the uniform model (the budget is n_layers x mlp_width)."""
    taper: TaperSpec = field(default_factory=TaperSpec)
    """the schedule that produced `mlp_widths` (provenance)."""
    mlp_widths: list[int] | None = setting(None, up_to(MAX_WIDTH, 0))
    """resolved per-layer widths, one per layer; authoritative once written."""
    head_taper: TaperSpec = field(default_factory=lambda: _head_spec("uniform"), metadata=TEXT_SPEC)
    """taper spec of the query heads per layer (same language as `taper`, e.g. cosine:1.25:0.75) at
    the fixed head dim; every layer keeps the group size n_heads / kv_heads, so its KV heads
    follow its query heads (docs/tapers.md). Given and written as text (the spec keeps it,
    `TaperSpec.as_text`), parsed once when set (a text that does not parse is kept, for
    `validate` to refuse); its step of one KV group is applied by `head_taper_spec()`.
    """
    layer_heads: list[int] | None = setting(None, up_to(MAX_HEADS))
    """resolved query heads per layer (sum n_layers x n_heads, multiples of the group size); null =
    n_heads in every layer. Authoritative once written.
    """
    kv_taper: TaperSpec = field(default_factory=lambda: _head_spec("uniform"), metadata=TEXT_SPEC)
    """taper spec of the KV heads per layer (same language; multipliers of the layer's default H_l /
    g KV heads, any mean; custom integers are counts). Each layer gets the nearest divisor of its
    query heads, and the MLP widths take up the K/V parameters saved, at the same total
    (taperlm.config.kv_taper, docs/tapers.md). Given and written as text, parsed once when set, like
    `head_taper`.
    """
    layer_kv_heads: list[int] | None = setting(None, up_to(MAX_HEADS))
    """resolved KV heads per layer (each divides the layer's query heads); null = H_l / g.
    Authoritative once written.
    """
    context_length: int = setting(4096, up_to(MAX_CONTEXT))
    """maximum sequence length (RoPE tables, evaluation windows)."""
    rope_theta: float = setting(10000.0, "(0, inf)")
    """RoPE base."""
    rope_scaling: RopeScaling | None = None
    """RoPE frequencies rescaled for a longer context (`RopeScaling`: linear or llama3, as
    Llama 3.x checkpoints have); null = plain RoPE. Transformer++ only."""
    attention_bias: AttentionBias = setting("none", AttentionBias)
    """which attention projections add a learned bias: none | qkv (Qwen2/2.5) | qkvo (q/k/v and
    the output, Llama's attention_bias). Transformer++ only; biases start at zero."""
    qk_norm: bool = False
    """RMSNorm (a learned gain of head_dim, model.norm_eps) of each query and key head before
    RoPE, as Qwen3 has. Transformer++ only."""
    attention_head_dim: int | None = setting(None, up_to(MAX_WIDTH))
    """the attention head dim when it is not d_model / n_heads (Qwen3 states one); null =
    d_model / n_heads. Transformer++ only."""
    norm_eps: float = setting(1e-6, "(0, inf)")
    """RMSNorm epsilon."""
    tie_embeddings: bool = False
    """share the token embedding with the output head."""
    init_std: float = setting(0.02, "(0, inf)")
    """std of the normal init; residual output projections use init_std / sqrt(2 n_layers)."""
    init: InitScheme = setting("fixed", InitScheme)
    """how init_std applies to each matrix: `fixed` = init_std for every matrix (the residual output
    projections / sqrt(2 n_layers)); `fan_in` = each matrix's std follows its own fan-in,
    init_std * sqrt(d_model / fan_in) (the same / sqrt(2 n_layers) for residual outputs), so a
    layer's MLP output variance at init does not depend on that layer's width (docs/compare.md,
    "Initialisation schemes").
    """
    options: Any = field(default=None, metadata={"section": True})
    """the family's own options (e.g. `taperlm.families.hope.HopeConfig`), written as the section
    named after the family (`hope:`) and read as `cfg.hope`; None for a family without options.
    Built without them, a config gets its family's defaults; another family's are refused by
    `validate` (change the family with `as_family`).
    """

    def __post_init__(self) -> None:
        # Built without options: this family's defaults. Options of another family are kept as
        # given, for validate() to refuse by name; a model changes family through as_family().
        fam = FAMILIES.get(self.family) if isinstance(self.family, str) else None
        if fam is not None and fam.options is not None and self.options is None:
            self.options = fam.options()

    def as_family(self, name: str, options: Any = None) -> ModelConfig:
        """A copy of this model as family `name` with `options` (None: that family's
        defaults); every shared field, resolved sizes included, is kept."""
        return dataclasses.replace(self, family=name, options=options)

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
                f"model.{name} holds the options of family {name!r}; this model is {quoted(family)}"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def head_dim(self) -> int:
        return self.attention_head_dim or self.d_model // self.n_heads

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

    def build_block(self, layer: int, rotary: Any) -> Any:
        """Layer `layer`'s torch block, built by this model's family (`Family.build_block`): the
        config hands its family's block factory to `TaperedLM`, so the torch model imports no
        family (`taperlm.spec.model_fields.ModelSpec`)."""
        return get_family(self.family).build_block(self, layer, rotary)

    def memory_floor(self) -> tuple[int, str]:
        """(bytes, what they are) the built model's fp32 weights and RoPE tables need at least
        on one device (`taperlm.config.budget.memory_floor`), checked by `TaperedLM` before it
        allocates."""
        return memory_floor(self)

    def head_taper_spec(self) -> TaperSpec:
        """`head_taper` with steps of one KV group (TaperError or ConfigError if it is no spec)."""
        return dataclasses.replace(self._spec("head_taper"), multiple_of=self.group_size)

    def kv_taper_spec(self) -> TaperSpec:
        """`kv_taper` in steps of one KV head (TaperError or ConfigError if it is no spec)."""
        spec = self._spec("kv_taper")
        return spec if spec.multiple_of == 1 else dataclasses.replace(spec, multiple_of=1)

    def _spec(self, key: str) -> TaperSpec:
        """The spec of `model.key`; TaperError for a text that does not parse (kept as given)."""
        spec = getattr(self, key)
        if isinstance(spec, str):
            return _head_spec(spec)
        if not isinstance(spec, TaperSpec):
            raise ConfigError(f"model.{key} must be a string, got {quoted(spec)}")
        return spec

    def __setattr__(self, name: str, value: Any) -> None:
        # Assigning a field makes the config unresolved again: its sizes and checks were of the
        # old value (a copy by dataclasses.replace or from_dict starts unresolved, too).
        self.__dict__.pop("_resolved", None)
        if name in ("head_taper", "kv_taper"):
            value = text_spec(value)
        super().__setattr__(name, value)

    def _sizes(self) -> tuple:
        """The resolved per-layer sizes, the family's included (a copy: resolve() compares)."""
        options = None if self.options is None else dataclasses.astuple(self.options)
        return (self.mlp_widths, self.layer_heads, self.layer_kv_heads, options)

    @property
    def resolved(self) -> bool:
        """Whether `resolve()` wrote and checked this config and no field was assigned since;
        commands hand such a config on, and `TaperedLM` and the trainer use it as is. Values
        edited in place (`cfg.mlp_widths[0] += 16`) are not noticed: edit a copy
        (`dataclasses.replace`) or the config's dict form instead."""
        return self.__dict__.get("_resolved", False)

    def solve_kv_heads(self) -> KVHeads:
        """The KV taper solved against this config's query heads (counts, asked, notes)."""
        q = [self.attention_heads(i)[0] for i in range(self.n_layers)]
        step = kv_step(self.d_model, self.head_dim, self.taper.multiple_of)
        return solve_kv_heads(self.kv_taper_spec(), q, self.group_size, step)

    def validate(self) -> None:
        """Check shapes and options; raise ConfigError naming the key and the fix."""
        fam = get_family(self.family)
        check_domains(self, "model")
        check_taper_spec(self.taper, "model.taper")
        if fam.options is not None and isinstance(self.options, fam.options):
            check_domains(self.options, f"model.{self.family}")
        if self.d_model % self.n_heads and self.attention_head_dim is None:
            raise ConfigError(
                f"model.d_model ({self.d_model}) must be divisible by model.n_heads ({self.n_heads})"
            )
        if self.head_dim % 2:
            what = "model.attention_head_dim" if self.attention_head_dim else "d_model/n_heads"
            raise ConfigError(f"head dim {what} = {self.head_dim} must be even for RoPE")
        self._validate_attention_options(fam)
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

    def _validate_attention_options(self, fam: Any) -> None:
        """The Transformer++ attention options (RoPE scaling, biases, q/k norm, an explicit head
        dim: what imported checkpoints carry) are set only on a transformer model; biases
        with a KV taper are refused (its budget trades K/V weights, not their biases)."""
        if self.rope_scaling is not None:
            if not isinstance(self.rope_scaling, RopeScaling):
                raise ConfigError(
                    f"model.rope_scaling must be a mapping (type, factor, ...), got "
                    f"{quoted(self.rope_scaling)}"
                )
            self.rope_scaling.validate("model.rope_scaling")
        set_ = [
            name
            for name, value in (
                ("rope_scaling", self.rope_scaling),
                ("attention_bias", self.attention_bias != "none"),
                ("qk_norm", self.qk_norm),
                ("attention_head_dim", self.attention_head_dim),
            )
            if value
        ]
        if set_ and self.family != "transformer":
            raise ConfigError(
                f"model.{set_[0]} is an option of the transformer family's attention; the "
                f"{self.family} family does not have it: leave it at its default"
            )
        if self.attention_bias != "none" and self.layer_kv_heads is not None:
            raise ConfigError(
                "model.attention_bias with a KV taper: the taper's budget trades K/V weight "
                "rows, not their biases; use kv_taper: uniform"
            )

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
        validate, and return self, marked `resolved`. Every command resolves its config once,
        in the assembly (`taperlm.config.assembly`); a resolved config is returned as is."""
        if self.resolved:
            return self
        self.validate()
        before = self._sizes()
        heads = self.head_taper_spec()
        if self.layer_heads is None and not heads.is_uniform:
            try:
                self.layer_heads = solve_sizes(
                    heads, self.n_layers, self.n_heads, what="query head count"
                )
            except TaperError as err:
                raise ConfigError(
                    f"model.head_taper {self.head_taper.as_text()!r}: {err}"
                ) from None
        if self.layer_kv_heads is None and not self.kv_taper_spec().is_uniform:
            try:
                self.layer_kv_heads = self.solve_kv_heads().counts
            except TaperError as err:
                raise ConfigError(f"model.kv_taper {self.kv_taper.as_text()!r}: {err}") from None
        if self.mlp_widths is None:
            total = self.n_layers * self.mlp_width + mlp_width_credit(self)
            try:
                self.mlp_widths = solve_sizes(
                    self.taper, self.n_layers, self.mlp_width, total=total, zero_ok=True
                )
            except TaperError as err:
                if not mlp_width_credit(self):
                    raise
                raise TaperError(
                    f"{err} (the MLP widths take up the {mlp_width_credit(self):+d} units of "
                    f"width the KV taper {self.kv_taper.as_text()!r} frees)"
                ) from None
        get_family(self.family).resolve(self)
        if self._sizes() != before:  # check the sizes written
            self.validate()
        self.__dict__["_resolved"] = True
        return self

    def with_taper(
        self,
        taper: TaperSpec,
        head_taper: str | TaperSpec | None = None,
        kv_taper: str | TaperSpec | None = None,
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
