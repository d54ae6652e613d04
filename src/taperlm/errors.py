"""Error types. Every user-facing failure is a TaperlmError with a message that says what was
wrong and what to do; the CLI prints it without a traceback."""

from __future__ import annotations

MAX_MESSAGE_CHARS = 8000  # far above any message taperlm writes (the longest list valid keys)


def shown(err: BaseException) -> str:
    """The text of an error as the CLI prints it: at most MAX_MESSAGE_CHARS characters. A
    message may quote what a file holds (a key, a name, a value); a crafted file must not make
    it print megabytes."""
    text = str(err)
    if len(text) <= MAX_MESSAGE_CHARS:
        return text
    return f"{text[:MAX_MESSAGE_CHARS]}... ({len(text) - MAX_MESSAGE_CHARS:,} more characters)"


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
