"""Every typed record of a comparison, and the one place they meet JSON: what a cell measured
(`CellResult`: result.json, with its novelty `NoveltyRecord` and sessions `SessionRecord`), what a
comparison concludes (`ComparisonSummary`, with the difference against tokens `LossVsTokens`,
the sequential stop `Stopping` and --tune-lr's `LrTuning`) and a comparison's report as a study
reads it (`ComparisonReport`: report.json, with how it was produced, `ReportMeta`).

Each record's `to_json` writes the JSON object it is stored as and `from_json` reads it back
(tests/compare/test_compare_records.py round-trips every one). The compare modes' JSON files are
read and written here only: `read_record`, `write_record`, `read_lines`, `append_line`,
`CellResult.read` and `ComparisonReport.write` (tests/repo/test_compare_json_edge.py holds every
other module of taperlm.compare to them). The code that computes the records is
`taperlm.compare.statistics` (and `taperlm.compare.cell` for a cell), the code that renders them
`taperlm.compare.report`."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

from taperlm.analysis.novelty_record import NoveltyRecord
from taperlm.analysis.stats import PairedDifference, PairwiseAgreement, Summary
from taperlm.compare.grid import PilotRun
from taperlm.compare.options import EQUIVALENCE_KINDS
from taperlm.errors import MalformedFileError
from taperlm.files.io import (
    MAX_RECORD_BYTES,
    atomic_write_json,
    atomic_write_text,
    finite_json,
    open_append,
    open_regular,
    parse_json,
    read_json,
)

RESULT_FILE = "result.json"
RESULT_VERSION = 1
REPORT_FILE = "report.json"

T = TypeVar("T")


def read_record(path: Path, what: str, read: Callable[[Any], T]) -> T:
    """The record `read` (a `from_json`) makes of the JSON file `path`, read bounded
    (MAX_RECORD_BYTES); an unsafe or malformed file raises `taperlm.files.io`'s errors naming
    `what`, and `read`'s own (KeyError, TypeError, ...) for a file of another shape."""
    return read(read_json(path, MAX_RECORD_BYTES, what))


def write_record(path: Path, record: Any) -> Path:
    """`record.to_json()` written atomically to `path` (non-finite numbers as null)."""
    return atomic_write_json(path, record.to_json())


def append_line(path: Path, record: Any, what: str) -> None:
    """`record.to_json()` appended to the JSON-lines file `path` as one line."""
    with open_append(path, what) as f:
        f.write(json.dumps(record.to_json()) + "\n")


def read_lines(path: Path, what: str, read: Callable[[dict[str, Any]], T]) -> list[T]:
    """The records `read` makes of the JSON-lines file `path` (read bounded). A record of how
    something ran: damaged lines (cut by a crash, not UTF-8, not an object) are left out rather
    than stopping the reader."""
    with open_regular(path, MAX_RECORD_BYTES, what) as f:
        text = f.read().decode("utf-8", errors="replace")
    out = []
    for line in text.splitlines():
        try:
            data = parse_json(line)
        except MalformedFileError:
            continue
        if isinstance(data, dict):
            out.append(read(data))
    return out


# ----------------------------------------------------------------------------------------------
# one cell


@dataclass(frozen=True)
class TrainRecord:
    """How a cell trained (result.json's `train`)."""

    steps: int  # optimizer steps trained
    tokens: int  # tokens trained
    train_loss: float | None  # the final training loss
    skipped_steps: int  # steps the guard skipped (non-finite gradients)
    resumed_from_step: int  # the checkpoint step its last training session began at (0: fresh)
    wall_s: float | None  # its last training session's seconds
    tokens_per_s: float | None = None  # mean logged throughput (None: none logged)

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrainRecord:
        return cls(**{f.name: data.get(f.name) for f in fields(cls)})


@dataclass(frozen=True)
class ValRecord:
    """A cell's validation (result.json's `val`)."""

    loss: float  # mean next-token loss
    ppl: float  # exp(loss)
    tokens: int  # the tokens validated

    def to_json(self) -> dict[str, Any]:
        return {"loss": self.loss, "ppl": self.ppl, "tokens": self.tokens}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ValRecord:
        return cls(data["loss"], data["ppl"], data["tokens"])


@dataclass(frozen=True)
class DataOrder:
    """The fingerprint of a cell's first batches (`data_order_fingerprint`)."""

    steps: int  # the optimizer steps hashed
    sha256: str  # sha256 of their token ids
    first_ids: list[int]  # the first ids of the first sequence

    def to_json(self) -> dict[str, Any]:
        return {"steps": self.steps, "sha256": self.sha256, "first_ids": self.first_ids}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DataOrder:
        return cls(data["steps"], data["sha256"], data["first_ids"])


@dataclass(frozen=True)
class TaskScore:
    """One zero-shot task's scores on a cell."""

    metrics: dict[str, float]  # metric -> value
    n: int  # items scored
    counts: dict[str, int] | None = None  # items behind a metric, when not n (None: none)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"metrics": self.metrics, "n": self.n}
        return out | ({"counts": self.counts} if self.counts else {})

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaskScore:
        return cls(data["metrics"], data["n"], data.get("counts"))


