"""Compressing a trained model: width pruning to a tapered shape (`prune`) by measured unit
importance (`importance`); healing is distillation in the trainer (`train.distill_from`)."""
