"""`TaperLMForCausalLM`: a transformers `PreTrainedModel` wrapping our `TaperedLM`, so exported
models load with `AutoModelForCausalLM`, run under lm-eval's `hf` model and `generate()`.

Our KV cache is not a transformers `Cache`; `generate()` runs with `use_cache=False` and
recomputes the prefix every step (fine for evaluation and short samples; `taperlm generate`
uses our own cache). Left padding is rejected: the model has no attention mask.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from taperlm.hf.configuration import TaperLMConfig
from taperlm.models import TaperedLM
from taperlm.models.layers import Rotary


class TaperLMPreTrainedModel(PreTrainedModel):
    config_class = TaperLMConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = False
    _no_split_modules: ClassVar[list[str]] = ["Block"]
    _supports_cache_class = False

    def _init_weights(self, module: torch.nn.Module) -> None:
        # Weights come from the checkpoint (TaperedLM initialises itself on construction), but
        # transformers builds the model on the meta device, so the RoPE tables (non-persistent
        # buffers, not in the checkpoint) must be recomputed here.
        if isinstance(module, Rotary):
            cfg = self.config.model_config()
            fresh = Rotary(cfg.head_dim, cfg.context_length, cfg.rope_theta)
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
        from taperlm.models.hope import tag_update_periods

        tag_update_periods(model.model)
        return model

    def prepare_inputs_for_generation(
        self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None, **kwargs: Any
    ) -> dict[str, Any]:
        # No transformers cache yet: always feed the whole sequence. (The default would cut the
        # input to the new token whenever generate() runs with use_cache=True, as lm-eval's
        # generation requests do, and the model would continue from that token alone.)
        return {"input_ids": input_ids, "attention_mask": attention_mask}

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.model.embed

    def set_input_embeddings(self, value: torch.nn.Module) -> None:
        self.model.embed = value

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.model.lm_head

    def set_output_embeddings(self, value: torch.nn.Module) -> None:
        self.model.lm_head = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        return_dict: bool | None = None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        if input_ids is None:
            raise ValueError("TaperLMForCausalLM needs input_ids (inputs_embeds is not supported)")
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
        logits = self.model(input_ids).logits
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                labels[:, 1:].reshape(-1),
                ignore_index=-100,
            )
        return CausalLMOutputWithPast(loss=loss, logits=logits)
