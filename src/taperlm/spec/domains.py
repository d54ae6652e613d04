"""The values each setting accepts, declared once beside it (pure Python; no torch).

A config field declares its domain with `setting`, and a numeric command-line option with
`number` (`count` for whole numbers that may be written 30e9):

    Precision = Literal["auto", "fp32", "bf16"]
    beta2: float = setting(0.95, "[0, 1)")
    precision: Precision = setting("auto", Precision)
    dir: str = setting("", "text")
    parser.add_argument("--batch-size", type=number(int, "[1, inf)"), default=16)
    parser.add_argument("--parallel", choices=choices(Parallel))

The domain language:

* an interval `[lo, hi]`, `(lo, hi)`, `[lo, hi)`, ... with `inf` for no bound: a number inside
  it (NaN never is; +-inf only through a closed `inf]` / `[-inf` end);
* a closed set of strings: a `Literal[...]` type, declared once and used as the field's type,
  its domain (`setting(default, Precision)`) and a command-line option's `choices`
  (`choices(Precision)`), so the three cannot drift apart; or `Domain.choice_of(callable)` when
  the set is a registry that can grow (model families, taper schedules). (`{a, b, c}` is the same
  set written as text, which `Domain.parse` still reads);
* `text`: any string (checked by its own parser, e.g. a taper spec or a path).

A list field's domain applies to each element (nested lists too); None passes where the field's
type allows it. `check_domains` walks a config dataclass, `check_arguments` the parsed options of
a command; both raise ConfigError `KEY must be in DOMAIN, got VALUE` before anything is written.
Checks that relate several fields (seq_len <= context_length, ...) stay in the validate functions.
tests/config/test_domains.py finds every numeric or string field of every config section and every
numeric option of every command by introspection and fails on one without a domain.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from taperlm.errors import ConfigError
from taperlm.files.io import not_a_file, quoted
from taperlm.files.outdirs import OUTPUT_FOLDERS, check_folder
from taperlm.files.outfiles import FORCE_TO_REPLACE, OUTPUT_FILES, check_output_file

DOMAIN_KEY = "domain"  # the dataclasses.field metadata key
MAX_SEED = 2**32 - 1  # seeds of every RNG taperlm seeds (numpy's legacy seed is 32-bit)

# The upper ends of every size, depth and count: far beyond what a real model or run reaches
# (published dense models: ~130 layers, d_model ~25k, vocabularies ~256k, 10M-token contexts,
# 36T training tokens), so a slip (an extra zero, 1e8 for 1e3) fails at once with its domain
# instead of allocating for minutes, and no count overflows an int64 or a float's exact range.
MAX_LAYERS = 1024
MAX_WIDTH = 2**20  # d_model, MLP widths (per layer too), head dims, rounding multiples
MAX_HEADS = 2**14  # attention and memory heads
MAX_VOCAB = 2**24
MAX_CONTEXT = 2**24  # context length, sequence length, windows, segments, generated tokens
MAX_BATCH = 2**20  # sequences in one forward pass
MAX_TOKENS = 10**15  # token budgets and token counts
MAX_COUNT = 2**53  # steps, examples, characters, ...: exact as a float, inside int64
MAX_DEPTH = 64  # small structural counts: memory MLP depth and expansion, Hope levels
MAX_WORKERS = 4096  # processes or threads of one command


def up_to(cap: int, lo: int = 1) -> str:
    """The domain `[lo, cap]` of a size or count (`setting(24, up_to(MAX_LAYERS))`)."""
    return f"[{lo}, {cap}]"


@dataclass(frozen=True)
class Domain:
    """One declared domain (see the module docstring for the spec language)."""

    spec: str
    lo: float = -math.inf
    hi: float = math.inf
    lo_closed: bool = False
    hi_closed: bool = False
    choices: tuple[str, ...] | Callable[[], Iterable[str]] | None = None
    text: bool = False

    @classmethod
    def parse(cls, spec: str) -> Domain:
        s = spec.strip()
        if s == "text":
            return cls(spec=s, text=True)
        if s.startswith("{") and s.endswith("}"):
            items = tuple(x.strip() for x in s[1:-1].split(",") if x.strip())
            if not items:
                raise ValueError(f"domain {spec!r} has no choices")
            return cls(spec=s, choices=items)
        if len(s) >= 5 and s[0] in "[(" and s[-1] in "])" and "," in s:
            lo_text, hi_text = (x.strip() for x in s[1:-1].split(",", 1))
            lo, hi = float(lo_text), float(hi_text)
            if not lo <= hi or math.isnan(lo) or math.isnan(hi):
                raise ValueError(f"domain {spec!r}: empty interval")
            return cls(spec=s, lo=lo, hi=hi, lo_closed=s[0] == "[", hi_closed=s[-1] == "]")
        raise ValueError(
            f"domain {spec!r}: expected an interval like [0, 1), a set like {{a, b}}, or text"
        )

    @classmethod
    def choice_of(cls, names: Callable[[], Iterable[str]], label: str) -> Domain:
        """Choices read when checked (a registry that may grow), e.g. the model families."""
        return cls(spec=label, choices=names)

    @property
    def numeric(self) -> bool:
        return self.choices is None and not self.text

    def allowed(self) -> tuple[str, ...]:
        c = self.choices
        return tuple(c() if callable(c) else c or ())

    def contains(self, value: Any) -> bool:
        """Whether one (non-list) value is inside."""
        if self.text:
            return isinstance(value, str)
        if self.choices is not None:
            return isinstance(value, str) and value in self.allowed()
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if math.isnan(value):
            return False
        above = value > self.lo or (self.lo_closed and value == self.lo)
        below = value < self.hi or (self.hi_closed and value == self.hi)
        return above and below

    def describe(self, value: Any = None) -> str:
        """The allowed range as the error messages name it: `>= 1`, `> 0`, `in [0, 1)`,
        `one of auto, fp32, bf16`; for a whole number outside a size's range, the end it
        passed (`<= 1024`), which reads plainer than the interval."""
        if isinstance(value, int) and not isinstance(value, bool) and self.numeric:
            if value > self.hi or (value == self.hi and not self.hi_closed):
                return f"{'<=' if self.hi_closed else '<'} {_num(self.hi)}"
            if value < self.lo or (value == self.lo and not self.lo_closed):
                return f"{'>=' if self.lo_closed else '>'} {_num(self.lo)}"
        if self.text:
            return "a string"
        if self.choices is not None:
            return "one of " + ", ".join(self.allowed())
        if self.hi == math.inf and not self.hi_closed and self.lo > -math.inf:
            return f"{'>=' if self.lo_closed else '>'} {_num(self.lo)}"
        if self.lo == -math.inf and not self.lo_closed and self.hi < math.inf:
            return f"{'<=' if self.hi_closed else '<'} {_num(self.hi)}"
        return f"in {self.spec}"

    def check(self, value: Any, key: str) -> None:
        """ConfigError naming `key` and the domain unless `value` (each element of a list,
        None aside) is inside."""
        if value is None:
            return
        if isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                self.check(v, f"{key}[{i}]")
            return
        if not self.contains(value):
            raise ConfigError(f"{key} must be {self.describe(value)}, got {quoted(value)}")

    def outside(self, integer: bool) -> list[Any]:
        """Values just outside the domain, one beyond each finite end (and NaN, +-inf for
        floats where they are outside): what tests that walk every setting try."""
        if self.text:
            return []
        if self.choices is not None:
            return ["no-such-choice"]
        step = 1 if integer else 0.5
        out: list[Any] = []
        if self.lo > -math.inf:
            lo = int(self.lo) if integer else self.lo
            out.append(lo - step if self.lo_closed else lo)
        if self.hi < math.inf:
            hi = int(self.hi) if integer else self.hi
            out.append(hi + step if self.hi_closed else hi)
        if not integer:
            out.append(math.nan)
            if not self.hi_closed or self.hi < math.inf:
                out.append(math.inf)
            if not self.lo_closed or self.lo > -math.inf:
                out.append(-math.inf)
        return out


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


def choices(literal: Any) -> tuple[str, ...]:
    """The strings of a closed set declared as `Literal["a", "b", ...]`, in their order (an
    option's argparse `choices`, a domain's allowed values)."""
    values = get_args(literal)
    if get_origin(literal) is not Literal or not all(isinstance(v, str) for v in values):
        raise TypeError(f"expected a Literal of strings, got {literal!r}")
    return values


def domain_of(spec: Any) -> Domain:
    """The `Domain` of a spec: a `Domain`, a `Literal[...]` of strings, or the domain language."""
    if isinstance(spec, Domain):
        return spec
    if get_origin(spec) is Literal:
        values = choices(spec)
        return Domain(spec="{" + ", ".join(values) + "}", choices=values)
    return Domain.parse(spec)


def setting(default: Any = dataclasses.MISSING, domain: Any = "text", **meta: Any):
    """A dataclass field with its default and its domain (a list default is copied per instance)."""
    metadata = {DOMAIN_KEY: domain_of(domain), **meta}
    if isinstance(default, list):
        value = list(default)
        return dataclasses.field(default_factory=lambda: list(value), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def field_domain(f: dataclasses.Field) -> Domain | None:
    return f.metadata.get(DOMAIN_KEY)


def domain_of_field(cls: type, name: str) -> Domain:
    """The declared domain of field `name` of config dataclass `cls`: what a command-line option
    that sets that field takes (`number(int, domain_of_field(TrainConfig, "seq_len"))`)."""
    dom = next((field_domain(f) for f in dataclasses.fields(cls) if f.name == name), None)
    if dom is None:
        raise KeyError(f"{cls.__name__}.{name} declares no domain")
    return dom


def check_domains(obj: Any, where: str) -> None:
    """Check every field of config dataclass `obj` that declares a domain, and recurse into
    nested config dataclasses (not into `section` fields: their owner checks them under their
    own name); ConfigError naming `where.field`."""
    for f in dataclasses.fields(obj):
        if f.metadata.get("section"):
            continue
        value = getattr(obj, f.name)
        key = f"{where}.{f.name}" if where else f.name
        dom = field_domain(f)
        if dom is not None:
            dom.check(value, key)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            check_domains(value, key)


def check_field(cls: type, name: str, value: Any, key: str) -> None:
    """Check one value read for field `name` of dataclass `cls` (e.g. from YAML or --set)."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            dom = field_domain(f)
            if dom is not None:
                dom.check(value, key)
            return


