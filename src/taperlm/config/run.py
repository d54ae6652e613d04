"""A whole run's config: `RunConfig` (model, data, train)."""

from __future__ import annotations

from dataclasses import dataclass, field

from taperlm.config.model import ModelConfig
from taperlm.config.train import DataConfig, TrainConfig
from taperlm.domains import check_domains


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
