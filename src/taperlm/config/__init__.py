"""Typed configuration: model, data, training and the run that holds them; YAML load/save,
`--set key=value` overrides, and validation with specific errors (no torch import).

- `model`: `ModelConfig` (per-layer sizes resolved from the tapers, validated once in `resolve()`);
- `train`: `DataConfig`, `TrainConfig`; `run`: `RunConfig` and the settings a resumed run may change;
- `convert`: dict <-> dataclass; `loading`: YAML files; `overrides`: `--set` and $TAPERLM_SET;
- `kv_taper`: per-layer KV heads (the KV taper, solved at the MLP budget);
- `budget`: parameters, FLOPs, KV cache and memory per layer, and the plan table (read from a
  model config through `taperlm.spec.model_fields.ModelSpec`, never from `model`);
- `presets`: named presets; `assembly`: the one assembly of a run config from its layers
  (defaults, preset, recipe, file, options, `--set`, environment). These two read the typed
  config above and are never imported by it (nor by this `__init__`): import them directly.

Configs written by taperlm 0.1, which carried every family's section, still load.
"""

from taperlm.config.convert import (
    config_differences,
    config_keys,
    format_differences,
    from_dict,
    from_dict_plain,
    section_of,
    to_dict,
)
from taperlm.config.loading import (
    dump_yaml,
    file_notes,
    load_run_config,
    load_yaml,
    run_config_from_dict,
    save_yaml,
    strict_yaml_load,
)
from taperlm.config.model import ModelConfig
from taperlm.config.overrides import (
    OVERRIDES_ENV,
    apply_overrides,
    clear_resolved_sizes,
    env_overrides,
    parse_override,
)
from taperlm.config.run import RUNTIME_KEYS, RunConfig, runtime_keys
from taperlm.config.train import DataConfig, TrainConfig
from taperlm.errors import ConfigError
from taperlm.files.io import DuplicateKeyError, StrictLoader

__all__ = [
    "OVERRIDES_ENV",
    "RUNTIME_KEYS",
    "ConfigError",
    "DataConfig",
    "DuplicateKeyError",
    "ModelConfig",
    "RunConfig",
    "StrictLoader",
    "TrainConfig",
    "apply_overrides",
    "clear_resolved_sizes",
    "config_differences",
    "config_keys",
    "dump_yaml",
    "env_overrides",
    "file_notes",
    "format_differences",
    "from_dict",
    "from_dict_plain",
    "load_run_config",
    "load_yaml",
    "parse_override",
    "run_config_from_dict",
    "runtime_keys",
    "save_yaml",
    "section_of",
    "strict_yaml_load",
    "to_dict",
]