def set_advice(cls: type, name: str, value: Any, key: str) -> str:
    """The advice to set `key` (field `name` of `cls`) to a `value` a check computed, as
    "set KEY=VALUE (e.g. --set KEY=VALUE)", only when `value` is in the field's declared domain.
    Otherwise the advice would fail in turn: it says instead that no setting fits and why
    (e.g. a vocabulary of 10^8 ids, above MAX_VOCAB). Every "set KEY={value}" advice with a
    computed value is built here (tests/cli/test_bad_input.py walks src/ for others)."""
    try:
        check_field(cls, name, value, key)
    except ConfigError as err:
        return f"no setting of {key} fits it ({err})"
    return f"set {key}={value} (e.g. --set {key}={value})"


# ----------------------------------------------------------------------------------------------
# command-line options


class Number:
    """An argparse `type` that parses an int or float and carries the option's domain
    (checked by `check_arguments` after parsing, so the error is one line like every other)."""

    def __init__(self, kind: type, domain: str | Domain) -> None:
        self.kind = kind
        self.domain = domain_of(domain)
        self.__name__ = kind.__name__  # argparse names the type in "invalid int value"

    def __call__(self, text: str) -> int | float:
        return self.kind(text)

    def __repr__(self) -> str:
        return f"number({self.kind.__name__}, {self.domain.spec!r})"


