"""A run's checkpoints on disk, one concern per module:

- `store`: a checkpoint directory (layout, atomic commit, manifest, verification, lookup,
  pruning, reading);
- `dcp`: the tensors inside it, as `torch.distributed.checkpoint` shards (model, optimizer,
  pending gradients), written and read by every rank;
- `safe_load`: reading DCP files without running code from them (an unpickling allow-list);
- `loading`: the one loader of runs, checkpoints and exports back into a model (eval, generate,
  export, novelty, distillation and resume read through it).

Training writes checkpoints (`taperlm.training.checkpointer`, the trainer's collective saver)
and reads its teacher and start weights through `loading`: the room sits below training.
Import the submodules directly; nothing is imported here."""
