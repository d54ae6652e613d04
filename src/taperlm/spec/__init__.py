"""The torch-free vocabulary a model is described in, below the families and the config:

- `taper`: taper specs and the schedule records (`SCHEDULES`), multipliers, rho_MLP files;
- `solver`: the exact integer width solver;
- `model_fields`: what families, torch blocks and the budget read of a model config
  (`ModelFields`, `ModelSpec`);
- `domains`: the values each setting accepts, and its help/--set advice;
- `ratio_advice`: the MLP-ratio advice from the packaged measurements (`ratio_measurements.json`).

Nothing here imports torch; import the submodules directly."""
