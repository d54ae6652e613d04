"""`TaperLMConfig`: the Hugging Face config of an exported taperlm model.

It carries our resolved `ModelConfig` as a plain dict (`taperlm`, incl. the per-layer widths,
which are authoritative) and mirrors the fields other tools read (vocab_size, hidden_size,
num_hidden_layers, num_attention_heads, max_position_embeddings).
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

from taperlm.config import ModelConfig, from_dict


class TaperLMConfig(PretrainedConfig):
    model_type = "taperlm"

    def __init__(self, taperlm: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.taperlm = dict(taperlm or {})
        m = self.taperlm
        # Mirrors for generic tooling (lm-eval reads max_position_embeddings as max_length).
        kwargs.setdefault("vocab_size", m.get("vocab_size"))
        kwargs.setdefault("hidden_size", m.get("d_model"))
        kwargs.setdefault("num_hidden_layers", m.get("n_layers"))
        kwargs.setdefault("num_attention_heads", m.get("n_heads"))
        kwargs.setdefault("max_position_embeddings", m.get("context_length"))
        kwargs.setdefault("tie_word_embeddings", bool(m.get("tie_embeddings", False)))
        # generate() decodes incrementally (attention: a transformers cache; Titans: its own).
        kwargs.setdefault("use_cache", True)
        super().__init__(**kwargs)

    def model_config(self):
        """Our `ModelConfig`, rebuilt from the stored dict without recomputing widths."""

        return from_dict(ModelConfig, dict(self.taperlm), "taperlm")
