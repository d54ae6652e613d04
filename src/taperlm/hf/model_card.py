"""The model card (README.md) of an exported model: what the model is (family, per-layer MLP
widths and heads, the budget beside its uniform baseline, as `taperlm plan` prints them), how it
was trained (the run's settings) and how to load it."""

from __future__ import annotations

from typing import Any

from taperlm.config.budget import format_plan, plan
from taperlm.spec.taper import describe

# The run settings a reader needs to judge or reproduce a training run, in this order.
TRAIN_SETTINGS = (
    "tokens",
    "batch_tokens",
    "seq_len",
    "micro_batch_size",
    "lr",
    "schedule",
    "min_lr_ratio",
    "warmup_tokens",
    "weight_decay",
    "grad_clip",
    "eps",
    "precision",
    "parallel",
    "seed",
)


def model_card(model_cfg: Any, run_config: Any = None, name: str = "taperlm model") -> str:
    """Markdown (with Hugging Face Hub front matter) describing `model_cfg` (a resolved
    ModelConfig) and, when given, the `run_config` (RunConfig) it was trained with."""
    cfg = model_cfg
    p = plan(cfg)
    heads = [cfg.attention_heads(i) for i in range(cfg.n_layers)]
    lines = [
        "---",
        "library_name: taperlm",
        "pipeline_tag: text-generation",
        "tags:",
        "- taperlm",
        "- tapered-language-model",
        "---",
        "",
        f"# {name}",
        "",
        f"A Tapered Language Model: {cfg.family} family, {cfg.n_layers} layers, d_model "
        f"{cfg.d_model}, vocabulary {cfg.vocab_size}, context {cfg.context_length}, "
        f"{p.total_params:,} parameters. Its MLP widths follow the taper "
        f"`{cfg.taper.to_string()}` ({describe(cfg.taper)}) and its attention heads the head "
        f"taper `{cfg.head_taper.as_text()}` ({describe(cfg.head_taper_spec())}), at the parameter and FLOP budget of the uniform model "
        f"(MLP width {cfg.mlp_width}, {cfg.n_heads} heads in every layer).",
        "",
        "## Layers and budget",
        "",
        f"- MLP widths: {list(cfg.mlp_widths)}",
        f"- query heads: {[h for h, _ in heads]}",
        f"- KV heads: {[kv for _, kv in heads]}",
        f"- head dim {cfg.head_dim}, RoPE theta {cfg.rope_theta:g}, RMSNorm eps "
        f"{cfg.norm_eps:g}, tied embeddings: {'yes' if cfg.tie_embeddings else 'no'}",
        f"- parameters: {p.total_params:,} (uniform baseline {p.baseline_total_params:,}); "
        f"training FLOPs/token at context {p.seq_len}: {p.flops_per_token:,} (baseline "
        f"{p.baseline_flops_per_token:,})",
        "",
        "`taperlm plan` of this model:",
        "",
        "```text",
        format_plan(p),
        "```",
    ]
    if run_config is not None:
        train = run_config.train
        lines += [
            "",
            "## Training",
            "",
            "| setting | value |",
            "| --- | --- |",
            *(f"| train.{k} | {getattr(train, k)} |" for k in TRAIN_SETTINGS if hasattr(train, k)),
            f"| data.dir | {run_config.data.dir or '(none)'} |",
        ]
    lines += [
        "",
        "## Use",
        "",
        "```python",
        "import taperlm  # registers the model with transformers' Auto classes",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        'model = AutoModelForCausalLM.from_pretrained("PATH", trust_remote_code=True)',
        'tokenizer = AutoTokenizer.from_pretrained("PATH")',
        "```",
        "",
        "PATH is this folder. It needs `pip install taperlm`; `taperlm generate PATH` and `taperlm eval PATH` run it "
        "directly.",
        "",
    ]
    return "\n".join(lines)
