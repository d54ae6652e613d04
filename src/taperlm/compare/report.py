"""The comparison report: statistics over seeds, report.json, report.md and the PNGs.

Statistics (see `taperlm.stats`):
- per allocation: mean and sample std over seeds of val loss, val ppl, tokens/s, train loss;
- paired difference vs uniform per seed (same seed = same data order and init seed), mean, std,
  n and the 95% Student-t confidence interval; a CI that excludes 0 is marked `*`;
- novelty: Pearson r of rho_mlp (and rho_block) with depth, mean ± std over seeds, and the
  per-layer rho means averaged over seeds;
- paper comparison (allocations the paper reports): Spearman rank correlation between our mean
  val ppl and the paper's, the fraction of allocation pairs ordered as in the paper (pairs tied
  in the paper skipped), and for the sweep the paper's two claims (cosine < linear < sigmoid at
  every ratio; cosine best at 1.5 -> 0.5).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from taperlm import stats
from taperlm.compare.grid import PAPER_SWEEP, SWEEP_SCHEDULES, Grid
from taperlm.config import to_dict
from taperlm.io import atomic_write_json, atomic_write_text

PLOTS = {
    "widths": "widths.png",
    "val_loss": "val_loss.png",
    "val_loss_diff": "val_loss_diff.png",
    "novelty": "novelty.png",
}


# ----------------------------------------------------------------------------------------------
# numbers


def _by_seed(results: list[dict[str, Any]], get) -> dict[int, float]:
    out = {}
    for r in results:
        v = get(r)
        if v is not None:
            out[int(r["seed"])] = float(v)
    return out


def _layer_means(results: list[dict[str, Any]], key: str) -> list[float | None]:
    rows = [[(x[key] or {}).get("mean") for x in r["novelty"]["layers"]] for r in results]
    if not rows:
        return []
    out: list[float | None] = []
    for vals in zip(*rows):
        ok = [v for v in vals if v is not None]
        out.append(stats.mean(ok) if ok else None)
    return out


def summarize(grid: Grid, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every number behind the report (JSON-ready)."""
    uniform = next(a for a in grid.allocations if a.is_uniform)
    per_alloc: dict[str, list[dict[str, Any]]] = {a.name: [] for a in grid.allocations}
    for c in grid.cells:
        if c.name in results:
            per_alloc[c.allocation.name].append(results[c.name])

    def loss(r):
        return r["val"]["loss"]

    def ppl(r):
        return r["val"]["ppl"]

    u_loss = _by_seed(per_alloc[uniform.name], loss)
    u_ppl = _by_seed(per_alloc[uniform.name], ppl)
    allocations = []
    for a in grid.allocations:
        rs = per_alloc[a.name]
        b = grid.budget[a.name]
        loss_s, ppl_s = _by_seed(rs, loss), _by_seed(rs, ppl)
        entry: dict[str, Any] = {
            "name": a.name,
            "label": a.label,
            "taper": a.spec_string,
            "widths": b["widths"],
            "baseline_width": b["baseline_width"],
            "params": b["params"],
            "flops_per_token": b["flops_per_token"],
            "paper_ppl": a.paper_ppl,
            "seeds": sorted(loss_s),
            "val_loss": stats.summary([loss_s[s] for s in sorted(loss_s)]),
            "val_ppl": stats.summary([ppl_s[s] for s in sorted(ppl_s)]),
            "tokens_per_s": stats.summary(
                list(_by_seed(rs, lambda r: r["train"].get("tokens_per_s")).values())
            ),
            "train_loss": stats.summary(
                list(_by_seed(rs, lambda r: r["train"].get("train_loss")).values())
            ),
            "diff_vs_uniform": None,
            "novelty": {
                "pearson_mlp": stats.summary(
                    list(_by_seed(rs, lambda r: r["novelty"].get("pearson_mlp")).values())
                ),
                "pearson_block": stats.summary(
                    list(_by_seed(rs, lambda r: r["novelty"].get("pearson_block")).values())
                ),
                "rho_mlp_per_layer": _layer_means(rs, "rho_mlp"),
                "rho_block_per_layer": _layer_means(rs, "rho_block"),
                "tokens": rs[0]["novelty"]["n_tokens"] if rs else None,
            },
            "zero_shot": _zero_shot_summary(rs),
            "per_seed": {
                str(r["seed"]): {
                    "val_loss": r["val"]["loss"],
                    "val_ppl": r["val"]["ppl"],
                    "val_tokens": r["val"]["tokens"],
                    "train_loss": r["train"].get("train_loss"),
                    "tokens_per_s": r["train"].get("tokens_per_s"),
                    "train_wall_s": r["train"].get("wall_s"),
                    "pearson_mlp": r["novelty"].get("pearson_mlp"),
                    "data_order_sha256": r["data_order"]["sha256"],
                    "zero_shot": (r.get("zero_shot") or {}).get("paper_row"),
                    "times": r.get("times"),
                }
                for r in sorted(rs, key=lambda r: r["seed"])
            },
        }
        if not a.is_uniform:
            entry["diff_vs_uniform"] = {
                "val_loss": stats.paired_difference(loss_s, u_loss),
                "val_ppl": stats.paired_difference(ppl_s, u_ppl),
            }
        allocations.append(entry)
    times = {"train_s": 0.0, "val_s": 0.0, "zero_shot_s": 0.0, "novelty_s": 0.0}
    for r in results.values():
        times["train_s"] += r["train"].get("wall_s") or 0.0
        for k in ("val_s", "zero_shot_s", "novelty_s"):
            times[k] += (r.get("times") or {}).get(k) or 0.0
    return {
        "allocations": allocations,
        "run_times": times,
        "checks": _checks(grid, results),
        "paper_comparison": _paper_comparison(allocations, grid.paper),
    }


