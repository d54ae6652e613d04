"""Checkpoints, one concern per module:

- `store`: a checkpoint directory on disk (layout, atomic commit, manifest, verification,
  lookup, pruning, reading);
- `dcp`: the tensors inside it, as `torch.distributed.checkpoint` shards (model, optimizer,
  pending gradients), written and read by every rank;
- `safe_load`: reading DCP files without running code from them (an unpickling allow-list);
- `checkpointer`: the trainer's side: its collective saver (synchronous or in the background),
  the restore into a live run, and the random number generators both carry.

Import the submodules directly; nothing is imported here."""
