"""The numbers behind a comparison report: per allocation, budgets and summaries over seeds
(mean, sample std), paired differences vs uniform with t intervals (`taperlm.stats`), novelty
correlations, zero-shot rows, the design checks and the comparison with the paper.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from taperlm import stats
from taperlm.compare.grid import Grid
from taperlm.compare.paper import PAPER_BEST_SWEEP_RATIO, PAPER_SWEEP, SWEEP_SCHEDULES
from taperlm.evaluation.suite import at_chance, chance_columns, paper_columns
from taperlm.taper import TaperSpec

if TYPE_CHECKING:
    from taperlm.compare.runner import CellResult


@dataclass
class AllocationSummary:
    """One allocation of a comparison over its seeds: report.json's entry of `allocations`
    (`to_json` writes it, field for field and in that order). A statistic over seeds is
    `taperlm.stats.summary`'s record (mean, std, n, ...); a paired difference is
    `taperlm.stats.paired_difference`'s (mean, std, n, ci, excludes_zero)."""

    name: str  # the allocation's name (its cells' folder prefix)
    label: str  # its label (tables, plots)
    taper: str  # its taper spec
    widths: list[int]  # MLP width per layer
    baseline_width: int  # the uniform model's MLP width
    heads: list[int] | None  # attention heads per layer (None: not recorded)
    baseline_heads: int | None  # the uniform model's heads
    kv_heads: list[int] | None  # KV heads per layer
    kv_cache_bytes_per_token_bf16: int | None  # its KV cache per token in bf16
    widths_by_seed: dict[str, Any] | None  # per seed, when the widths depend on it (pilots)
    pilot: bool  # whether its widths come from a novelty pilot
    params: int  # parameters
    flops_per_token: int  # training FLOPs per token
    paper_ppl: float | None  # the paper's perplexity for it (None: not in the paper)
    seeds: list[int]  # the seeds with a result
    val_loss: dict[str, Any]  # statistic over seeds of the validation loss
    val_ppl: dict[str, Any]  # ... of the validation perplexity
    tokens_per_s: dict[str, Any]  # ... of the training throughput
    train_loss: dict[str, Any]  # ... of the final training loss
    # paired differences vs uniform of val_loss and val_ppl (None: uniform itself)
    diff_vs_uniform: dict[str, Any] | None
    # pearson_mlp, pearson_block (statistics over seeds), rho_*_per_layer (means), tokens
    novelty: dict[str, Any]
    zero_shot: dict[str, Any] | None  # column -> statistic over seeds (None: no tasks)
    per_seed: dict[str, dict[str, Any]]  # seed -> its cell's numbers

    def to_json(self) -> dict[str, Any]:
        """report.json's entry."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AllocationSummary:
        """The entry `to_json` wrote."""
        return cls(**{f.name: data.get(f.name) for f in fields(cls)})


@dataclass
class ComparisonSummary:
    """Every number behind a comparison's report: report.json's keys between `base_config` and
    `runs` (`to_json` writes them in that order, the extras last)."""

    allocations: list[AllocationSummary]  # per allocation, in the grid's order
    pilot: dict[str, Any] | None  # the pilots' cost (None: no novelty:pilot allocation)
    run_times: dict[str, float]  # seconds summed over the cells: train_s, val_s, ...
    execution: dict[str, Any]  # how the cells ran (`execution`)
    checks: dict[str, bool]  # the design checks (equal budgets, data orders, init seeds)
    paper_comparison: dict[str, Any] | None  # agreement with the paper (None: < 2 in it)
    # other parts' numbers (e.g. "stopping", "lr_tuning"), in the order they were added
    extras: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """report.json's keys of the summary."""
        return {
            "allocations": [a.to_json() for a in self.allocations],
            "pilot": self.pilot,
            "run_times": self.run_times,
            "execution": self.execution,
            "checks": self.checks,
            "paper_comparison": self.paper_comparison,
            **self.extras,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ComparisonSummary:
        """The summary in a report.json `to_json` wrote (its other keys: meta, base_config,
        runs, are not the summary's)."""
        known = {"allocations", "pilot", "run_times", "execution", "checks", "paper_comparison"}
        return cls(
            allocations=[AllocationSummary.from_json(a) for a in data["allocations"]],
            pilot=data.get("pilot"),
            run_times=data["run_times"],
            execution=data["execution"],
            checks=data["checks"],
            paper_comparison=data.get("paper_comparison"),
            extras={
                k: v
                for k, v in data.items()
                if k not in known and k not in ("meta", "base_config", "runs")
            },
        )


def _loss(r: CellResult) -> float:
    return r.val["loss"]


def _ppl(r: CellResult) -> float:
    return r.val["ppl"]


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
        times["train_s"] += r.train.get("wall_s") or 0.0
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
    entry: dict[str, Any] = {
        "name": a.name,
        "label": a.label,
        "taper": a.spec_string,
        "widths": b["widths"],
        "baseline_width": b["baseline_width"],
        "heads": b.get("heads"),
        "baseline_heads": b.get("baseline_heads"),
        "kv_heads": b.get("kv_heads"),
        "kv_cache_bytes_per_token_bf16": b.get("kv_cache_bytes_per_token_bf16"),
        "widths_by_seed": b.get("widths_by_seed"),
        "pilot": a.needs_pilot,
        "params": b["params"],
        "flops_per_token": b["flops_per_token"],
        "paper_ppl": a.paper_ppl,
        "seeds": sorted(loss_s),
        "val_loss": stats.summary([loss_s[s] for s in sorted(loss_s)]).to_json(),
        "val_ppl": stats.summary([ppl_s[s] for s in sorted(ppl_s)]).to_json(),
        "tokens_per_s": stats.summary(
            list(_by_seed(rs, lambda r: r.train.get("tokens_per_s")).values())
        ).to_json(),
        "train_loss": stats.summary(
            list(_by_seed(rs, lambda r: r.train.get("train_loss")).values())
        ).to_json(),
        "diff_vs_uniform": None,
        "novelty": {
            "pearson_mlp": stats.summary(
                list(_by_seed(rs, lambda r: r.novelty.get("pearson_mlp")).values())
            ).to_json(),
            "pearson_block": stats.summary(
                list(_by_seed(rs, lambda r: r.novelty.get("pearson_block")).values())
            ).to_json(),
            "rho_mlp_per_layer": _layer_means(rs, "rho_mlp"),
            "rho_block_per_layer": _layer_means(rs, "rho_block"),
            "tokens": rs[0].novelty["n_tokens"] if rs else None,
        },
        "zero_shot": _zero_shot_summary(rs),
        "per_seed": {
            str(r.seed): {
                "val_loss": r.val["loss"],
                "val_ppl": r.val["ppl"],
                "val_tokens": r.val["tokens"],
                "train_loss": r.train.get("train_loss"),
                "tokens_per_s": r.train.get("tokens_per_s"),
                "train_wall_s": r.train.get("wall_s"),
                "pearson_mlp": r.novelty.get("pearson_mlp"),
                "data_order_sha256": r.data_order["sha256"],
                "zero_shot": r.zero_shot.get("paper_row"),
                "times": r.times,
            }
            for r in sorted(rs, key=lambda r: r.seed)
        },
    }
    if not a.is_uniform:
        entry["diff_vs_uniform"] = {
            "val_loss": stats.paired_difference(loss_s, u_loss).to_json(),
            "val_ppl": stats.paired_difference(ppl_s, u_ppl).to_json(),
        }
    return AllocationSummary(**entry)


# What a cell's numbers can depend on besides its config: recorded per session, compared here.
EXECUTION_KEYS = ("threads", "torch", "cpu_capability", "device")


def execution(grid: Grid, results: dict[str, CellResult]) -> dict[str, Any]:
    """How the cells actually ran: every distinct (threads, torch, CPU capability, device) of
    their training and evaluation sessions with the cells (and steps) it covered, and the
    numbers of cells run at a time. `consistent` is False when cells or parts of one cell ran
    with different settings (their numbers may then differ in the last bits from a rerun)."""
    combos: dict[tuple, dict[str, Any]] = {}
    jobs: set[int] = set()
    for c in grid.cells:
        r = results.get(c.name)
        if r is None:
            continue
        for sess in r.sessions:
            key = tuple(sess.get(k) for k in EXECUTION_KEYS)
            entry = combos.setdefault(
                key, {**dict(zip(EXECUTION_KEYS, key)), "cells": [], "train_steps": 0}
            )
            if c.name not in entry["cells"]:
                entry["cells"].append(c.name)
            if sess.get("phase") == "train":
                entry["train_steps"] += int(sess.get("to_step", 0)) - int(sess.get("from_step", 0))
            if isinstance(sess.get("jobs"), int):
                jobs.add(sess["jobs"])
    return {
        "settings": list(combos.values()),
        "jobs": sorted(jobs),
        "consistent": len(combos) <= 1,
        "single_thread": all(e["threads"] == 1 for e in combos.values()),
    }


def _pilot_summary(grid: Grid) -> dict[str, Any] | None:
    """The pilots' cost (novelty:pilot allocations): tokens per pilot, its share of a run's
    tokens, and mean training / novelty seconds per seed."""
    if grid.pilot is None:
        return None
    runs = grid.pilot.per_seed.values()
    train_s = [r.train_s for r in runs if r.train_s is not None]
    novelty_s = [r.novelty_s for r in runs if r.novelty_s is not None]
    return {
        "tokens": grid.pilot.tokens,
        "fraction_of_run": grid.pilot.tokens / grid.base.train.tokens,
        "train_s": stats.summary(train_s).to_json(),
        "novelty_s": stats.summary(novelty_s).to_json(),
        "per_seed": grid.pilot.per_seed_record(),
    }


def _zero_shot_summary(rs: list[CellResult]) -> dict[str, Any] | None:
    rows = [r.zero_shot.get("paper_row") for r in rs]
    rows = [x for x in rows if x]
    if not rows:
        return None
    out = {}
    for col in rows[0]:
        vals = [x[col] for x in rows if x.get(col) is not None]
        if vals:
            out[col] = stats.summary(vals).to_json()
    _mark_chance(out, rs)
    return out


def _mark_chance(columns: dict[str, Any], rs: list[CellResult]) -> None:
    """Adds `chance` (the no-skill accuracy, %) and `at_chance` (the mean is not significantly
    above it) to the accuracy columns whose task has a chance level."""
    zs = next((r.zero_shot for r in rs if r.zero_shot.get("chance")), None)
    if zs is None:
        return  # results from before chance levels were recorded
    task_of = {col.label: task.name for task, col in paper_columns()}
    for col, chance in chance_columns(zs["chance"]).items():
        entry = columns.get(col)
        if entry is not None and entry["mean"] is not None:
            n = zs["tasks"][task_of[col]]["n"]
            entry["chance"] = chance
            entry["at_chance"] = at_chance(entry["mean"], chance, n)


def _checks(grid: Grid, results: dict[str, CellResult]) -> dict[str, Any]:
    params = {grid.budget[a.name]["params"] for a in grid.allocations}
    flops = {grid.budget[a.name]["flops_per_token"] for a in grid.allocations}
    order_ok, init_ok = True, True
    for seed in grid.seeds:
        shas = {
            results[c.name].data_order["sha256"]
            for c in grid.cells
            if c.seed == seed and c.name in results
        }
        order_ok &= len(shas) <= 1
    for c in grid.cells:
        if c.name in results:
            init_ok &= results[c.name].config["train"]["seed"] == c.seed
    distinct = {
        results[c.name].data_order["sha256"]
        for c in grid.cells
        if c.allocation.is_uniform and c.name in results
    }
    return {
        "equal_params": len(params) == 1,
        "equal_flops_per_token": len(flops) == 1,
        "same_data_order_within_seed": order_ok,
        "distinct_data_order_across_seeds": len(distinct)
        == len([c for c in grid.cells if c.allocation.is_uniform and c.name in results]),
        "init_seed_equals_seed": init_ok,
    }


def _paper_comparison(
    allocations: list[AllocationSummary], mode: str | None
) -> dict[str, Any] | None:
    have = [a for a in allocations if a.paper_ppl is not None and a.val_ppl["mean"] is not None]
    if len(have) < 2:
        return None
    ours = {a.name: a.val_ppl["mean"] for a in have}
    ref = {a.name: a.paper_ppl for a in have}
    names = list(ref)
    out: dict[str, Any] = {
        "allocations": names,
        "ours_val_ppl": ours,
        "paper_val_ppl": ref,
        "spearman": stats.spearman([ours[n] for n in names], [ref[n] for n in names]),
        "pairwise": stats.pairwise_agreement(ours, ref).to_json(),
        "best_ours": min(names, key=lambda n: ours[n]),
        "best_paper": min(names, key=lambda n: ref[n]),
    }
    if mode == "sweep":
        out["sweep_claims"] = _sweep_claims(have)
    return out


def _sweep_claims(have: list[AllocationSummary]) -> dict[str, Any]:
    """The paper's §4 claims checked on our numbers."""
    table: dict[tuple[float, float], dict[str, float]] = {}
    for a in have:
        spec = TaperSpec.parse(a.taper)
        if spec.schedule in SWEEP_SCHEDULES:
            table.setdefault((spec.start, spec.end), {})[spec.schedule] = a.val_ppl["mean"]
    per_ratio = {}
    for ratio in PAPER_SWEEP:
        row = table.get(ratio, {})
        if all(s in row for s in SWEEP_SCHEDULES):
            per_ratio[f"{ratio[0]}->{ratio[1]}"] = {
                "ours": row,
                "cosine<linear<sigmoid": row["cosine"] < row["linear"] < row["sigmoid"],
            }
    cos = {r: t["cosine"] for r, t in table.items() if "cosine" in t}
    best = min(cos, key=lambda r: cos[r]) if cos else None
    return {
        "per_ratio": per_ratio,
        "ordering_holds_at": sum(v["cosine<linear<sigmoid"] for v in per_ratio.values()),
        "ratios": len(per_ratio),
        "best_cosine_ratio_ours": None if best is None else f"{best[0]}->{best[1]}",
        "best_cosine_ratio_paper": PAPER_BEST_SWEEP_RATIO,
    }
