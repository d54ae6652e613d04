"""The numbers behind a comparison report: per allocation, budgets and summaries over seeds
(mean, sample std), paired differences vs uniform with t intervals (`taperlm.analysis.stats`), novelty
correlations, zero-shot rows, the design checks and the comparison with the paper.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeVar

from taperlm.analysis import stats
from taperlm.analysis.stats import PairedDifference, PairwiseAgreement, Summary
from taperlm.compare.grid import Grid, PilotRun
from taperlm.compare.paper import PAPER_BEST_SWEEP_RATIO, PAPER_SWEEP, SWEEP_SCHEDULES
from taperlm.evaluation.suite import at_chance, chance_columns, paper_columns
from taperlm.spec.taper import TaperSpec

if TYPE_CHECKING:
    from taperlm.compare.runner import CellResult

T = TypeVar("T")


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
    # other parts' numbers (e.g. "stopping", "lr_tuning"), in the order they were added: a
    # record with `to_json`, or JSON as it is (read back from report.json, they are JSON)
    extras: dict[str, Any] = field(default_factory=dict)

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
            **{k: v.to_json() if hasattr(v, "to_json") else v for k, v in self.extras.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ComparisonSummary:
        """The summary in a report.json `to_json` wrote (its other keys: meta, base_config,
        runs, are not the summary's)."""
        known = {"allocations", "pilot", "run_times", "execution", "checks", "paper_comparison"}
        return cls(
            allocations=[AllocationSummary.from_json(a) for a in data["allocations"]],
            pilot=_or_none(PilotSummary.from_json, data.get("pilot")),
            run_times=data["run_times"],
            execution=Execution.from_json(data["execution"]),
            checks=DesignChecks.from_json(data["checks"]),
            paper_comparison=_or_none(PaperComparison.from_json, data.get("paper_comparison")),
            extras={
                k: v
                for k, v in data.items()
                if k not in known and k not in ("meta", "base_config", "runs")
            },
        )


def _loss(r: CellResult) -> float:
    return r.val.loss


def _ppl(r: CellResult) -> float:
    return r.val.ppl


def _by_seed(results: list[CellResult], get) -> dict[int, float]:
    out = {}
    for r in results:
        v = get(r)
        if v is not None:
            out[int(r.seed)] = float(v)
    return out


def _layer_means(results: list[CellResult], key: str) -> list[float | None]:
    rows = [[(x[key] or {}).get("mean") for x in r.novelty["layers"]] for r in results]
    if not rows:
        return []
    out: list[float | None] = []
    for vals in zip(*rows):
        ok = [v for v in vals if v is not None]
        out.append(stats.mean(ok) if ok else None)
    return out


def summarize(grid: Grid, results: dict[str, CellResult]) -> ComparisonSummary:
    """Every number behind the report."""
    uniform = next(a for a in grid.allocations if a.is_uniform)
    per_alloc: dict[str, list[CellResult]] = {a.name: [] for a in grid.allocations}
    for c in grid.cells:
        if c.name in results:
            per_alloc[c.allocation.name].append(results[c.name])

    u_loss = _by_seed(per_alloc[uniform.name], _loss)
    u_ppl = _by_seed(per_alloc[uniform.name], _ppl)
    allocations = [
        _allocation_entry(grid, a, per_alloc[a.name], u_loss, u_ppl) for a in grid.allocations
    ]
    times = {"train_s": 0.0, "val_s": 0.0, "zero_shot_s": 0.0, "novelty_s": 0.0}
    for r in results.values():
        times["train_s"] += r.train.wall_s or 0.0
        for k in ("val_s", "zero_shot_s", "novelty_s"):
            times[k] += (r.times or {}).get(k) or 0.0
    return ComparisonSummary(
        allocations=allocations,
        pilot=_pilot_summary(grid),
        run_times=times,
        execution=execution(grid, results),
        checks=_checks(grid, results),
        paper_comparison=_paper_comparison(allocations, grid.paper),
    )


def _allocation_entry(
    grid: Grid, a, rs: list[CellResult], u_loss: dict[int, float], u_ppl: dict[int, float]
) -> AllocationSummary:
    """Budget, per-seed numbers, summaries over seeds and the paired difference vs uniform of
    one allocation (`rs`: its results)."""
    b = grid.budget[a.name]
    loss_s, ppl_s = _by_seed(rs, _loss), _by_seed(rs, _ppl)
    diff = None
    if not a.is_uniform:
        diff = DiffVsUniform(
            stats.paired_difference(loss_s, u_loss), stats.paired_difference(ppl_s, u_ppl)
        )
    return AllocationSummary(
        name=a.name,
        label=a.label,
        taper=a.spec_string,
        widths=b["widths"],
        baseline_width=b["baseline_width"],
        heads=b.get("heads"),
        baseline_heads=b.get("baseline_heads"),
        kv_heads=b.get("kv_heads"),
        kv_cache_bytes_per_token_bf16=b.get("kv_cache_bytes_per_token_bf16"),
        widths_by_seed=b.get("widths_by_seed"),
        pilot=a.needs_pilot,
        params=b["params"],
        flops_per_token=b["flops_per_token"],
        paper_ppl=a.paper_ppl,
        seeds=sorted(loss_s),
        val_loss=stats.summary([loss_s[s] for s in sorted(loss_s)]),
        val_ppl=stats.summary([ppl_s[s] for s in sorted(ppl_s)]),
        tokens_per_s=stats.summary(list(_by_seed(rs, lambda r: r.train.tokens_per_s).values())),
        train_loss=stats.summary(list(_by_seed(rs, lambda r: r.train.train_loss).values())),
        diff_vs_uniform=diff,
        novelty=NoveltySummary(
            pearson_mlp=stats.summary(
                list(_by_seed(rs, lambda r: r.novelty.get("pearson_mlp")).values())
            ),
            pearson_block=stats.summary(
                list(_by_seed(rs, lambda r: r.novelty.get("pearson_block")).values())
            ),
            rho_mlp_per_layer=_layer_means(rs, "rho_mlp"),
            rho_block_per_layer=_layer_means(rs, "rho_block"),
            tokens=rs[0].novelty["n_tokens"] if rs else None,
        ),
        zero_shot=_zero_shot_summary(rs),
        per_seed={
            str(r.seed): SeedNumbers(
                val_loss=r.val.loss,
                val_ppl=r.val.ppl,
                val_tokens=r.val.tokens,
                train_loss=r.train.train_loss,
                tokens_per_s=r.train.tokens_per_s,
                train_wall_s=r.train.wall_s,
                pearson_mlp=r.novelty.get("pearson_mlp"),
                data_order_sha256=r.data_order.sha256,
                zero_shot=r.zero_shot.paper_row if r.zero_shot else None,
                times=r.times,
            )
            for r in sorted(rs, key=lambda r: r.seed)
        },
    )


# What a cell's numbers can depend on besides its config: recorded per session, compared here.
EXECUTION_KEYS = ("threads", "torch", "cpu_capability", "device")


def execution(grid: Grid, results: dict[str, CellResult]) -> Execution:
    """How the cells actually ran: every distinct (threads, torch, CPU capability, device) of
    their training and evaluation sessions with the cells (and steps) it covered, and the
    numbers of cells run at a time. `consistent` is False when cells or parts of one cell ran
    with different settings (their numbers may then differ in the last bits from a rerun)."""
    combos: dict[tuple, tuple[list[str], list[int]]] = {}  # key -> (cells, [train steps])
    jobs: set[int] = set()
    for c in grid.cells:
        r = results.get(c.name)
        if r is None:
            continue
        for sess in r.sessions:
            key = tuple(sess.get(k) for k in EXECUTION_KEYS)
            cells, steps = combos.setdefault(key, ([], [0]))
            if c.name not in cells:
                cells.append(c.name)
            if sess.get("phase") == "train":
                steps[0] += int(sess.get("to_step", 0)) - int(sess.get("from_step", 0))
            if isinstance(sess.get("jobs"), int):
                jobs.add(sess["jobs"])
    settings = [
        ExecutionSetting(*key, cells=cells, train_steps=steps[0])
        for key, (cells, steps) in combos.items()
    ]
    return Execution(
        settings=settings,
        jobs=sorted(jobs),
        consistent=len(combos) <= 1,
        single_thread=all(e.threads == 1 for e in settings),
    )


def _pilot_summary(grid: Grid) -> PilotSummary | None:
    """The pilots' cost (novelty:pilot allocations): tokens per pilot, its share of a run's
    tokens, and mean training / novelty seconds per seed."""
    if grid.pilot is None:
        return None
    runs = grid.pilot.per_seed.values()
    train_s = [r.train_s for r in runs if r.train_s is not None]
    novelty_s = [r.novelty_s for r in runs if r.novelty_s is not None]
    return PilotSummary(
        tokens=grid.pilot.tokens,
        fraction_of_run=grid.pilot.tokens / grid.base.train.tokens,
        train_s=stats.summary(train_s),
        novelty_s=stats.summary(novelty_s),
        per_seed={str(seed): run for seed, run in grid.pilot.per_seed.items()},
    )


def _zero_shot_summary(rs: list[CellResult]) -> dict[str, ZeroShotColumn] | None:
    rows = [r.zero_shot.paper_row for r in rs if r.zero_shot]
    rows = [x for x in rows if x]
    if not rows:
        return None
    out = {}
    for col in rows[0]:
        vals = [x[col] for x in rows if x.get(col) is not None]
        if vals:
            out[col] = ZeroShotColumn(*dataclasses.astuple(stats.summary(vals)))
    _mark_chance(out, rs)
    return out


def _mark_chance(columns: dict[str, ZeroShotColumn], rs: list[CellResult]) -> None:
    """Sets `chance` (the no-skill accuracy, %) and `at_chance` (the mean is not significantly
    above it) of the accuracy columns whose task has a chance level."""
    zs = next((r.zero_shot for r in rs if r.zero_shot and r.zero_shot.chance), None)
    if zs is None:
        return  # results from before chance levels were recorded
    task_of = {col.label: task.name for task, col in paper_columns()}
    for col, chance in chance_columns(zs.chance).items():
        entry = columns.get(col)
        if entry is not None and entry.mean is not None:
            n = zs.tasks[task_of[col]].n
            columns[col] = dataclasses.replace(
                entry, chance=chance, at_chance=at_chance(entry.mean, chance, n)
            )


def _checks(grid: Grid, results: dict[str, CellResult]) -> DesignChecks:
    params = {grid.budget[a.name]["params"] for a in grid.allocations}
    flops = {grid.budget[a.name]["flops_per_token"] for a in grid.allocations}
    order_ok, init_ok = True, True
    for seed in grid.seeds:
        shas = {
            results[c.name].data_order.sha256
            for c in grid.cells
            if c.seed == seed and c.name in results
        }
        order_ok &= len(shas) <= 1
    for c in grid.cells:
        if c.name in results:
            init_ok &= results[c.name].config["train"]["seed"] == c.seed
    distinct = {
        results[c.name].data_order.sha256
        for c in grid.cells
        if c.allocation.is_uniform and c.name in results
    }
    return DesignChecks(
        equal_params=len(params) == 1,
        equal_flops_per_token=len(flops) == 1,
        same_data_order_within_seed=order_ok,
        distinct_data_order_across_seeds=len(distinct)
        == len([c for c in grid.cells if c.allocation.is_uniform and c.name in results]),
        init_seed_equals_seed=init_ok,
    )


def _paper_comparison(
    allocations: list[AllocationSummary], mode: str | None
) -> PaperComparison | None:
    have = [a for a in allocations if a.paper_ppl is not None and a.val_ppl.mean is not None]
    if len(have) < 2:
        return None
    ours = {a.name: a.val_ppl.mean for a in have}
    ref = {a.name: a.paper_ppl for a in have}
    names = list(ref)
    return PaperComparison(
        allocations=names,
        ours_val_ppl=ours,
        paper_val_ppl=ref,
        spearman=stats.spearman([ours[n] for n in names], [ref[n] for n in names]),
        pairwise=stats.pairwise_agreement(ours, ref),
        best_ours=min(names, key=lambda n: ours[n]),
        best_paper=min(names, key=lambda n: ref[n]),
        sweep_claims=_sweep_claims(have) if mode == "sweep" else None,
    )


def _sweep_claims(have: list[AllocationSummary]) -> SweepClaims:
    """The paper's §4 claims checked on our numbers."""
    table: dict[tuple[float, float], dict[str, float]] = {}
    for a in have:
        spec = TaperSpec.parse(a.taper)
        if spec.schedule in SWEEP_SCHEDULES:
            table.setdefault((spec.start, spec.end), {})[spec.schedule] = a.val_ppl.mean
    per_ratio = {}
    for ratio in PAPER_SWEEP:
        row = table.get(ratio, {})
        if all(s in row for s in SWEEP_SCHEDULES):
            per_ratio[f"{ratio[0]}->{ratio[1]}"] = RatioOrdering(
                ours=row, ordered=row["cosine"] < row["linear"] < row["sigmoid"]
            )
    cos = {r: t["cosine"] for r, t in table.items() if "cosine" in t}
    best = min(cos, key=lambda r: cos[r]) if cos else None
    return SweepClaims(
        per_ratio=per_ratio,
        ordering_holds_at=sum(v.ordered for v in per_ratio.values()),
        ratios=len(per_ratio),
        best_cosine_ratio_ours=None if best is None else f"{best[0]}->{best[1]}",
        best_cosine_ratio_paper=PAPER_BEST_SWEEP_RATIO,
    )