@dataclass(frozen=True)
class ZeroShotRecord:
    """A cell's zero-shot tasks (result.json's `zero_shot`, `{}` when it ran none)."""

    paper_row: dict[str, float | None]  # the paper's table row: column -> value
    tasks: dict[str, TaskScore]  # task -> its scores
    # task -> the accuracy without skill, 0-1 (None: a needle cannot be guessed); None: the
    # result was recorded before chance levels were
    chance: dict[str, float | None] | None = None

    def to_json(self) -> dict[str, Any]:
        out = {
            "paper_row": self.paper_row,
            "tasks": {k: v.to_json() for k, v in self.tasks.items()},
        }
        return out | ({} if self.chance is None else {"chance": self.chance})

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ZeroShotRecord:
        tasks = {k: TaskScore.from_json(v) for k, v in (data.get("tasks") or {}).items()}
        return cls(data.get("paper_row") or {}, tasks, data.get("chance"))


@dataclass
class SessionRecord:
    """One line of a cell's sessions.jsonl: what ran (training from a step, or the evaluation)
    and how this process computed (`taperlm.compare.cell.runtime_info`). Every key is optional
    (older cells recorded fewer): None is a key the line lacks, and `to_json` leaves it out."""

    phase: str | None = None  # "train" or "evaluate"
    from_step: int | None = None  # the step it began at
    started: str | None = None  # when (local time, ISO 8601)
    threads: int | None = None  # torch threads
    jobs: int | None = None  # cells run at a time
    processes: int | None = None  # processes the cell trained on
    torch: str | None = None  # torch version
    cpu_capability: str | None = None  # torch's CPU capability
    device: str | None = None  # the device it computed on
    machine: str | None = None  # platform.machine()
    to_step: int | None = None  # training: where the next training session began, or the end

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: v for k, v in out.items() if v is not None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SessionRecord:
        return cls(**{f.name: data.get(f.name) for f in fields(cls)})


@dataclass
class CellResult:
    """A done cell's numbers: what its result.json holds, field for field and in that order
    (`to_json` writes the file's layout, `from_json` reads it back)."""

    cell: str  # the cell's name (its folder under runs/)
    allocation: str  # its allocation's name
    label: str  # its allocation's label (plots, tables)
    taper: str  # its allocation's taper spec
    seed: int  # its seed (data order and init)
    # the run config it trained with, in taperlm.config's own format (`to_dict`; its reader,
    # `from_dict`, refuses keys a later version dropped, which reading an old result must not);
    # None in a report's runs, which leave it out (report.json's `base_config` is the uniform's)
    config: dict[str, Any] | None
    eval_settings: dict[str, Any]  # the `EvalSettings.to_dict` it was evaluated with
    train: TrainRecord  # how it trained
    curve: list[list[float]]  # [tokens, val_loss] per evaluation during training
    data_order: DataOrder  # the fingerprint of its first batches
    val: ValRecord  # the validation
    zero_shot: ZeroShotRecord | None  # the zero-shot tasks (None: no tasks)
    novelty: NoveltyRecord  # the layer-wise novelty
    times: dict[str, float] | None  # seconds: val_s, zero_shot_s, novelty_s
    sessions: list[SessionRecord]  # `read_sessions`: how each session ran
    finished_at: str  # when it was written (local time, ISO 8601)
    version: int = RESULT_VERSION  # the layout of result.json

    @property
    def trained_seed(self) -> int:
        """The seed its config trained with (`config`'s train.seed)."""
        return self._train_config()["seed"]

    @property
    def trained_lr(self) -> float:
        """The peak lr its config trained with (`config`'s train.lr)."""
        return self._train_config()["lr"]

    def _train_config(self) -> dict[str, Any]:
        if self.config is None:
            raise ValueError(f"{self.cell}: a report's run records no config")
        return self.config["train"]

    def to_json(self) -> dict[str, Any]:
        """result.json's object (a report's run: without `config`)."""
        out = {
            "version": self.version,
            "cell": self.cell,
            "allocation": self.allocation,
            "label": self.label,
            "taper": self.taper,
            "seed": self.seed,
            "config": self.config,
            "eval_settings": self.eval_settings,
            "train": self.train.to_json(),
            "curve": self.curve,
            "data_order": self.data_order.to_json(),
            "val": self.val.to_json(),
            "zero_shot": {} if self.zero_shot is None else self.zero_shot.to_json(),
            "novelty": self.novelty.to_json(),
            "times": self.times,
            "sessions": [x.to_json() for x in self.sessions],
            "finished_at": self.finished_at,
        }
        if self.config is None:
            del out["config"]
        return out

    @classmethod
    def read(cls, path: Path) -> CellResult:
        """The result.json at `path`, of this layout (RESULT_VERSION) and with its config;
        MalformedFileError (or, for a file unsafe to read, UnsafeFileError) otherwise."""
        data = read_json(path, MAX_RECORD_BYTES, RESULT_FILE)
        if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
            raise MalformedFileError(f"{path} holds no result with its config")
        if data.get("version") != RESULT_VERSION:
            raise MalformedFileError(f"{path} is of another layout than {RESULT_VERSION}")
        return cls.from_json(data)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CellResult:
        """The result `to_json` wrote; MalformedFileError when a field it needs is missing or
        not of its shape."""
        try:
            return cls(
                cell=data["cell"],
                allocation=data["allocation"],
                label=data["label"],
                taper=data["taper"],
                seed=data["seed"],
                config=data.get("config"),
                eval_settings=data.get("eval_settings") or {},
                train=TrainRecord.from_json(data["train"]),
                curve=data["curve"],
                data_order=DataOrder.from_json(data["data_order"]),
                val=ValRecord.from_json(data["val"]),
                zero_shot=ZeroShotRecord.from_json(zs) if (zs := data.get("zero_shot")) else None,
                novelty=NoveltyRecord.from_json(data["novelty"]),
                times=data.get("times"),
                sessions=[SessionRecord.from_json(x) for x in data.get("sessions") or []],
                finished_at=data.get("finished_at", ""),
                version=data["version"],
            )
        except KeyError as err:
            raise MalformedFileError(f"{RESULT_FILE} lacks {err.args[0]!r}") from None
        except (TypeError, AttributeError, IndexError) as err:  # a record of the wrong shape
            raise MalformedFileError(f"{RESULT_FILE} holds a malformed record: {err}") from None


