"""Layer-wise novelty (the paper's mechanism analysis), measured through forward hooks only (no model edits).

For block l with input h_l, mixer output z_l = h_l + M_l(h_l) and output
h_{l+1} = z_l + F_l(z_l):

    rho_block(l) = cos(h_{l+1} - h_l, h_l)   the block's write vs the residual entering it
    rho_mlp(l)   = cos(F_l(z_l), h_l)        the MLP's write vs the residual entering the block

rho ~ 0: the layer writes new directions; rho > 0: it reinforces what is already there.

Aggregation (the paper says only "averaged over tokens"; these are our choices):
1. one cosine per token, computed in fp32 from the hooked tensors (whatever the model's dtype);
2. tokens come from windows of the model's context (or `seq_len`), each window a separate
   sequence starting at its own position 0; padding (attention_mask == 0) is excluded;
3. the first token of every window is excluded by default (`skip_first=True`): it attends only
   to itself, so its mixer sees no context, and in trained models it becomes an attention sink
   with atypically large activations — it is not "a token in context";
4. per layer: mean over tokens (the paper's number), sample std, median, 10th/90th percentiles;
5. Pearson correlation of the per-layer means with the layer index, for both rhos.

Layer discovery: our TaperedLM (`model.blocks`), GPT-2 (`transformer.h`), Llama-style
(`model.layers`), GPT-NeoX (`gpt_neox.layers`), else any ModuleList whose every element has an
MLP child named `mlp`, `feed_forward` or `ffn` (the longest such list). The MLP module must
return exactly the update added to the residual stream (true for pre-norm blocks such as GPT-2,
Llama and ours; not for blocks that normalise the MLP output before adding it, e.g. Gemma-2).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from taperlm.analysis.novelty_record import LayerNovelty, NoveltyRecord, RhoStats
from taperlm.analysis.stats import pearson
from taperlm.errors import ConfigError
from taperlm.runtime.progress import progress_bar

MLP_NAMES: tuple[str, ...] = ("mlp", "feed_forward", "ffn")
KNOWN_LAYER_PATHS: tuple[str, ...] = ("blocks", "transformer.h", "model.layers", "gpt_neox.layers")

AGGREGATION = (
    "per-token cosine in fp32, then mean over tokens (std = sample std, median, p10/p90 over "
    "tokens); windows of seq_len tokens, each its own sequence; padding excluded; "
    "first token of each window {first}"
)


class LayerDiscoveryError(ConfigError):
    """The decoder layers or their MLPs could not be located in a model."""


@dataclass
class TokenStats:
    """Distribution over tokens of one layer's per-token cosine."""

    mean: float
    std: float
    median: float
    p10: float
    p90: float
    n: int

    @classmethod
    def of(cls, values: np.ndarray) -> TokenStats:
        v = np.asarray(values, dtype=np.float64)
        if v.size == 0:
            nan = float("nan")
            return cls(nan, nan, nan, nan, nan, 0)
        p10, median, p90 = np.percentile(v, [10, 50, 90])
        std = float(v.std(ddof=1)) if v.size > 1 else 0.0
        return cls(float(v.mean()), std, float(median), float(p10), float(p90), int(v.size))


