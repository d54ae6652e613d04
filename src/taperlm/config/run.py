"""A whole run's config: `RunConfig` (model, data, train), and the settings a resumed run may change."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from taperlm.config.model import ModelConfig
from taperlm.config.train import DataConfig, TrainConfig
from taperlm.spec.domains import check_domains


@dataclass
class RunConfig:
    """Everything a run needs: the model, the data and the training loop."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """the model: family, shape, and the tapers that set its per-layer sizes."""
    data: DataConfig = field(default_factory=DataConfig)
    """where the training tokens come from."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """the training loop: budget, batch, optimizer, schedule, checkpoints, logging."""

    def validate(self) -> None:
        """Every section's declared domains (the model's own checks included; a resolved model
        was checked by its resolve())."""
        if not self.model.resolved:
            self.model.validate()
        check_domains(self.data, "data")
        check_domains(self.train, "train")

    def resolve(self) -> RunConfig:
        """The model resolved (`ModelConfig.resolve`), the other sections checked; self."""
        self.model.resolve()
        check_domains(self.data, "data")
        check_domains(self.train, "train")
        return self


def runtime_keys() -> frozenset[str]:
    """The dotted keys (`train.log_every`, `data.dir`, ...) a run may change between its start
    and its resumption: the fields declared with `runtime=True` metadata."""
    keys = set()
    for section in dataclasses.fields(RunConfig):
        for f in dataclasses.fields(section.default_factory):
            if f.metadata.get("runtime"):
                keys.add(f"{section.name}.{f.name}")
    return frozenset(keys)


RUNTIME_KEYS = runtime_keys()