Results = dict[str, CellResult]  # cell name -> its result


def _or_none(read: Callable[[Any], T], data: Any) -> T | None:
    return None if data is None else read(data)


@dataclass(frozen=True)
class NoveltySummary:
    """An allocation's novelty over its seeds (report.json's `novelty` of an allocation)."""

    pearson_mlp: Summary  # each seed's r(rho_mlp, depth), over seeds
    pearson_block: Summary  # each seed's r(rho_block, depth), over seeds
    rho_mlp_per_layer: list[float | None]  # per layer: the mean over seeds of its rho_mlp mean
    rho_block_per_layer: list[float | None]  # ... of its rho_block mean
    tokens: int | None  # the tokens measured (None: no cell)

    def to_json(self) -> dict[str, Any]:
        return {
            "pearson_mlp": self.pearson_mlp.to_json(),
            "pearson_block": self.pearson_block.to_json(),
            "rho_mlp_per_layer": self.rho_mlp_per_layer,
            "rho_block_per_layer": self.rho_block_per_layer,
            "tokens": self.tokens,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NoveltySummary:
        return cls(
            Summary.from_json(data["pearson_mlp"]),
            Summary.from_json(data["pearson_block"]),
            data["rho_mlp_per_layer"],
            data["rho_block_per_layer"],
            data["tokens"],
        )


@dataclass(frozen=True)
class DiffVsUniform:
    """An allocation's paired differences from uniform, seed by seed."""

    val_loss: PairedDifference  # of the validation loss
    val_ppl: PairedDifference  # of the validation perplexity

    def to_json(self) -> dict[str, Any]:
        return {"val_loss": self.val_loss.to_json(), "val_ppl": self.val_ppl.to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DiffVsUniform:
        return cls(
            PairedDifference.from_json(data["val_loss"]),
            PairedDifference.from_json(data["val_ppl"]),
        )


@dataclass(frozen=True)
class ZeroShotColumn(Summary):
    """One zero-shot column over seeds; for an accuracy whose task has a chance level, that
    level and whether the mean is at it (report.md's †)."""

    chance: float | None = None  # the no-skill accuracy, % (None: not marked)
    at_chance: bool | None = None  # the mean is not significantly above it (None: not marked)

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        if self.at_chance is not None:
            out |= {"chance": self.chance, "at_chance": self.at_chance}
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ZeroShotColumn:
        s = Summary.from_json(data)
        return cls(s.mean, s.std, s.n, s.values, data.get("chance"), data.get("at_chance"))


@dataclass(frozen=True)
class SeedNumbers:
    """One seed's cell of an allocation, as report.json's `per_seed` entry records it."""

    val_loss: float  # its validation loss
    val_ppl: float  # its validation perplexity
    val_tokens: int  # the tokens validated
    train_loss: float | None  # its final training loss
    tokens_per_s: float | None  # its training throughput
    train_wall_s: float | None  # its training seconds (None: re-evaluated only)
    pearson_mlp: float | None  # its r(rho_mlp, depth)
    data_order_sha256: str  # the fingerprint of its data order
    zero_shot: dict[str, float] | None  # its zero-shot row: column -> value (None: no tasks)
    times: dict[str, float] | None  # seconds: val_s, zero_shot_s, novelty_s

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SeedNumbers:
        return cls(**{f.name: data.get(f.name) for f in fields(cls)})


@dataclass
class AllocationSummary:
    """One allocation of a comparison over its seeds: report.json's entry of `allocations`
    (`to_json` writes it, field for field and in that order)."""

    name: str  # the allocation's name (its cells' folder prefix)
    label: str  # its label (tables, plots)
    taper: str  # its taper spec
    widths: list[int]  # MLP width per layer
    baseline_width: int  # the uniform model's MLP width
    heads: list[int] | None  # attention heads per layer (None: not recorded)
    baseline_heads: int | None  # the uniform model's heads
    kv_heads: list[int] | None  # KV heads per layer
    kv_cache_bytes_per_token_bf16: int | None  # its KV cache per token in bf16
    widths_by_seed: dict[str, list[int]] | None  # per seed, when the widths depend on it (pilots)
    pilot: bool  # whether its widths come from a novelty pilot
    params: int  # parameters
    flops_per_token: int  # training FLOPs per token
    paper_ppl: float | None  # the paper's perplexity for it (None: not in the paper)
    seeds: list[int]  # the seeds with a result
    val_loss: Summary  # the validation loss over seeds
    val_ppl: Summary  # ... the validation perplexity
    tokens_per_s: Summary  # ... the training throughput
    train_loss: Summary  # ... the final training loss
    diff_vs_uniform: DiffVsUniform | None  # paired differences vs uniform (None: uniform itself)
    novelty: NoveltySummary  # novelty over seeds
    zero_shot: dict[str, ZeroShotColumn] | None  # column -> over seeds (None: no tasks)
    per_seed: dict[str, SeedNumbers]  # seed -> its cell's numbers

    def to_json(self) -> dict[str, Any]:
        """report.json's entry."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for key in ("val_loss", "val_ppl", "tokens_per_s", "train_loss", "novelty"):
            out[key] = out[key].to_json()
        if self.diff_vs_uniform is not None:
            out["diff_vs_uniform"] = self.diff_vs_uniform.to_json()
        if self.zero_shot is not None:
            out["zero_shot"] = {k: v.to_json() for k, v in self.zero_shot.items()}
        out["per_seed"] = {k: v.to_json() for k, v in self.per_seed.items()}
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AllocationSummary:
        """The entry `to_json` wrote."""
        out = {f.name: data.get(f.name) for f in fields(cls)}
        for key in ("val_loss", "val_ppl", "tokens_per_s", "train_loss"):
            out[key] = Summary.from_json(data[key])
        out["novelty"] = NoveltySummary.from_json(data["novelty"])
        out["diff_vs_uniform"] = _or_none(DiffVsUniform.from_json, data.get("diff_vs_uniform"))
        zs = data.get("zero_shot")
        out["zero_shot"] = (
            None if zs is None else {k: ZeroShotColumn.from_json(v) for k, v in zs.items()}
        )
        out["per_seed"] = {k: SeedNumbers.from_json(v) for k, v in data["per_seed"].items()}
        return cls(**out)


@dataclass(frozen=True)
class PilotSummary:
    """The pilots' cost (report.json's `pilot`; novelty:pilot allocations only)."""

    tokens: int  # training tokens of each pilot
    fraction_of_run: float  # its share of a reported run's tokens
    train_s: Summary  # training seconds per pilot, over seeds
    novelty_s: Summary  # novelty seconds per pilot, over seeds
    per_seed: dict[str, PilotRun]  # seed -> its pilot

    def to_json(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "fraction_of_run": self.fraction_of_run,
            "train_s": self.train_s.to_json(),
            "novelty_s": self.novelty_s.to_json(),
            "per_seed": {k: dataclasses.asdict(v) for k, v in self.per_seed.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PilotSummary:
        return cls(
            data["tokens"],
            data["fraction_of_run"],
            Summary.from_json(data["train_s"]),
            Summary.from_json(data["novelty_s"]),
            {k: PilotRun(**v) for k, v in data["per_seed"].items()},
        )


@dataclass(frozen=True)
class ExecutionSetting:
    """One distinct way cells ran (`execution`'s `settings` entry)."""

    threads: int | None  # torch threads per cell
    torch: str | None  # torch version
    cpu_capability: str | None  # torch's CPU capability (e.g. AVX2)
    device: str | None  # the device it computed on
    cells: list[str]  # the cells (some of whose sessions) ran so
    train_steps: int  # the training steps that ran so

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExecutionSetting:
        return cls(**{f.name: data[f.name] for f in fields(cls)})


@dataclass(frozen=True)
class Execution:
    """How a comparison's cells actually ran (report.json's `execution`)."""

    settings: list[ExecutionSetting]  # every distinct setting, in the order first met
    jobs: list[int]  # the numbers of cells run at a time
    consistent: bool  # every cell, and every part of one, ran with one setting
    single_thread: bool  # every setting had one torch thread

    def to_json(self) -> dict[str, Any]:
        return {
            "settings": [e.to_json() for e in self.settings],
            "jobs": self.jobs,
            "consistent": self.consistent,
            "single_thread": self.single_thread,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Execution:
        return cls(
            [ExecutionSetting.from_json(e) for e in data["settings"]],
            data["jobs"],
            data["consistent"],
            data["single_thread"],
        )


@dataclass(frozen=True)
class DesignChecks:
    """The comparison's design, checked on its cells (report.json's `checks`)."""

    equal_params: bool  # every allocation has the same parameters
    equal_flops_per_token: bool  # ... the same training FLOPs per token
    same_data_order_within_seed: bool  # the cells of one seed saw the same batches
    distinct_data_order_across_seeds: bool  # different seeds saw different batches
    init_seed_equals_seed: bool  # every cell initialised with its own seed

    def to_json(self) -> dict[str, bool]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DesignChecks:
        return cls(**{f.name: data[f.name] for f in fields(cls)})


# report.json's key of a ratio's check that cosine < linear < sigmoid
ORDERING_KEY = "cosine<linear<sigmoid"


@dataclass(frozen=True)
class RatioOrdering:
    """At one start -> end ratio of the sweep: our ppl per schedule and the paper's ordering."""

    ours: dict[str, float]  # schedule -> our mean val ppl
    ordered: bool  # cosine < linear < sigmoid

    def to_json(self) -> dict[str, Any]:
        return {"ours": self.ours, ORDERING_KEY: self.ordered}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RatioOrdering:
        return cls(data["ours"], data[ORDERING_KEY])


@dataclass(frozen=True)
class SweepClaims:
    """The paper's §4 claims checked on our numbers (--paper sweep)."""

    per_ratio: dict[str, RatioOrdering]  # "start->end" -> the check there
    ordering_holds_at: int  # ratios where cosine < linear < sigmoid
    ratios: int  # ratios with all three schedules
    best_cosine_ratio_ours: str | None  # our best cosine ratio, "start->end"
    best_cosine_ratio_paper: str  # the paper's

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["per_ratio"] = {k: v.to_json() for k, v in self.per_ratio.items()}
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SweepClaims:
        out = {f.name: data[f.name] for f in fields(cls)}
        out["per_ratio"] = {k: RatioOrdering.from_json(v) for k, v in data["per_ratio"].items()}
        return cls(**out)


@dataclass(frozen=True)
class PaperComparison:
    """Our ordering of the allocations the paper reports against its ordering."""

    allocations: list[str]  # the allocations in both
    ours_val_ppl: dict[str, float]  # name -> our mean val ppl
    paper_val_ppl: dict[str, float]  # name -> the paper's
    spearman: float | None  # rank correlation (None: undefined)
    pairwise: PairwiseAgreement  # pairs ordered as in the paper
    best_ours: str  # our best allocation
    best_paper: str  # the paper's
    sweep_claims: SweepClaims | None = None  # --paper sweep only (absent from the JSON otherwise)

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["pairwise"] = self.pairwise.to_json()
        if self.sweep_claims is None:
            del out["sweep_claims"]
        else:
            out["sweep_claims"] = self.sweep_claims.to_json()
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PaperComparison:
        out = {f.name: data.get(f.name) for f in fields(cls)}
        out["pairwise"] = PairwiseAgreement.from_json(data["pairwise"])
        out["sweep_claims"] = _or_none(SweepClaims.from_json, data.get("sweep_claims"))
        return cls(**out)


@dataclass
class ComparisonSummary:
    """Every number behind a comparison's report: report.json's keys between `base_config` and
    `runs` (`to_json` writes them in that order, the extras last)."""

    allocations: list[AllocationSummary]  # per allocation, in the grid's order
    pilot: PilotSummary | None  # the pilots' cost (None: no novelty:pilot allocation)
    run_times: dict[str, float]  # seconds summed over the cells: train_s, val_s, ...
    execution: Execution  # how the cells ran
    checks: DesignChecks  # the design checks (equal budgets, data orders, init seeds)
    paper_comparison: PaperComparison | None  # agreement with the paper (None: < 2 in it)
    # the parts every report, or some, adds after them (written in this order when present)
    loss_vs_tokens: LossVsTokens | None = None  # the difference against tokens seen
    stopping: Stopping | None = None  # --stop: when and why it stopped adding seeds
    lr_tuning: LrTuning | None = None  # --tune-lr: the curves, the choices and the cost

    def to_json(self) -> dict[str, Any]:
        """report.json's keys of the summary."""
        return {
            "allocations": [a.to_json() for a in self.allocations],
            "pilot": None if self.pilot is None else self.pilot.to_json(),
            "run_times": self.run_times,
            "execution": self.execution.to_json(),
            "checks": self.checks.to_json(),
            "paper_comparison": None
            if self.paper_comparison is None
            else self.paper_comparison.to_json(),
            **{
                name: part.to_json()
                for name, part in (
                    ("loss_vs_tokens", self.loss_vs_tokens),
                    ("stopping", self.stopping),
                    ("lr_tuning", self.lr_tuning),
                )
                if part is not None
            },
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ComparisonSummary:
        """The summary in a report.json `to_json` wrote (its other keys: meta, base_config,
        runs, are not the summary's)."""
        return cls(
            allocations=[AllocationSummary.from_json(a) for a in data["allocations"]],
            pilot=_or_none(PilotSummary.from_json, data.get("pilot")),
            run_times=data["run_times"],
            execution=Execution.from_json(data["execution"]),
            checks=DesignChecks.from_json(data["checks"]),
            paper_comparison=_or_none(PaperComparison.from_json, data.get("paper_comparison")),
            loss_vs_tokens=_or_none(LossVsTokens.from_json, data.get("loss_vs_tokens")),
            stopping=_or_none(Stopping.from_json, data.get("stopping")),
            lr_tuning=_or_none(LrTuning.from_json, data.get("lr_tuning")),
        )


@dataclass(frozen=True)
class DeltaAt:
    """The paired difference at one evaluation during training."""

    tokens: int  # training tokens seen at the evaluation
    tokens_per_param: float  # tokens / the model's parameters
    n: int  # paired seeds
    mean: float  # mean over seeds of tapered − uniform validation loss, nats
    ci: tuple[float, float] | None  # its 95% Student-t interval (None: one seed)
    per_seed: tuple[float, ...]  # the difference of each seed, in `seeds` order

    def to_json(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "tokens_per_param": self.tokens_per_param,
            "n": self.n,
            "mean": self.mean,
            "ci": None if self.ci is None else list(self.ci),
            "per_seed": list(self.per_seed),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DeltaAt:
        ci = data["ci"]
        return cls(
            tokens=int(data["tokens"]),
            tokens_per_param=float(data["tokens_per_param"]),
            n=int(data["n"]),
            mean=float(data["mean"]),
            ci=None if ci is None else (float(ci[0]), float(ci[1])),
            per_seed=tuple(float(x) for x in data["per_seed"]),
        )


@dataclass(frozen=True)
class Crossing:
    """Where a mean-difference curve last crosses from below zero to at or above it."""

    kind: str  # one of KINDS
    tokens: float | None  # the crossing (kind CROSSED), interpolated in log tokens; else None
    recrossed: bool  # the curve went >= 0 earlier and dipped below again before this crossing

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "tokens": self.tokens, "recrossed": self.recrossed}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Crossing:
        tokens = data["tokens"]
        return cls(data["kind"], None if tokens is None else float(tokens), bool(data["recrossed"]))


@dataclass(frozen=True)
class CrossingInterval:
    """The crossing's bootstrap over seeds."""

    resamples: int  # seed resamples drawn
    rng_seed: int  # numpy's default_rng seed (fixed: reproducible reports)
    crossed: int  # resamples whose mean curve crosses
    below_at_end: int  # ... that end below zero
    never_below: int  # ... that are never below zero
    tokens: tuple[float, float] | None  # 2.5/97.5 percentiles among those that cross

    @property
    def share_not_crossing(self) -> float:
        return (self.below_at_end + self.never_below) / self.resamples

    def to_json(self) -> dict[str, Any]:
        return {
            "resamples": self.resamples,
            "rng_seed": self.rng_seed,
            "crossed": self.crossed,
            "below_at_end": self.below_at_end,
            "never_below": self.never_below,
            "tokens": None if self.tokens is None else list(self.tokens),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CrossingInterval:
        t = data["tokens"]
        return cls(
            resamples=int(data["resamples"]),
            rng_seed=int(data["rng_seed"]),
            crossed=int(data["crossed"]),
            below_at_end=int(data["below_at_end"]),
            never_below=int(data["never_below"]),
            tokens=None if t is None else (float(t[0]), float(t[1])),
        )


@dataclass(frozen=True)
class AllocationCurve:
    """One tapered allocation against uniform, during training."""

    name: str  # the allocation's name
    label: str  # its label (tables, plots)
    seeds: tuple[int, ...]  # the seeds with a curve in both arms (the pairing)
    points: tuple[DeltaAt, ...]  # at every shared evaluation, in token order
    crossing: Crossing
    interval: CrossingInterval | None  # None: fewer than 2 seeds

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "label": self.label,
            "seeds": list(self.seeds),
            "points": [p.to_json() for p in self.points],
            "crossing": self.crossing.to_json(),
            "interval": None if self.interval is None else self.interval.to_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AllocationCurve:
        iv = data["interval"]
        return cls(
            name=data["name"],
            label=data["label"],
            seeds=tuple(int(s) for s in data["seeds"]),
            points=tuple(DeltaAt.from_json(p) for p in data["points"]),
            crossing=Crossing.from_json(data["crossing"]),
            interval=None if iv is None else CrossingInterval.from_json(iv),
        )


@dataclass(frozen=True)
class LossVsTokens:
    """report.json's `loss_vs_tokens`: every tapered allocation's difference against tokens."""

    params: int  # the model's parameters (every allocation's: equal budgets)
    eval_tokens: int | None  # validation tokens per curve point (not the table's final ones)
    allocations: tuple[AllocationCurve, ...]  # in the grid's order, uniform left out

    def to_json(self) -> dict[str, Any]:
        """report.json's object; each allocation also gets its crossing and interval in tokens
        per parameter (`crossing_tokens_per_param`, `interval_tokens_per_param`: derived, for
        the reader; `from_json` recomputes them from `params`)."""
        allocations = []
        for a in self.allocations:
            entry = a.to_json()
            c, iv = a.crossing.tokens, a.interval and a.interval.tokens
            entry["crossing_tokens_per_param"] = None if c is None else c / self.params
            entry["interval_tokens_per_param"] = (
                None if not iv else [iv[0] / self.params, iv[1] / self.params]
            )
            allocations.append(entry)
        return {"params": self.params, "eval_tokens": self.eval_tokens, "allocations": allocations}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LossVsTokens:
        et = data["eval_tokens"]
        return cls(
            params=int(data["params"]),
            eval_tokens=None if et is None else int(et),
            allocations=tuple(AllocationCurve.from_json(a) for a in data["allocations"]),
        )


@dataclass(frozen=True)
class ComparisonState:
    """One comparison's anytime-valid interval after n seeds."""

    n: int  # seeds so far
    mean: float  # the mean paired difference
    half: float  # the interval's half-width (inf while unbounded)
    ci: tuple[float, float]  # (mean - half, mean + half); (-inf, inf) while unbounded
    excludes_zero: bool  # whether the interval excludes 0
    within_margin: bool = False  # whether it lies inside +-margin (rules with a margin only)

    def to_json(self) -> dict[str, Any]:
        """JSON has no infinity: an unbounded interval's half and ci are written as null."""
        bounded = math.isfinite(self.half)
        return {
            "n": self.n,
            "mean": self.mean,
            "half": self.half if bounded else None,
            "ci": list(self.ci) if bounded else None,
            "excludes_zero": self.excludes_zero,
            "within_margin": self.within_margin,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ComparisonState:
        ci = data["ci"]
        unbounded = data["half"] is None
        return cls(
            data["n"],
            data["mean"],
            math.inf if unbounded else data["half"],
            (-math.inf, math.inf) if unbounded else (ci[0], ci[1]),
            data["excludes_zero"],
            bool(data.get("within_margin", False)),  # reports before issue 62 have none
        )


@dataclass(frozen=True)
class SequenceStep:
    """The stop rule's view after n seeds."""

    n: int  # seeds 0..n-1
    comparisons: dict[str, ComparisonState]  # label -> its interval
    stops: bool  # whether the rule stops here

    def to_json(self) -> dict[str, Any]:
        comparisons = {k: v.to_json() for k, v in self.comparisons.items()}
        return {"n": self.n, "comparisons": comparisons, "stops": self.stops}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SequenceStep:
        comparisons = {k: ComparisonState.from_json(v) for k, v in data["comparisons"].items()}
        return cls(data["n"], comparisons, data["stops"])


@dataclass(frozen=True)
class Stopping:
    """When and why a comparison stopped adding seeds (report.json's `stopping`)."""

    rule: str  # --stop as given
    alpha: float  # the error rate per comparison
    confidence: float  # 1 - alpha
    min_seeds: int  # --min-seeds
    stop_on: str  # --stop-on: the comparisons that must be settled
    cap: int  # --seeds: the most seeds
    seeds_used: int  # the seeds the report uses
    stopped_at: int  # the n it stopped at
    reason: str  # the rule's kind that stopped it (`outcome`), or "cap"
    construction: str  # the interval's construction, in words
    sequence: list[SequenceStep]  # per n = 1..stopped_at
    plotted: bool = False  # `with_plot` ran (only then is report.json's `plot` written)
    plot: str | None = None  # sequence.png (None: no bounded interval to draw)

    @property
    def margin(self) -> float | None:
        """The equivalence margin of the rule (nats), None for a rule without one."""
        kind, _, value = self.rule.partition(":")
        return float(value) if kind in EQUIVALENCE_KINDS else None

    def settled_verdicts(self) -> dict[str, str]:
        """label -> the verdict of each comparison settled as "no practical difference" where it
        stopped (report.md's "Verdict" says it in place of the fixed-n reading); {} otherwise."""
        if self.reason not in EQUIVALENCE_KINDS or not self.sequence:
            return {}
        pct, margin = f"{100 * self.confidence:g}%", self.margin
        return {
            label: f"no practical difference (within ±{margin:g} nats), Δ {e.mean:+.4f} nats, "
            f"{pct} anytime-valid interval [{e.ci[0]:+.4f}, {e.ci[1]:+.4f}] after {e.n} seeds"
            for label, e in self.sequence[-1].comparisons.items()
            if e.within_margin
        }

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["sequence"] = [step.to_json() for step in self.sequence]
        del out["plotted"]
        if not self.plotted:
            del out["plot"]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Stopping:
        names = [f.name for f in dataclasses.fields(cls) if f.name not in ("plotted", "plot")]
        out = {k: data[k] for k in names}
        out["sequence"] = [SequenceStep.from_json(step) for step in data["sequence"]]
        return cls(**out, plotted="plot" in data, plot=data.get("plot"))


# ----------------------------------------------------------------------------------------------
# writing


@dataclass(frozen=True)
class ModelMeta:
    """The model a comparison trained, in brief (report.json's `meta.model`)."""

    family: str
    n_layers: int
    d_model: int
    n_heads: int
    mlp_width: int  # the uniform model's MLP width
    vocab_size: int

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelMeta:
        return cls(**{f.name: data[f.name] for f in fields(cls)})


@dataclass(frozen=True)
class SettingsMeta:
    """A comparison's training recipe, data and evaluation (report.json's `meta.settings`)."""

    tokens: int  # training tokens per run (rounded up to whole steps)
    steps: int  # optimizer steps per run
    batch_tokens: int  # tokens per optimizer step
    seq_len: int
    lr: float  # the peak lr
    warmup_tokens: int
    eval_every: int  # steps between evaluations during training
    eval_tokens: int  # validation tokens per evaluation during training
    seeds: list[int]  # the reported seeds
    data_dir: str  # the prepared data
    train_tokens: int  # its train split's tokens
    val_tokens: int  # the validation tokens of the final evaluation
    eval_tasks: list[str]  # the zero-shot tasks ([]: none)
    eval_limit: int | None  # items per task (None: all)
    novelty_text: str  # what the novelty was measured on, in words
    novelty_tokens: int  # its tokens

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SettingsMeta:
        return cls(**{f.name: data[f.name] for f in fields(cls)})


@dataclass
class ReportMeta:
    """How a comparison's report was produced (report.json's `meta`, field for field and in
    that order)."""

    title: str
    command: str  # the command that reproduces it
    created: str  # when (local time)
    taperlm_version: str
    torch_version: str
    threads: int | None  # --threads
    jobs: int  # cells run at a time
    paper_mode: str | None  # --paper
    cells: int  # the cells reported
    wall_s: float  # this invocation's wall seconds
    cpu_s: float | None  # ... CPU seconds (None: a report from before they were recorded)
    model: ModelMeta
    settings: SettingsMeta
    plots: dict[str, str] | None = None  # figure -> its PNG (None: not yet drawn)

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["model"], out["settings"] = self.model.to_json(), self.settings.to_json()
        for key in ("cpu_s", "plots"):  # absent when unknown
            if out[key] is None:
                del out[key]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ReportMeta:
        out = {f.name: data.get(f.name) for f in fields(cls)}
        out["model"] = ModelMeta.from_json(data["model"])
        out["settings"] = SettingsMeta.from_json(data["settings"])
        return cls(**out)


@dataclass
class ComparisonReport:
    """A comparison's report.json, typed: what a study puts its comparisons together from."""

    out: Path  # the comparison's folder (report.md, report.json and the PNGs)
    meta: ReportMeta  # how it was produced
    # the config every cell started from, in taperlm.config's own format (`to_dict`)
    base_config: dict[str, Any]
    summary: ComparisonSummary  # every number
    runs: dict[str, CellResult]  # cell -> its result, without its config

    @property
    def md_path(self) -> Path:
        return self.out / "report.md"

    @property
    def json_path(self) -> Path:
        return self.out / REPORT_FILE

    def to_json(self) -> dict[str, Any]:
        """report.json's object."""
        return {
            "meta": self.meta.to_json(),
            "base_config": self.base_config,
            **self.summary.to_json(),
            "runs": {name: r.to_json() for name, r in self.runs.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], out: Path) -> ComparisonReport:
        """The report `to_json` wrote into `out`."""
        runs = {name: CellResult.from_json(r) for name, r in data["runs"].items()}
        meta = ReportMeta.from_json(data["meta"])
        return cls(out, meta, data["base_config"], ComparisonSummary.from_json(data), runs)

    def write(self) -> ComparisonReport:
        """Writes report.json; returns the report as the file holds it (non-finite numbers
        null, keys strings), as a rerun that finds this comparison done would read it."""
        text = json.dumps(finite_json(self.to_json()), indent=1, allow_nan=False)
        atomic_write_text(self.json_path, text + "\n")
        return ComparisonReport.from_json(parse_json(text, self.json_path), self.out)


@dataclass(frozen=True)
class LrPoint:
    """One lr of an allocation's tuning curve: its validation loss over the tuning seeds."""

    lr: float  # the peak lr
    loss: Summary  # the validation loss over the tuning seeds
    ci: list[float] | None  # the mean's 95% t interval (None: fewer than two seeds)
    per_seed: dict[str, float]  # tuning seed -> its loss

    def to_json(self) -> dict[str, Any]:
        return {"lr": self.lr, **self.loss.to_json(), "ci": self.ci, "per_seed": self.per_seed}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LrPoint:
        return cls(data["lr"], Summary.from_json(data), data["ci"], data["per_seed"])


@dataclass(frozen=True)
class LrCurve:
    """An allocation's loss against lr and the lr chosen from it."""

    label: str  # the allocation's label
    curve: list[LrPoint]  # per lr of the grid, ascending
    chosen_lr: float  # the lowest mean (ties to the lr nearest the recipe's)
    at_edge: bool  # the choice is the grid's smallest or largest lr

    def to_json(self) -> dict[str, Any]:
        curve = [p.to_json() for p in self.curve]
        return {
            "label": self.label,
            "curve": curve,
            "chosen_lr": self.chosen_lr,
            "at_edge": self.at_edge,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LrCurve:
        curve = [LrPoint.from_json(p) for p in data["curve"]]
        return cls(data["label"], curve, data["chosen_lr"], data["at_edge"])


@dataclass
class TuningCost:
    """What tuning cost, in cells and in their recorded seconds (filled in as it runs)."""

    tuning_cells: int  # cells of the tuning grid
    tuning_s: float  # their seconds
    tuned_cells: int | None = None  # reported cells at lrs other than the recipe's
    tuned_s: float | None = None  # their seconds
    reported_s: float | None = None  # the reported grid's seconds
    factor: float | None = None  # (reported + tuning + tuned) / reported

    def to_json(self) -> dict[str, Any]:
        """The parts known so far (None: not yet)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {k: v for k, v in out.items() if v is not None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TuningCost:
        return cls(**{f.name: data.get(f.name) for f in dataclasses.fields(cls)})


@dataclass(frozen=True)
class TunedRow:
    """Scope `each`: one allocation vs uniform at the shared lr and at their own lrs."""

    name: str  # the allocation's name
    label: str  # its label
    lr: float  # its chosen lr
    lr_used: list[float]  # the lrs its reported cells trained at
    runs: str  # the name its own-lr cells run under
    shared_loss: Summary  # its validation loss at the shared lr
    tuned_loss: Summary  # ... at its own lr
    shared_diff: PairedDifference | None  # vs uniform at the shared lr (None: uniform)
    tuned_diff: PairedDifference | None  # vs uniform at their own lrs (None: uniform)
    tuned_per_seed: dict[str, float]  # seed -> its loss at its own lr

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for key in ("shared_loss", "tuned_loss", "shared_diff", "tuned_diff"):
            out[key] = None if out[key] is None else out[key].to_json()
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TunedRow:
        out = {f.name: data[f.name] for f in dataclasses.fields(cls)}
        for key in ("shared_loss", "tuned_loss"):
            out[key] = Summary.from_json(data[key])
        for key in ("shared_diff", "tuned_diff"):
            out[key] = None if data[key] is None else PairedDifference.from_json(data[key])
        return cls(**out)


@dataclass
class LrTuning:
    """--tune-lr: the curves, the choices and the cost (report.json's `lr_tuning`; filled in
    as the comparison runs: `run_tuned` adds the own-lr rows and when they stopped)."""

    scope: str  # each (every allocation its own lr) or uniform (every one at uniform's)
    lrs: list[float]  # the lr grid, as finally extended
    extended: int  # how often it was extended past an edge
    recipe_lr: float  # the recipe's lr
    tuning_seeds: list[int]  # the seeds tuned on
    reported_seeds: list[int]  # the seeds reported (disjoint)
    rule: str  # how the lr is chosen, in words
    curves: dict[str, LrCurve]  # allocation -> its curve
    chosen_lr: dict[str, float]  # allocation -> its chosen lr
    cost: TuningCost  # what it cost so far
    tuned: list[TunedRow] | None = None  # scope each, once run: per allocation
    tuned_stopping: Stopping | None = None  # scope each: when the own-lr comparison stopped
    plot: str | None = None  # lr_tuning.png, once drawn

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["curves"] = {k: v.to_json() for k, v in self.curves.items()}
        out["cost"] = self.cost.to_json()
        out["tuned"] = None if self.tuned is None else [r.to_json() for r in self.tuned]
        for key in ("tuned_stopping", "plot"):  # absent until known
            if out[key] is None:
                del out[key]
        if self.tuned_stopping is not None:
            out["tuned_stopping"] = self.tuned_stopping.to_json()
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LrTuning:
        out = {f.name: data.get(f.name) for f in dataclasses.fields(cls)}
        out["curves"] = {k: LrCurve.from_json(v) for k, v in data["curves"].items()}
        out["cost"] = TuningCost.from_json(data["cost"])
        if data.get("tuned") is not None:
            out["tuned"] = [TunedRow.from_json(r) for r in data["tuned"]]
        if data.get("tuned_stopping") is not None:
            out["tuned_stopping"] = Stopping.from_json(data["tuned_stopping"])
        return cls(**out)
