"""Compressing a trained model: width pruning to a tapered shape (`prune`) by measured unit
importance (`importance`); healing is distillation in the trainer (`train.distill_from`).

The closed sets of `taperlm prune`'s options are declared here, torch-free, so that the command's
--help and the pruning code read one declaration."""

from typing import Literal

Score = Literal["act", "flap", "weight_act"]  # a unit's importance (importance.unit_scores)
ParamsOf = Literal["total", "non-embedding"]  # what a pruning target's size counts (prune)
