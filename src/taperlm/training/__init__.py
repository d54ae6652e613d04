"""Training: the trainer (`loop.train`), checkpoints (`checkpoint.load_run_model`), optimizer and
LR schedule, distributed wrapping, metrics and plots. Import the submodules directly; nothing
heavy is imported here."""