@dataclass
class NoveltyResult:
    """Per-layer novelty statistics of one model on one token sample."""

    name: str
    rho_block: list[TokenStats]
    rho_mlp: list[TokenStats]
    mlp_widths: list[int | None]
    pearson_block: float
    pearson_mlp: float
    n_tokens: int  # tokens measured per layer (after exclusions)
    n_windows: int
    seq_len: int
    skip_first: bool
    layers_path: str
    mlp_name: str
    aggregation: str = ""
    # {"rho_block": [L, N], "rho_mlp": [L, N]} per-token values, kept only on request.
    per_token: dict[str, np.ndarray] | None = field(default=None, repr=False)

    @property
    def n_layers(self) -> int:
        return len(self.rho_block)

    def means(self, key: str) -> list[float]:
        """Per-layer means of "rho_block" or "rho_mlp"."""
        return [s.mean for s in getattr(self, key)]

    def with_layers(
        self, rho_block: list[TokenStats], rho_mlp: list[TokenStats], **changes: Any
    ) -> NoveltyResult:
        """This result with other per-layer statistics (e.g. averaged over seeds), their depth
        correlations recomputed, and no per-token values."""
        return dataclasses.replace(
            self,
            rho_block=rho_block,
            rho_mlp=rho_mlp,
            pearson_block=depth_correlation(rho_block),
            pearson_mlp=depth_correlation(rho_mlp),
            per_token=None,
            **changes,
        )

    def record(self) -> NoveltyRecord:
        """The stored form (`taperlm.analysis.novelty_record`; per-token values are not in it,
        a value that is not finite is None)."""
        return NoveltyRecord(
            name=self.name,
            n_layers=self.n_layers,
            n_tokens=self.n_tokens,
            n_windows=self.n_windows,
            seq_len=self.seq_len,
            skip_first=self.skip_first,
            pearson_block=_finite(self.pearson_block),
            pearson_mlp=_finite(self.pearson_mlp),
            layers=[
                LayerNovelty(i, self.mlp_widths[i], _rho(b), _rho(m))
                for i, (b, m) in enumerate(zip(self.rho_block, self.rho_mlp))
            ],
            layers_path=self.layers_path,
            mlp_name=self.mlp_name,
            aggregation=self.aggregation,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (per-token values are not included)."""
        return self.record().to_json()

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NoveltyResult:
        rec = NoveltyRecord.from_json(d)

        def stats(x: RhoStats) -> TokenStats:
            values = {f.name: getattr(x, f.name) for f in dataclasses.fields(x)}
            return TokenStats(**{k: float("nan") if v is None else v for k, v in values.items()})

        return cls(
            name=rec.name,
            rho_block=[stats(x.rho_block) for x in rec.layers],
            rho_mlp=[stats(x.rho_mlp) for x in rec.layers],
            mlp_widths=[x.mlp_width for x in rec.layers],
            pearson_block=_nan_if_none(rec.pearson_block),
            pearson_mlp=_nan_if_none(rec.pearson_mlp),
            n_tokens=rec.n_tokens,
            n_windows=rec.n_windows,
            seq_len=rec.seq_len,
            skip_first=rec.skip_first,
            layers_path=rec.layers_path or "",
            mlp_name=rec.mlp_name or "",
            aggregation=rec.aggregation or "",
        )


def depth_correlation(layers: Sequence[TokenStats]) -> float:
    """Pearson correlation of the per-layer means with the layer index (nan if undefined)."""
    return pearson(list(range(len(layers))), [s.mean for s in layers])


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _rho(s: TokenStats) -> RhoStats:
    return RhoStats(_finite(s.mean), _finite(s.std), _finite(s.median), _finite(s.p10),
                    _finite(s.p90), s.n)  # fmt: skip


def _nan_if_none(x: float | None) -> float:
    return float("nan") if x is None else float(x)


# ---------------------------------------------------------------------------- layer discovery


@dataclass
class LayerHandles:
    path: str
    layers: list[nn.Module]
    mlps: list[nn.Module]
    mlp_name: str


def _mlp_child(layer: nn.Module, names: Sequence[str]) -> str | None:
    for n in names:
        if isinstance(getattr(layer, n, None), nn.Module):
            return n
    return None


def _as_handles(path: str, mod: nn.Module, names: Sequence[str]) -> LayerHandles | None:
    if not isinstance(mod, nn.ModuleList) or len(mod) == 0:
        return None
    found = [_mlp_child(layer, names) for layer in mod]
    if any(f is None for f in found) or len(set(found)) != 1:
        return None
    name = found[0]
    assert name is not None
    return LayerHandles(path, list(mod), [getattr(layer, name) for layer in mod], name)


def find_layers(
    model: nn.Module, layers_path: str | None = None, mlp_name: str | None = None
) -> LayerHandles:
    """Locate the decoder layers and each layer's MLP (see the module docstring)."""
    names = (mlp_name,) if mlp_name else MLP_NAMES
    if layers_path is not None:
        try:
            mod = model.get_submodule(layers_path)
        except AttributeError as err:
            raise LayerDiscoveryError(
                f"{type(model).__name__} has no submodule {layers_path!r}: {err}"
            ) from None
        handles = _as_handles(layers_path, mod, names)
        if handles is None:
            raise LayerDiscoveryError(
                f"{layers_path!r} in {type(model).__name__} is not a non-empty ModuleList whose "
                f"every layer has an MLP child named one of {', '.join(names)}"
            )
        return handles
    for path in KNOWN_LAYER_PATHS:
        try:
            mod = model.get_submodule(path)
        except AttributeError:
            continue
        handles = _as_handles(path, mod, names)
        if handles is not None:
            return handles
    candidates = [
        h for p, m in model.named_modules() if (h := _as_handles(p, m, names)) is not None
    ]
    if candidates:
        return max(candidates, key=lambda h: (len(h.layers), -len(h.path)))
    lists = [
        f"{p} ({len(m)} x {type(m[0]).__name__})"
        for p, m in model.named_modules()
        if isinstance(m, nn.ModuleList) and len(m)
    ]
    raise LayerDiscoveryError(
        f"cannot find the decoder layers of {type(model).__name__}: looked for a ModuleList "
        f"whose every layer has an MLP child named {', '.join(names)} (found ModuleLists: "
        f"{', '.join(lists) or 'none'}); name them explicitly with layers_path= / mlp_name= "
        "(CLI: --layers PATH --mlp NAME)"
    )


def mlp_width(mlp: nn.Module) -> int | None:
    """The MLP's intermediate width, when it can be read from a known attribute."""
    for attr in ("width", "intermediate_size"):
        v = getattr(mlp, attr, None)
        if isinstance(v, int):
            return v
    for child, attr in (
        ("up_proj", "out_features"),
        ("c_fc", "nf"),  # GPT-2 Conv1D
        ("fc1", "out_features"),
        ("dense_h_to_4h", "out_features"),
        ("w1", "out_features"),
    ):
        v = getattr(getattr(mlp, child, None), attr, None)
        if isinstance(v, int):
            return v
    levels = getattr(mlp, "levels", None)  # Hope's continuum memory: a chain of level MLPs
    if isinstance(levels, nn.ModuleList) and len(levels):
        widths = [mlp_width(m) for m in levels]
        if all(w is not None for w in widths):
            return sum(w for w in widths if w is not None)
    return None


# ---------------------------------------------------------------------------- measurement


class _StopForward(Exception):
    """Raised by the last layer hook: nothing after the decoder layers is needed."""


def _first_tensor(x: Any) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (tuple, list)) and x and isinstance(x[0], torch.Tensor):
        return x[0]
    if hasattr(x, "__getitem__"):  # transformers ModelOutput
        first = x[0]
        if isinstance(first, torch.Tensor):
            return first
    raise TypeError(f"cannot find the hidden states in a {type(x).__name__} layer output")


