"""Training: the trainer (`loop.train`), checkpoints (`checkpoint/`), optimizer and LR schedule,
distributed wrapping, metrics and plots; loading a trained model for inference is
`taperlm.loading`'s. Import the submodules directly; nothing heavy is imported here."""