def number(kind: type, domain: str | Domain) -> Number:
    """`type=number(int, "[1, inf)")` for a numeric command-line option."""
    if kind not in (int, float):
        raise TypeError(f"number() takes int or float, not {kind!r}")
    return Number(kind, domain)


class Count(Number):
    """A whole-number option that may also be written `30e9`, `30_000_000_000` or
    `30,000,000,000` (token and character counts of a large corpus)."""

    def __init__(self, domain: str | Domain) -> None:
        super().__init__(int, domain)

    def __call__(self, text: str) -> int:
        clean = text.replace("_", "").replace(",", "")
        with contextlib.suppress(ValueError):
            return int(clean)
        try:
            value = float(clean)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a whole number, got {quoted(text)}"
            ) from None
        if not value.is_integer():
            raise argparse.ArgumentTypeError(f"expected a whole number, got {quoted(text)}")
        return int(value)

    def __repr__(self) -> str:
        return f"count({self.domain.spec!r})"


def count(domain: str | Domain) -> Count:
    """`type=count("[1, inf)")`: `number(int, ...)` that also reads 30e9 and 30_000_000_000."""
    return Count(domain)


class PathArg:
    """An argparse `type` for a path the command writes (`output_path`) or reads
    (`input_path`); `check_arguments` checks every output before the command starts."""

    def __init__(
        self,
        role: str,
        kind: str,
        text: bool = False,
        kind_of: Callable[[argparse.Namespace], str] | None = None,
    ) -> None:
        self.role = role  # output | input
        self.kind = kind  # dir | file (outputs); any (inputs)
        self.text = text  # inputs that may also be a name (hf:NAME, bpe:N): keep the string
        # an output that is a folder or a file depending on other options: args -> dir | file
        self.kind_of = kind_of
        self.__name__ = "path"

    def __call__(self, text: str) -> Path | str:
        if self.text or not text.strip():
            return text  # an empty output path is reported by check_arguments
        return Path(text).expanduser()

    def __repr__(self) -> str:
        return f"{self.role}_path({self.kind!r})"


