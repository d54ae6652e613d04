"""The stored form of a layer-wise novelty measurement (`taperlm.analysis.novelty`): the JSON
`taperlm novelty` writes and a compare cell's result.json holds under `novelty`, as typed
records. The one place that layout is spelled: `NoveltyResult.to_dict`/`from_dict` go through
`NoveltyRecord`, and reading a result needs no torch (the measurement's module does)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class RhoStats:
    """One layer's per-token cosine over the tokens measured (`TokenStats`; None: not finite)."""

    mean: float | None
    std: float | None
    median: float | None
    p10: float | None
    p90: float | None
    n: int

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RhoStats:
        return cls(**{f.name: data[f.name] for f in fields(cls)})


@dataclass(frozen=True)
class LayerNovelty:
    """One layer of a cell's novelty."""

    layer: int  # its index
    mlp_width: int | None  # its MLP width
    rho_block: RhoStats  # the block's cosine (input vs output)
    rho_mlp: RhoStats  # the MLP's

    def to_json(self) -> dict[str, Any]:
        return {
            "layer": self.layer,
            "mlp_width": self.mlp_width,
            "rho_block": self.rho_block.to_json(),
            "rho_mlp": self.rho_mlp.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LayerNovelty:
        return cls(
            data["layer"],
            data.get("mlp_width"),
            RhoStats.from_json(data["rho_block"]),
            RhoStats.from_json(data["rho_mlp"]),
        )


@dataclass(frozen=True)
class NoveltyRecord:
    """One model's layer-wise novelty as stored: `taperlm novelty`'s JSON and a compare cell's
    result.json `novelty` (`NoveltyResult.to_dict` writes through it)."""

    name: str  # the model measured
    n_layers: int
    n_tokens: int  # tokens measured per layer
    n_windows: int
    seq_len: int
    skip_first: bool
    pearson_block: float | None  # r(rho_block, depth) (None: undefined)
    pearson_mlp: float | None  # r(rho_mlp, depth)
    layers: list[LayerNovelty]
    # recorded since they were added (None: the result is older and lacks the key)
    layers_path: str | None = None
    mlp_name: str | None = None
    aggregation: str | None = None

    def rho_means(self, key: str) -> list[float | None]:
        """Per layer, the mean of "rho_block" or "rho_mlp"."""
        return [getattr(x, key).mean for x in self.layers]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "n_layers": self.n_layers,
            "n_tokens": self.n_tokens,
            "n_windows": self.n_windows,
            "seq_len": self.seq_len,
            "skip_first": self.skip_first,
            "layers_path": self.layers_path,
            "mlp_name": self.mlp_name,
            "aggregation": self.aggregation,
            "pearson_block": self.pearson_block,
            "pearson_mlp": self.pearson_mlp,
            "layers": [x.to_json() for x in self.layers],
        }
        return {k: v for k, v in out.items() if v is not None or k.startswith("pearson")}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NoveltyRecord:
        return cls(
            name=data["name"],
            n_layers=data["n_layers"],
            n_tokens=data["n_tokens"],
            n_windows=data["n_windows"],
            seq_len=data["seq_len"],
            skip_first=data["skip_first"],
            pearson_block=data["pearson_block"],
            pearson_mlp=data["pearson_mlp"],
            layers=[LayerNovelty.from_json(x) for x in data["layers"]],
            layers_path=data.get("layers_path"),
            mlp_name=data.get("mlp_name"),
            aggregation=data.get("aggregation"),
        )