def _zero_shot_summary(rs: list[dict[str, Any]]) -> dict[str, Any] | None:
    rows = [(r.get("zero_shot") or {}).get("paper_row") for r in rs]
    rows = [x for x in rows if x]
    if not rows:
        return None
    out = {}
    for col in rows[0]:
        vals = [x[col] for x in rows if x.get(col) is not None]
        if vals:
            out[col] = stats.summary(vals)
    return out


def _checks(grid: Grid, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    params = {grid.budget[a.name]["params"] for a in grid.allocations}
    flops = {grid.budget[a.name]["flops_per_token"] for a in grid.allocations}
    order_ok, init_ok = True, True
    for seed in grid.seeds:
        shas = {
            results[c.name]["data_order"]["sha256"]
            for c in grid.cells
            if c.seed == seed and c.name in results
        }
        order_ok &= len(shas) <= 1
    for c in grid.cells:
        if c.name in results:
            init_ok &= results[c.name]["config"]["train"]["seed"] == c.seed
    distinct = {
        results[c.name]["data_order"]["sha256"]
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


def _paper_comparison(allocations: list[dict[str, Any]], mode: str | None) -> dict[str, Any] | None:
    have = [
        a for a in allocations if a["paper_ppl"] is not None and a["val_ppl"]["mean"] is not None
    ]
    if len(have) < 2:
        return None
    ours = {a["name"]: a["val_ppl"]["mean"] for a in have}
    ref = {a["name"]: a["paper_ppl"] for a in have}
    names = list(ref)
    out: dict[str, Any] = {
        "allocations": names,
        "ours_val_ppl": ours,
        "paper_val_ppl": ref,
        "spearman": stats.spearman([ours[n] for n in names], [ref[n] for n in names]),
        "pairwise": stats.pairwise_agreement(ours, ref),
        "best_ours": min(names, key=lambda n: ours[n]),
        "best_paper": min(names, key=lambda n: ref[n]),
    }
    if mode == "sweep":
        out["sweep_claims"] = _sweep_claims(have)
    return out


def _sweep_claims(have: list[dict[str, Any]]) -> dict[str, Any]:
    """The paper's §4 claims checked on our numbers."""
    from taperlm.taper import TaperSpec

    table: dict[tuple[float, float], dict[str, float]] = {}
    for a in have:
        spec = TaperSpec.parse(a["taper"])
        if spec.schedule in SWEEP_SCHEDULES:
            table.setdefault((spec.start, spec.end), {})[spec.schedule] = a["val_ppl"]["mean"]
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
        "best_cosine_ratio_paper": "1.5->0.5",
    }


# ----------------------------------------------------------------------------------------------
# plots


def _averaged_novelty(results: list[dict[str, Any]], label: str):
    """One NoveltyResult per allocation: per-layer statistics averaged over seeds."""
    from taperlm.analysis.novelty import NoveltyResult, TokenStats
    from taperlm.stats import pearson

    per_seed = [NoveltyResult.from_dict(r["novelty"]) for r in results]
    first = per_seed[0]

    def avg(key: str) -> list[TokenStats]:
        out = []
        for i in range(first.n_layers):
            layer = [getattr(p, key)[i] for p in per_seed]
            out.append(
                TokenStats(
                    mean=float(sum(s.mean for s in layer) / len(layer)),
                    std=float(sum(s.std for s in layer) / len(layer)),
                    median=float(sum(s.median for s in layer) / len(layer)),
                    p10=float(sum(s.p10 for s in layer) / len(layer)),
                    p90=float(sum(s.p90 for s in layer) / len(layer)),
                    n=sum(s.n for s in layer),
                )
            )
        return out

    rb, rm = avg("rho_block"), avg("rho_mlp")
    depth = list(range(first.n_layers))
    return NoveltyResult(
        name=label,
        rho_block=rb,
        rho_mlp=rm,
        mlp_widths=first.mlp_widths,
        pearson_block=pearson(depth, [s.mean for s in rb]),
        pearson_mlp=pearson(depth, [s.mean for s in rm]),
        n_tokens=first.n_tokens,
        n_windows=first.n_windows,
        seq_len=first.seq_len,
        skip_first=first.skip_first,
        layers_path=first.layers_path,
        mlp_name=first.mlp_name,
        aggregation=first.aggregation,
    )


def _diff_curves(
    curves: dict[int, list[list[float]]], base: dict[int, list[list[float]]]
) -> list[list[list[float]]]:
    """Per seed: [tokens, loss - uniform loss] at the evaluations both runs made."""
    out = []
    for seed, pts in curves.items():
        ref = {t: v for t, v in base.get(seed, [])}
        diff = [[t, v - ref[t]] for t, v in pts if t in ref]
        if diff:
            out.append(diff)
    return out


def _plot_diff(curves: dict[str, list[list[list[float]]]], path: Path) -> Path:
    import numpy as np
    from matplotlib.figure import Figure
    from matplotlib.ticker import EngFormatter

    fig = Figure(figsize=(7.0, 4.5), dpi=120, layout="constrained")
    ax = fig.subplots()
    for label, runs in curves.items():
        if not runs:
            continue
        grid = sorted(set.intersection(*(set(t for t, _ in r) for r in runs)))
        ys = np.array([[dict(map(tuple, r))[t] for t in grid] for r in runs])
        mean = ys.mean(axis=0)
        (line,) = ax.plot(grid, mean, linewidth=1.6, label=f"{label} (n={len(runs)})")
        if len(runs) > 1:
            sd = ys.std(axis=0, ddof=1)
            ax.fill_between(grid, mean - sd, mean + sd, color=line.get_color(), alpha=0.2)
    ax.axhline(0.0, color="0.3", linestyle="--", linewidth=1.2, label="uniform")
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))
    ax.set_xlabel("tokens seen")
    ax.set_ylabel("val loss − uniform (same seed), nats/token")
    ax.set_title("Paired validation-loss difference vs uniform (mean ± 1 std over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def write_plots(grid: Grid, results: dict[str, dict[str, Any]], out_dir: Path) -> dict[str, str]:
    """The PNGs (file names relative to out_dir)."""
    from taperlm.analysis.plots import plot_loss_curves, plot_novelty, plot_width_profiles

    written: dict[str, str] = {}
    by_alloc = {
        a.name: [results[c.name] for c in grid.cells if c.allocation is a and c.name in results]
        for a in grid.allocations
    }
    profiles = {
        a.label: grid.budget[a.name]["widths"] for a in grid.allocations if not a.is_uniform
    }
    uniform = next(a for a in grid.allocations if a.is_uniform)
    if not profiles:
        profiles = {uniform.label: grid.budget[uniform.name]["widths"]}
    baseline = grid.budget[uniform.name]["baseline_width"]
    plot_width_profiles(
        profiles, baseline, out_dir / PLOTS["widths"], title="MLP width per layer (equal budget)"
    )
    written["widths"] = PLOTS["widths"]

    curves = {
        a.label: [r["curve"] for r in by_alloc[a.name] if r["curve"]] for a in grid.allocations
    }
    curves = {k: v for k, v in curves.items() if v}
    if curves:
        plot_loss_curves(curves, out_dir / PLOTS["val_loss"], title="Validation loss")
        written["val_loss"] = PLOTS["val_loss"]
        base = {r["seed"]: r["curve"] for r in by_alloc[uniform.name]}
        diffs = {
            a.label: _diff_curves({r["seed"]: r["curve"] for r in by_alloc[a.name]}, base)
            for a in grid.allocations
            if not a.is_uniform
        }
        if any(diffs.values()):
            _plot_diff(diffs, out_dir / PLOTS["val_loss_diff"])
            written["val_loss_diff"] = PLOTS["val_loss_diff"]

    nov = {
        a.label: _averaged_novelty(by_alloc[a.name], a.label)
        for a in grid.allocations
        if by_alloc[a.name]
    }
    if nov:
        n_seeds = max(len(v) for v in by_alloc.values())
        plot_novelty(
            nov,
            out_dir / PLOTS["novelty"],
            title=f"Layer-wise novelty (per-layer means averaged over {n_seeds} seed(s))",
        )
        written["novelty"] = PLOTS["novelty"]
    return written


# ----------------------------------------------------------------------------------------------
# markdown


def _pm(s: dict[str, Any], fmt: str) -> str:
    if s["mean"] is None:
        return "–"
    if s["std"] is None:
        return format(s["mean"], fmt)
    return f"{format(s['mean'], fmt)} ± {format(s['std'], fmt.lstrip('+'))}"


def _diff(d: dict[str, Any] | None, fmt: str) -> str:
    if d is None:
        return "(baseline)"
    if d["mean"] is None:
        return "–"
    m = format(d["mean"], "+" + fmt)
    if d["ci"] is None:
        return f"{m} (n=1, no CI)"
    lo, hi = (format(x, "+" + fmt) for x in d["ci"])
    return f"{m} [{lo}, {hi}]" + (" *" if d["excludes_zero"] else "")


def _table(head: Sequence[str], rows: list[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def render_markdown(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    allocs = summary["allocations"]
    s = meta["settings"]
    m = meta["model"]
    lines = [
        f"# taperlm compare — {meta['title']}",
        "",
        "Produced by:",
        "",
        "```",
        meta["command"],
        "```",
        "",
        f"- model: {m['family']}, {m['n_layers']} layers, d_model {m['d_model']}, "
        f"{m['n_heads']} heads, baseline MLP width {m['mlp_width']}, vocab {m['vocab_size']}",
        f"- training per run: {s['tokens']:,} tokens ({s['steps']} steps of "
        f"{s['batch_tokens']:,} tokens, seq_len {s['seq_len']}), peak lr {s['lr']:g}, "
        f"warmup {s['warmup_tokens']:,} tokens; seeds {s['seeds']}",
        f"- data: `{s['data_dir']}` (train {s['train_tokens']:,} tokens); validation on the "
        f"first {s['val_tokens']:,} tokens of its val split (the same for every run)",
        f"- {len(allocs)} allocations x {len(s['seeds'])} seeds = {meta['cells']} runs; "
        f"wall time {meta['wall_s'] / 60:.1f} min this invocation, "
        f"{meta.get('cpu_s', 0) / 60:.1f} CPU-min ({meta['threads']} torch thread(s)); "
        f"{meta['created']}",
        f"- summed over the runs (when each was trained/evaluated): training "
        f"{summary['run_times']['train_s'] / 60:.1f} min, validation + zero-shot + novelty "
        f"{sum(v for k, v in summary['run_times'].items() if k != 'train_s') / 60:.1f} min",
        "",
        "## Validation",
        "",
    ]
    show_paper = any(a["paper_ppl"] is not None for a in allocs)
    head = [
        "allocation",
        "taper",
        "params",
        "FLOPs/token",
        "tokens/s",
        "val loss",
        "val ppl",
        "Δ loss vs uniform [95% CI]",
        "Δ ppl vs uniform [95% CI]",
        "n",
    ]
    if show_paper:
        head.append("paper ppl (440M)")
    rows = []
    for a in allocs:
        d = a["diff_vs_uniform"]
        row = [
            a["label"],
            f"`{a['taper']}`",
            f"{a['params']:,}",
            f"{a['flops_per_token']:,}",
            _pm(a["tokens_per_s"], ",.0f"),
            _pm(a["val_loss"], ".4f"),
            _pm(a["val_ppl"], ".2f"),
            _diff(d and d["val_loss"], ".4f"),
            _diff(d and d["val_ppl"], ".2f"),
            str(a["val_loss"]["n"]),
        ]
        if show_paper:
            row.append("–" if a["paper_ppl"] is None else f"{a['paper_ppl']:.2f}")
        rows.append(row)
    lines += _table(head, rows)
    ck = summary["checks"]
    lines += [
        "",
        "Mean ± sample std over seeds. Δ = allocation − uniform of the same seed (same data "
        "order, same init seed), mean over seeds with the 95% Student-t interval "
        "mean ± t(0.975, n−1)·sd/√n; `*` = the interval excludes 0. Lower is better.",
        f"Checks: equal params {_yn(ck['equal_params'])}, equal FLOPs/token "
        f"{_yn(ck['equal_flops_per_token'])}, same data order within each seed "
        f"{_yn(ck['same_data_order_within_seed'])}, different across seeds "
        f"{_yn(ck['distinct_data_order_across_seeds'])}, init seed = seed "
        f"{_yn(ck['init_seed_equals_seed'])}.",
        "",
    ]
    pc = summary["paper_comparison"]
    if pc:
        lines += _paper_section(pc, allocs)
    zs = [a for a in allocs if a["zero_shot"]]
    if zs:
        cols = [c for c in zs[0]["zero_shot"] if c]
        lines += [
            "## Zero-shot",
            "",
            f"Tasks {', '.join(s['eval_tasks'])}, first {s['eval_limit'] or 'all'} items each "
            "(accuracies in %, mean ± std over seeds).",
            "",
        ]
        lines += _table(
            ["allocation", *cols],
            [[a["label"], *(_pm(a["zero_shot"][c], ".2f") for c in cols)] for a in zs],
        )
        lines.append("")
    lines += [
        "## Novelty",
        "",
        f"rho_mlp(l) = cos(F_l(z_l), h_l) and rho_block(l) = cos(h_(l+1) − h_l, h_l) per token, "
        f"averaged over {allocs[0]['novelty']['tokens']} tokens of {s['novelty_text']}; r = "
        "Pearson correlation of the per-layer means with depth (mean ± std over seeds). The "
        "paper measured r(rho_mlp) = 0.49–0.71 on GPT-2.",
        "",
    ]
    rows = []
    for a in allocs:
        pl = a["novelty"]["rho_mlp_per_layer"]
        rows.append(
            [
                a["label"],
                _pm(a["novelty"]["pearson_mlp"], "+.2f"),
                _pm(a["novelty"]["pearson_block"], "+.2f"),
                " ".join("–" if v is None else f"{v:+.2f}" for v in pl),
            ]
        )
    lines += _table(
        ["allocation", "r(rho_mlp, depth)", "r(rho_block, depth)", "rho_mlp per layer"], rows
    )
    lines += ["", "## Plots", ""]
    captions = {
        "widths": "MLP width per layer (uniform baseline dashed)",
        "val_loss": "validation loss vs tokens (mean ± 1 std over seeds)",
        "val_loss_diff": "paired validation-loss difference vs uniform during training",
        "novelty": "rho_mlp and rho_block per layer",
    }
    for key, file in meta["plots"].items():
        lines.append(f"- [{captions[key]}]({file})")
    lines += ["", f"![widths]({PLOTS['widths']})"]
    if "val_loss_diff" in meta["plots"]:
        lines.append(f"![val loss difference]({PLOTS['val_loss_diff']})")
    lines += ["", "## Per-seed validation loss", ""]
    seeds = s["seeds"]
    lines += _table(
        ["allocation", *(f"seed {x}" for x in seeds)],
        [
            [
                a["label"],
                *(
                    f"{a['per_seed'][str(x)]['val_loss']:.4f}" if str(x) in a["per_seed"] else "–"
                    for x in seeds
                ),
            ]
            for a in allocs
        ],
    )
    lines += [
        "",
        "Every number above (and per-seed values, curves, timings) is in `report.json`; each run "
        "is in `runs/<allocation>-s<seed>/` (config.yaml, metrics.jsonl, result.json).",
        "",
    ]
    return "\n".join(lines)


def _yn(ok: bool) -> str:
    return "yes" if ok else "**NO**"


def _paper_section(pc: dict[str, Any], allocs: list[dict[str, Any]]) -> list[str]:
    label = {a["name"]: a["label"] for a in allocs}
    pw = pc["pairwise"]
    order_ours = sorted(pc["allocations"], key=lambda n: pc["ours_val_ppl"][n])
    order_paper = sorted(pc["allocations"], key=lambda n: pc["paper_val_ppl"][n])
    sp = pc["spearman"]
    lines = [
        "## Against the paper",
        "",
        "The paper's numbers are validation perplexities of a 440M Transformer after 30B tokens "
        "(PAPER.md §3, §4), so only the *ordering* is comparable.",
        "",
        f"- ours, best to worst: {' < '.join(label[n] for n in order_ours)}",
        f"- paper, best to worst: {' < '.join(label[n] for n in order_paper)}",
        f"- Spearman rank correlation: {'n/a' if sp is None else f'{sp:+.2f}'}; pairs ordered as "
        f"in the paper: {pw['agree']}/{pw['pairs']}"
        + (
            f" (pairs tied in the paper skipped: {pw['ties_in_reference']})"
            if pw["ties_in_reference"]
            else ""
        ),
        f"- best allocation: ours {label[pc['best_ours']]}, paper {label[pc['best_paper']]}",
    ]
    u = next((a for a in allocs if a["diff_vs_uniform"] is None), None)
    u_ppl = u["val_ppl"]["mean"] if u else None
    u_paper = u["paper_ppl"] if u else None
    rows = []
    for a in allocs:
        if a["name"] not in pc["paper_val_ppl"]:
            continue
        d = a["diff_vs_uniform"]
        ours = "(baseline)"
        if d and d["val_ppl"]["mean"] is not None and u_ppl:
            ci = d["val_ppl"]["ci"]
            ours = f"{100 * d['val_ppl']['mean'] / u_ppl:+.2f}%" + (
                "" if ci is None else f" [{100 * ci[0] / u_ppl:+.2f}, {100 * ci[1] / u_ppl:+.2f}]"
            )
        paper = "(baseline)"
        if d is not None and u_paper:
            paper = f"{100 * (a['paper_ppl'] - u_paper) / u_paper:+.2f}%"
        rows.append(
            [a["label"], f"{a['val_ppl']['mean']:.2f}", ours, f"{a['paper_ppl']:.2f}", paper]
        )
    lines += [""]
    lines += _table(
        [
            "allocation",
            "our val ppl",
            "ours vs uniform [95% CI]",
            "paper val ppl",
            "paper vs uniform",
        ],
        rows,
    )
    lines += [""]
    if pw["disagreeing_pairs"]:
        shown = ", ".join(f"{label[p]} vs {label[q]}" for p, q in pw["disagreeing_pairs"][:12])
        more = len(pw["disagreeing_pairs"]) - 12
        lines.append(f"- ordered differently: {shown}" + (f" (+{more} more)" if more > 0 else ""))
    sc = pc.get("sweep_claims")
    if sc:
        lines.append(
            f"- cosine < linear < sigmoid holds at {sc['ordering_holds_at']}/{sc['ratios']} "
            f"ratios (paper: 5/5); best cosine ratio: ours {sc['best_cosine_ratio_ours']}, "
            f"paper {sc['best_cosine_ratio_paper']}"
        )
    lines.append("")
    return lines


# ----------------------------------------------------------------------------------------------
# writing


def write_report(
    grid: Grid, results: dict[str, dict[str, Any]], out_dir: Path, meta: dict[str, Any]
) -> tuple[Path, Path]:
    """report.json, report.md and the PNGs in out_dir."""
    summary = summarize(grid, results)
    meta = dict(meta)
    meta["plots"] = write_plots(grid, results, out_dir)
    doc = {
        "meta": meta,
        "base_config": to_dict(grid.base),
        **summary,
        "runs": {
            name: {k: v for k, v in r.items() if k != "config"} for name, r in results.items()
        },
    }
    md = render_markdown(summary, meta)
    json_path, md_path = out_dir / "report.json", out_dir / "report.md"
    atomic_write_json(json_path, doc)
    atomic_write_text(md_path, md)
    return md_path, json_path