def output_path(kind: str, kind_of: Callable[[argparse.Namespace], str] | None = None) -> PathArg:
    """`type=output_path("dir")` (a folder the command creates or fills) or `"file"`;
    `kind_of(args)` overrides `kind` when other options decide (`export --format gguf`)."""
    if kind not in ("dir", "file"):
        raise ValueError(f"output_path kind must be dir or file, not {kind!r}")
    return PathArg("output", kind, kind_of=kind_of)


def input_path(text: bool = False) -> PathArg:
    """`type=input_path()` for a path the command reads (an output may not be the same path);
    `text=True` keeps the string (options that also take names such as hf:NAME)."""
    return PathArg("input", "any", text)


def _name(action: argparse.Action) -> str:
    return action.option_strings[0] if action.option_strings else action.dest.upper()


_BLOCKING_KINDS = ("a FIFO (named pipe)", "a socket", "a device")


def _check_input_kind(name: str, path: Path) -> None:
    """ConfigError when an input path is a FIFO, socket or device: every input of every command
    is a file or a folder, and reading a pipe or device could block or never end (the readers
    refuse them too, through `taperlm.files.io.open_regular`; this names the option first)."""
    kind = not_a_file(path)
    if kind in _BLOCKING_KINDS:
        raise ConfigError(
            f"{name} {path} is {kind}, not a file or folder: taperlm reads only regular files "
            "and folders (a pipe or device could block or never end); point it at a file"
        )


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """ConfigError for the first numeric value outside its domain, or output path that cannot
    be written (see `check_output`), naming the option."""
    inputs = []
    for action in parser._actions:
        if isinstance(action.type, PathArg) and action.type.role == "input":
            value = getattr(args, action.dest, None)
            if value not in (None, ""):
                _check_input_kind(_name(action), Path(str(value)).expanduser())
            if value not in (None, "") and Path(value).exists():
                inputs.append((_name(action), Path(value)))
    for action in parser._actions:
        kind = action.type
        value = getattr(args, action.dest, None)
        if isinstance(kind, Number):
            kind.domain.check(value, _name(action))
        elif isinstance(kind, PathArg) and kind.role == "output" and value is not None:
            out_kind = kind.kind_of(args) if kind.kind_of else kind.kind
            check_output(value, out_kind, _name(action), inputs)
            folder = OUTPUT_FOLDERS.get((parser.prog.split()[-1], _name(action)))
            # under --force the command itself decides what it may replace
            if folder is not None and out_kind == "dir" and not getattr(args, "force", False):
                check_folder(Path(str(value)).expanduser(), folder, _name(action))
            key = (parser.prog.split()[-1], _name(action))
            if out_kind == "file" and key in OUTPUT_FILES:
                force = bool(getattr(args, "force", False)) if key in FORCE_TO_REPLACE else None
                check_output_file(Path(str(value)).expanduser(), OUTPUT_FILES[key], key[1], force)


def check_output(
    path: str | Path, kind: str, name: str, inputs: Iterable[tuple[str, Path]] = ()
) -> None:
    """ConfigError unless `path` can be written as a folder (`kind` dir) or a file (`kind` file)
    before any work starts: not empty; not a file where a folder is expected or the reverse; not
    under a file; in a place where this process can create files (tried, not assumed: root and
    read-only mounts make permission bits misleading); not one of the command's `inputs`."""
    text = str(path)
    want = "folder" if kind == "dir" else "file path"
    if not text.strip():
        raise ConfigError(f"{name} is an empty path; give a {want}")
    p = Path(text).expanduser()
    if kind == "dir" and p.exists() and not p.is_dir():
        raise ConfigError(
            f"{name} {p} is a file, not a folder; choose a folder (created if missing)"
        )
    if kind == "file" and p.is_dir():
        raise ConfigError(
            f"{name} {p} is a folder, not a file; give a file path such as {p / 'out.json'}"
        )
    for other, q in inputs:
        if p.exists() and _same(p, q):
            raise ConfigError(
                f"{name} {p} is the same path as {other} {q}, which this command reads; choose "
                "another path"
            )
    where = p if kind == "dir" and p.is_dir() else p.parent
    while not where.exists() and where != where.parent:
        where = where.parent
    if not where.is_dir():
        raise ConfigError(f"{name} {p} cannot be created: {where} is a file, not a folder")
    problem = _cannot_write_in(where)
    if problem:
        raise ConfigError(
            f"{name} {p} cannot be written: {where} does not accept new files ({problem}); "
            "choose another place or fix its permissions"
        )


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def _cannot_write_in(folder: Path) -> str | None:
    """None if a file can be created in `folder` (a probe file is created and removed), else
    the OS error."""
    probe = folder / f".taperlm-probe-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return None
    except OSError as err:
        return err.strerror or str(err)
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return None