def _layer_input(args: tuple, kwargs: dict) -> torch.Tensor:
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    x = kwargs.get("hidden_states", kwargs.get("x"))
    if isinstance(x, torch.Tensor):
        return x
    raise TypeError("cannot find the hidden states among the layer's inputs")


def _windows(
    token_ids: Any, seq_len: int, attention_mask: Any
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(ids [T], mask [T]) per window: 1-D ids are cut into windows of seq_len (the last one
    may be shorter); 2-D ids are taken as given windows with their attention mask."""
    ids = torch.as_tensor(token_ids, dtype=torch.long)
    if ids.dim() == 1:
        if attention_mask is not None:
            raise ValueError("attention_mask is only accepted with 2-D token_ids [B, T]")
        return [(w, torch.ones_like(w, dtype=torch.bool)) for w in ids.split(seq_len) if w.numel()]
    if ids.dim() != 2:
        raise ValueError(f"token_ids must be 1-D or 2-D, got shape {tuple(ids.shape)}")
    if attention_mask is None:
        mask = torch.ones_like(ids, dtype=torch.bool)
    else:
        mask = torch.as_tensor(attention_mask).bool()
        if mask.shape != ids.shape:
            raise ValueError(f"attention_mask {tuple(mask.shape)} != token_ids {tuple(ids.shape)}")
    return list(zip(ids.unbind(0), mask.unbind(0)))


def _forward_fn(model: nn.Module):
    """How to call the model: HF-style keywords when forward takes input_ids, else positional."""
    params = inspect.signature(model.forward).parameters
    if "input_ids" in params:
        takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())

        def call(ids: torch.Tensor, mask: torch.Tensor, padded: bool) -> Any:
            kw: dict[str, Any] = {"input_ids": ids}
            if "attention_mask" in params:
                kw["attention_mask"] = mask.long()
            if "use_cache" in params or takes_kwargs:
                kw["use_cache"] = False
            return model(**kw)

        return call

    def call_plain(ids: torch.Tensor, mask: torch.Tensor, padded: bool) -> Any:
        if padded and not bool((mask.long().cummin(dim=1).values == mask.long()).all()):
            raise ValueError(
                f"{type(model).__name__} takes no attention mask: only right padding can be "
                "excluded exactly (a causal model's real tokens never see right padding)"
            )
        return model(ids)

    return call_plain


def _unwrap(model: nn.Module) -> nn.Module:
    """The plain module behind torch.compile / DDP wrappers (hooks must sit on the real layers,
    and a compiled graph would not call them)."""
    while True:
        if isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod  # type: ignore[assignment]
        elif isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        else:
            return model


def _context_length(model: nn.Module) -> int | None:
    cfg = getattr(model, "config", None)
    for attr in ("context_length", "n_positions", "max_position_embeddings", "n_ctx"):
        v = getattr(cfg, attr, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


@torch.no_grad()
def measure(
    model: nn.Module,
    token_ids: Any,
    *,
    seq_len: int | None = None,
    batch_size: int = 4,
    attention_mask: Any = None,
    skip_first: bool = True,
    layers_path: str | None = None,
    mlp_name: str | None = None,
    name: str = "model",
    keep_per_token: bool = False,
    progress: bool = False,
) -> NoveltyResult:
    """Layer-wise novelty of `model` on `token_ids`.

    token_ids: 1-D ids (cut into windows of `seq_len`, default the model's context, each its own
    sequence) or 2-D [B, T] windows with an optional `attention_mask` (0 = padding, excluded).
    The model is put in eval mode for the measurement (dropout off) and restored afterwards.
    """
    model = _unwrap(model)
    handles = find_layers(model, layers_path, mlp_name)
    if seq_len is None:
        ctx = _context_length(model)
        ids_len = torch.as_tensor(token_ids).shape[-1]
        seq_len = min(ctx, ids_len) if ctx else ids_len
    windows = _checked_windows(model, token_ids, seq_len, batch_size, attention_mask)
    recorder = _Recorder(handles)
    was_training = model.training
    model.eval()
    try:
        with recorder.hooked():
            _run_windows(model, recorder, windows, batch_size, skip_first, progress, name)
    finally:
        model.train(was_training)
    per_layer = recorder.per_layer()
    rb = [TokenStats.of(v) for v in per_layer["rho_block"]]
    rm = [TokenStats.of(v) for v in per_layer["rho_mlp"]]
    return NoveltyResult(
        name=name,
        rho_block=rb,
        rho_mlp=rm,
        mlp_widths=[mlp_width(m) for m in handles.mlps],
        pearson_block=depth_correlation(rb),
        pearson_mlp=depth_correlation(rm),
        n_tokens=rb[0].n,
        n_windows=len(windows),
        seq_len=seq_len,
        skip_first=skip_first,
        layers_path=handles.path,
        mlp_name=handles.mlp_name,
        aggregation=AGGREGATION.format(first="excluded" if skip_first else "included"),
        per_token={k: np.stack(v) for k, v in per_layer.items()} if keep_per_token else None,
    )


def _checked_windows(
    model: nn.Module, token_ids: Any, seq_len: int, batch_size: int, attention_mask: Any
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The windows to measure; ValueError for empty input, bad sizes or windows beyond the
    model's context."""
    if seq_len < 1 or batch_size < 1:
        raise ValueError(f"seq_len ({seq_len}) and batch_size ({batch_size}) must be positive")
    windows = _windows(token_ids, seq_len, attention_mask)
    if not windows:
        raise ValueError("no tokens to measure")
    ctx = _context_length(model)
    if ctx and max(w.numel() for w, _ in windows) > ctx:
        raise ValueError(f"windows of {seq_len} tokens exceed the model's context of {ctx}")
    return windows


class _Recorder:
    """Forward hooks on every layer and its MLP: per token of the kept positions, the cosines
    rho_block = cos(out - h, h) and rho_mlp = cos(F, h) with h the layer input (fp32). The
    forward pass stops once the last layer has been measured."""

    def __init__(self, handles: LayerHandles) -> None:
        self.handles = handles
        self.n_layers = len(handles.layers)
        self.values: dict[str, list[list[torch.Tensor]]] = {
            "rho_block": [[] for _ in range(self.n_layers)],
            "rho_mlp": [[] for _ in range(self.n_layers)],
        }
        self.state: dict[Any, Any] = {}

    @contextlib.contextmanager
    def hooked(self):
        hooks = []
        try:
            for i, (layer, mlp) in enumerate(zip(self.handles.layers, self.handles.mlps)):
                hooks.append(layer.register_forward_pre_hook(self._pre_hook(i), with_kwargs=True))
                hooks.append(layer.register_forward_hook(self._post_hook(i), with_kwargs=True))
                hooks.append(mlp.register_forward_hook(self._mlp_hook(i)))
            yield self
        finally:
            for h in hooks:
                h.remove()

    def start(self, keep: torch.Tensor) -> None:
        """Begin a batch whose measured positions are `keep` [B, T]."""
        self.state.clear()
        self.state["keep"] = keep
        self.state["done"] = set()

    def check_complete(self) -> None:
        if len(self.state["done"]) != self.n_layers:
            missing = sorted(set(range(self.n_layers)) - self.state["done"])
            raise LayerDiscoveryError(
                f"layers {missing} of {self.handles.path} did not run during the forward pass"
            )

    def per_layer(self) -> dict[str, list[np.ndarray]]:
        return {
            k: [torch.cat(v).double().numpy() if v else np.empty(0) for v in vs]
            for k, vs in self.values.items()
        }

    def _pre_hook(self, i: int):
        def hook(_m: nn.Module, args: tuple, kwargs: dict) -> None:
            self.state[("in", i)] = _layer_input(args, kwargs)

        return hook

    def _mlp_hook(self, i: int):
        def hook(_m: nn.Module, _args: tuple, output: Any) -> None:
            self.state[("mlp", i)] = _first_tensor(output)

        return hook

    def _post_hook(self, i: int):
        def hook(_m: nn.Module, _args: tuple, _kwargs: dict, output: Any) -> None:
            state = self.state
            h = state.pop(("in", i)).float()
            out = _first_tensor(output).float()
            if ("mlp", i) not in state:
                raise LayerDiscoveryError(
                    f"layer {i} ({self.handles.path}.{i}) ran without calling its "
                    f"{self.handles.mlp_name!r} module; its MLP cannot be measured"
                )
            f = state.pop(("mlp", i)).float().reshape(h.shape)
            keep = state["keep"]
            self.values["rho_block"][i].append(F.cosine_similarity(out - h, h, dim=-1)[keep].cpu())
            self.values["rho_mlp"][i].append(F.cosine_similarity(f, h, dim=-1)[keep].cpu())
            state["done"].add(i)
            if len(state["done"]) == self.n_layers:
                raise _StopForward

        return hook


def _run_windows(
    model: nn.Module,
    recorder: _Recorder,
    windows: list[tuple[torch.Tensor, torch.Tensor]],
    batch_size: int,
    skip_first: bool,
    progress: bool,
    name: str,
) -> None:
    """Forward every batch of windows through the hooked model."""
    device = next(model.parameters()).device
    call = _forward_fn(model)
    bar = _progress(sum(w.numel() for w, _ in windows), progress, name)
    for ids, mask in _batches(windows, batch_size):
        keep = mask.clone()
        if skip_first:
            first = mask.long().argmax(dim=1)  # first real token of each row
            keep[torch.arange(len(keep)), first] = False
        recorder.start(keep.to(device))
        with contextlib.suppress(_StopForward):
            call(ids.to(device), mask.to(device), padded=not bool(mask.all()))
        recorder.check_complete()
        if bar is not None:
            bar.update(ids.numel())
    if bar is not None:
        bar.close()


def _batches(
    windows: list[tuple[torch.Tensor, torch.Tensor]], batch_size: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Stack windows of equal length into batches (a shorter last window runs on its own, so
    1-D input never needs padding)."""
    out = []
    i = 0
    while i < len(windows):
        n = windows[i][0].numel()
        j = i
        while j < len(windows) and j - i < batch_size and windows[j][0].numel() == n:
            j += 1
        out.append(
            (torch.stack([w for w, _ in windows[i:j]]), torch.stack([m for _, m in windows[i:j]]))
        )
        i = j
    return out


def _progress(total: int, enabled: bool, name: str):
    if not enabled:
        return None

    return progress_bar(
        total=total, unit="tok", unit_scale=True, desc=f"novelty {name}", leave=False
    )
