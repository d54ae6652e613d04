"""Error types. Every user-facing failure is a TaperlmError with a message that says what was
wrong and what to do; the CLI prints it without a traceback."""

from __future__ import annotations


class TaperlmError(Exception):
    """Base class for errors the user can fix (bad config, bad file, bad argument)."""


class ConfigError(TaperlmError, ValueError):
    """A configuration value, key or file is invalid."""


class TaperError(ConfigError):
    """A taper specification cannot be resolved to integer widths at the requested budget."""


class DataError(TaperlmError):
    """A corpus, token shard, tokenizer or evaluation file is missing or malformed."""


class CheckpointError(TaperlmError):
    """A checkpoint is missing, corrupt or incompatible with the requested run."""


class TrainingError(TaperlmError):
    """Training cannot continue (e.g. repeated non-finite losses); the last good checkpoint is
    intact."""


class RunInUseError(TaperlmError):
    """Another process is writing this run directory (its lock names the holder)."""


class ResourceError(TaperlmError):
    """A device or the memory a run needs is not there (a missing GPU, an allocation that
    cannot be served)."""


class UnsafeFileError(TaperlmError):
    """A file we were asked to read is not a regular file (a FIFO or device would block or never
    end), lies outside the folder that names it, or is larger than its format can hold. Its
    contents are a stranger's data: we refuse it before reading."""


class MalformedFileError(UnsafeFileError, ValueError):
    """A structured file (JSON, YAML) whose contents cannot be taken as they are: not valid,
    nested deeper than any file taperlm reads, expanding past its bound through YAML aliases, or
    giving a key twice. A ValueError too, so a reader that treats a damaged file of its own as
    absent (a result recomputed, a checkpoint passed over) does so for these."""


class TrainingWarning(UserWarning):
    """Something the user should know that did not stop the work (a checkpoint fallback, a
    failed compile, a logger that could not start); the commands show it as one plain line."""
