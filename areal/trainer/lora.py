"""LoRA for the trainer (``trainer.lora.rank > 0``): peft adapters trained, whole weights published.

    HF causal LM ──attach_adapters──► PeftModel: peft injects LoRA layers into the HF model in place
        │                              (W frozen; only lora_A / lora_B require grad)
        └─ the injected HF model ──► PolicyScorer ──► train_step   (its backbone runs the adapters)
                                       └─ AdaptersOff: the same scorer, adapters disabled = the KL reference
    publish (rank 0, each version and the final model): MergedWeights(peft model)
        .state_dict()      {HF name: W + alpha/r · B @ A}, computed out of place   ──► collective push
        .save_pretrained   that state dict as a plain HF model (the engines load it as today)
                           + adapter/adapter_config.json + adapter/adapter_model.safetensors (peft's layout)

Invariants:
- B starts at zero (peft's default), so the adapted model equals the base model at step 1 and
  the engine's logprobs of version 0 agree with the trainer's (``logprob_max_diff``).
- The trained model is never merged in place: merging and unmerging W += ΔW would leave float
  rounding in the frozen weights at every publish. The merged tensors are new ones; the frozen
  ones are shared (tied embeddings stay tied, so ``named_tensors_to_send`` still sends them once).
- The published directory is the base model's HF layout with the same names and shapes: an
  engine cannot tell a LoRA run from a full fine-tuning one. The adapter sits in a subdirectory:
  an ``adapter_config.json`` beside ``config.json`` would make transformers load the directory
  as an adapter of ``base_model_name_or_path`` instead.
- Adapter dropout acts only in forwards that build a graph (``torch.is_grad_enabled()``): the
  trainer keeps the model in eval mode (no dropout anywhere else), and its no-grad passes
  (proximal, engine agreement before the update) see the deterministic adapted model. With
  ``dropout > 0`` and no pre-pass (one minibatch, no KL), ``logprob_max_diff`` is read off the
  dropped-out training forward, so it includes dropout's noise after step 1.
- The wrapped model's ``state_dict`` holds base and adapter tensors under peft's names
  (``...q_proj.base_layer.weight``, ``...q_proj.lora_A.default.weight``): a checkpoint written from
  it loads into a model wrapped with the same ``trainer.lora`` settings (``load_state_dict``).

Not covered: FSDP2 (refused by ``TrainerConfig``); adapters on the lm head or the embeddings
(refused: ``PolicyScorer`` reads those weights directly); pushing adapters alone to engines that
load them (SGLang's ``/load_lora_adapter``); quantized base weights (QLoRA).
"""

from __future__ import annotations

from pathlib import Path

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer

from areal.trainer.config import ALL_LINEAR, LoraConfig
from areal.trainer.packing import MicroBatch

ADAPTER_DIR = "adapter"  # the adapter's subdirectory of a published model dir
ADAPTER = "default"  # peft's name of the one adapter


class GradOnlyDropout(torch.nn.Dropout):
    """Dropout in forwards that build a graph; the identity in no-grad passes (whatever the mode)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(x, self.p, training=torch.is_grad_enabled(), inplace=False)


def attach_adapters(model: torch.nn.Module, config: LoraConfig) -> PeftModel:
    """Wrap ``model`` (an HF causal LM, modified in place) with fresh LoRA adapters; returns the
    PeftModel. Train ``peft.get_base_model()``: the same HF module, now running the adapters."""
    targets = ALL_LINEAR if config.target_modules == [ALL_LINEAR] else list(config.target_modules)
    peft_config = PeftLoraConfig(r=config.rank, lora_alpha=config.alpha, target_modules=targets, lora_dropout=config.dropout, bias="none")
    try:
        peft_model = get_peft_model(model, peft_config)
    except ValueError as e:  # peft's "Target modules {...} not found in the base model"
        raise ValueError(f"trainer.lora.target_modules={config.target_modules}: {e}") from e
    base = peft_model.get_base_model()
    for module in (base.get_output_embeddings(), base.get_input_embeddings()):
        if isinstance(module, LoraLayer):
            raise ValueError(
                f"trainer.lora.target_modules={config.target_modules} put an adapter on {type(module).__name__} "
                "(the lm head or the embeddings), which the trainer applies from its weight directly"
            )
    for layer in lora_layers(base).values():
        if config.dropout > 0:
            layer.lora_dropout[ADAPTER] = GradOnlyDropout(config.dropout)
    return peft_model


def lora_layers(model: torch.nn.Module) -> dict[str, LoraLayer]:
    """The adapted layers of ``model`` (the injected HF model), by module name."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def merged_state_dict(peft_model: PeftModel) -> dict[str, torch.Tensor]:
    """The base model's state dict under its own HF names, each adapted weight replaced by a new
    tensor W + alpha/r · B @ A (peft's ``get_delta_weight``); every other tensor is the live one."""
    base = peft_model.get_base_model()
    layers = lora_layers(base)
    merged: dict[str, torch.Tensor] = {}
    for key, tensor in base.state_dict().items():
        if ".lora_" in key:
            continue  # lora_A / lora_B / lora_dropout: folded into the weight below
        name = key.replace(".base_layer.", ".")
        owner, _, leaf = key.rpartition(".base_layer.")
        if owner in layers and leaf == "weight":
            with torch.no_grad():
                tensor = tensor + layers[owner].get_delta_weight(ADAPTER).to(tensor.dtype)
        merged[name] = tensor.detach()
    return merged


class AdaptersOff(torch.nn.Module):
    """The KL reference of a LoRA run: the trainer's scorer with the adapters switched off, which is
    the initial model (the base weights are frozen), so no copy of the weights is kept."""

    def __init__(self, scorer: torch.nn.Module, peft_model: PeftModel) -> None:
        super().__init__()
        # Neither is registered as a submodule: the reference owns no parameters of its own.
        object.__setattr__(self, "scorer", scorer)
        object.__setattr__(self, "peft_model", peft_model)

    def forward(self, mb: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad(), self.peft_model.disable_adapter():
            return self.scorer(mb)


class MergedWeights:
    """What rank 0 publishes for a LoRA run: the merged model, shaped like a plain HF model for
    ``publish.save_atomically`` (``save_pretrained``) and ``CollectiveWeightPush.push`` (``state_dict``)."""

    def __init__(self, peft_model: PeftModel) -> None:
        self.peft_model = peft_model

    def state_dict(self) -> dict[str, torch.Tensor]:
        return merged_state_dict(self.peft_model)

    def save_pretrained(self, path: str | Path) -> None:
        """Merged HF model in ``path``; the adapter alone in ``path/adapter`` (peft's layout)."""
        base = self.peft_model.get_base_model()
        base.save_pretrained(path, state_dict=merged_state_dict(self.peft_model))
        self.peft_model.save_pretrained(Path(path) / ADAPTER_DIR)
