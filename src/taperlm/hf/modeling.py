"""`TaperLMForCausalLM`: a transformers `PreTrainedModel` wrapping our `TaperedLM`, so exported
models load with `AutoModelForCausalLM`, run under lm-eval's `hf` model and `generate()`.

Incremental decoding with the transformers cache API (`cache=`, `use_cache=True`, the output's
`cache`): attention families (transformer, gated, hope) decode with any growing transformers
cache (`DynamicCache`, what `generate()` makes) or a `TaperLMCache`; Titans layers keep memory
state that only a `TaperLMCache` holds, so the model makes one itself (an empty cache it is
given is replaced, and the one it returns is the one to pass back). Left padding is rejected:
the model has no attention mask.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from taperlm.hf.configuration import TaperLMConfig
from taperlm.models import TaperedLM
from taperlm.models.hope import tag_update_periods
from taperlm.models.layers import KVCache, Rotary

# The output field (and forward argument) is `cache` in current transformers, `past_key_values`
# in releases before the rename.
_CACHE_FIELD = (
    "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
)


class TaperLMCacheLayer(CacheLayerMixin):
    """One layer's taperlm decoding state (`TaperedLM.new_cache()`) as a transformers cache
    layer: reports its length and reorders its batch for beam search."""

    is_compileable = False  # shapes grow every step
    is_croppable = False  # a Titans memory cannot be rolled back
    supports_early_init = False

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        return None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ):
        return self.inner.update(key_states, value_states)

    def get_seq_length(self) -> int:
        return int(self.inner.get_seq_length())

    def get_max_length(self) -> int:
        return -1

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def offload(self) -> None:
        return None

    def prefetch(self) -> None:
        return None

    def reset(self) -> None:
        raise NotImplementedError("a TaperLMCache cannot be reset; make a new one")

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a TaperLMCache cannot be cropped (Titans memory has no undo)")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.inner.select(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.inner.select(indices)


class TaperLMCache(Cache):
    """A transformers `Cache` over `TaperedLM.new_cache()`: one `TaperLMCacheLayer` per block."""

    def __init__(self, layer_caches: list[Any]) -> None:
        super().__init__(layers=[TaperLMCacheLayer(c) for c in layer_caches])

    def layer_caches(self) -> list[Any]:
        return [layer.inner for layer in self.layers]


class _SharedCacheLayer:
    """Layer `i` of a transformers cache, with the two methods our attention calls."""

    def __init__(self, cache: Cache, i: int) -> None:
        self.cache, self.i = cache, i

    def get_seq_length(self) -> int:
        return self.cache.get_seq_length(self.i)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cache.update(k, v, self.i)


class TaperLMPreTrainedModel(PreTrainedModel):
    config_class = TaperLMConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = False
    _no_split_modules: ClassVar[list[str]] = ["Block"]

    def _init_weights(self, module: torch.nn.Module) -> None:
        # Weights come from the checkpoint (TaperedLM initialises itself on construction), but
        # transformers builds the model on the meta device, so the RoPE tables (non-persistent
        # buffers, not in the checkpoint) must be recomputed here.
        if isinstance(module, Rotary):
            cfg = self.config.model_config()
            fresh = Rotary.of_model(cfg)
            device = module.inv_freq.device
            if device.type == "meta":
                device = torch.device("cpu")
            module.inv_freq = fresh.inv_freq.to(device)
            module.cos = fresh.cos.to(device)
            module.sin = fresh.sin.to(device)


class TaperLMForCausalLM(TaperLMPreTrainedModel, GenerationMixin):
    def __init__(self, config: TaperLMConfig) -> None:
        super().__init__(config)
        self.model = TaperedLM(config.model_config())
        if config.tie_word_embeddings:
            self._tied_weights_keys = {"model.lm_head.weight": "model.embed.weight"}
        self.post_init()

    @classmethod
    def from_pretrained(cls, *args, **kwargs):  # type: ignore[override]
        model = super().from_pretrained(*args, **kwargs)
        # The loader replaces Parameter objects, dropping Hope's per-level `update_period` tags
        # that the trainer reads; restore them so a loaded model trains like ours.

        tag_update_periods(model.model)
        return model

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.model.embed

    def set_input_embeddings(self, value: torch.nn.Module) -> None:
        self.model.embed = value

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.model.lm_head

    def set_output_embeddings(self, value: torch.nn.Module) -> None:
        self.model.lm_head = value

    def _layer_caches(self, cache: Cache | None) -> tuple[Cache, list[Any]]:
        """The cache to decode with (and return) and its per-layer objects for our model."""
        if isinstance(cache, TaperLMCache):
            return cache, cache.layer_caches()
        own = self.model.new_cache()
        keys_values_only = all(isinstance(c, KVCache) for c in own)  # attention layers only
        if cache is None:
            cache = DynamicCache() if keys_values_only else TaperLMCache(own)
        elif not keys_values_only:
            if cache.get_seq_length() > 0:
                raise ValueError(
                    f"this model's layers keep state besides keys and values (a Titans memory) "
                    f"that a {type(cache).__name__} cannot hold; decode with the TaperLMCache "
                    "the model returns (pass cache=None to start one)"
                )
            cache = TaperLMCache(own)
        if isinstance(cache, TaperLMCache):
            return cache, cache.layer_caches()
        if cache.is_compileable:
            raise ValueError(
                f"{type(cache).__name__} is a fixed-size cache; TaperLMForCausalLM decodes with "
                "growing caches (DynamicCache, the default of generate())"
            )
        return cache, [_SharedCacheLayer(cache, i) for i in range(len(self.model.blocks))]

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int = 0,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        if input_ids is None:
            raise ValueError("TaperLMForCausalLM needs input_ids (inputs_embeds is not supported)")
        if cache is None:
            cache = kwargs.pop("past_key_values", None)  # the pre-5 name of `cache`
        if attention_mask is not None and not bool(attention_mask.all()):
            # Right padding never affects earlier positions of a causal model; left padding would.
            ones = attention_mask.long().cumsum(-1) == torch.arange(
                1, attention_mask.shape[-1] + 1, device=attention_mask.device
            )
            if not bool((ones == attention_mask.bool()).all()):
                raise ValueError(
                    "TaperLMForCausalLM has no attention mask: left padding is not supported; "
                    "use right padding (tokenizer.padding_side='right') or batch size 1"
                )
        if use_cache is None:
            use_cache = bool(getattr(self.config, "use_cache", True)) and not self.training
        # generate() asks for the last position's logits only (logits_to_keep=1).
        keep = logits_to_keep if labels is None else 0
        if use_cache or cache is not None:
            cache, layer_caches = self._layer_caches(cache)
            logits = self.model(input_ids, cache=layer_caches, logits_to_keep=keep).logits
        else:
            logits = self.model(input_ids, logits_to_keep=keep).logits
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                labels[:, 1:].reshape(-1),
                ignore_index=-100,
            )
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{_CACHE_FIELD: cache})
