"""A run's checkpoints on disk, one concern per module:

- `store`: a checkpoint directory (layout, atomic commit, manifest, verification, lookup,
  pruning, reading);
- `dcp`: the tensors inside it, as `torch.distributed.checkpoint` shards (model, optimizer,
  pending gradients), written and read by every rank;
- `safe_load`: reading DCP files without running code from them (an unpickling allow-list).

Training writes checkpoints (`taperlm.training.checkpointer`, the trainer's collective saver);
eval, generate, export and distillation read them (`taperlm.checkpoint.loading`): the format is a room of
its own, below both. Import the submodules directly; nothing is imported here."""
