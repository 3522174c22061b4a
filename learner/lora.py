"""LoRA (peft) on the learner, and the merged weights a LoRA learner publishes.

The optimizer steps only the adapters A, B; the engines serve a plain HF model. So a LoRA learner
publishes W + (alpha/r) B @ A for every adapted layer and the base weights for the rest, under the
base model's own names, shapes and dtypes. The merge is computed out of place: the training model
keeps its adapters (no merge_and_unload on the live model).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

TARGET_MODULES = ("q_proj", "v_proj")
ALL_LINEAR = "all-linear"  # peft's name: every nn.Linear but the output head


def apply_lora(
    model: nn.Module,
    rank: int,
    alpha: float,
    seed: int = 0,
    targets: tuple[str, ...] | list[str] = TARGET_MODULES,
) -> nn.Module:
    """`targets`: module names (`model.lora_targets`), or ["all-linear"]. A name that matches no
    module of the model is refused naming the field (peft would adapt the others silently)."""
    from peft import LoraConfig, get_peft_model

    linear = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    missing = [t for t in targets if t != ALL_LINEAR and t not in linear]
    if missing:
        raise ValueError(
            f"model.lora_targets {missing} name no linear layer of this model: use some of "
            f"{sorted(linear)} or [{ALL_LINEAR}]"
        )
    modules: str | list[str] = ALL_LINEAR if list(targets) == [ALL_LINEAR] else list(targets)
    # alpha as given (peft scales by alpha / r): an int() here truncated a fractional alpha
    cfg = LoraConfig(r=rank, lora_alpha=alpha, target_modules=modules, lora_dropout=0.0)  # type: ignore[arg-type]
    with torch.random.fork_rng():  # adapters start from the run's seed, not global RNG state
        torch.manual_seed(seed)
        return get_peft_model(model, cfg)  # type: ignore[arg-type]


def is_peft(model: nn.Module) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def _base(model: nn.Module) -> nn.Module:
    """The HF model under the peft wrapper (its LoRA layers injected in place)."""
    return model.get_base_model() if is_peft(model) else model  # type: ignore[operator]


def lora_layers(model: nn.Module) -> dict[str, Any]:
    """Base-model module name -> its LoRA layer. Refuses what the merge below does not cover."""
    from peft.tuners.lora import Linear as LoraLinear
    from peft.tuners.lora import LoraLayer

    out: dict[str, Any] = {}
    for name, mod in _base(model).named_modules():
        if not isinstance(mod, LoraLayer):
            continue
        if not isinstance(mod, LoraLinear) or getattr(mod, "fan_in_fan_out", False):
            raise ValueError(f"{name}: merged publishing covers LoRA on nn.Linear layers only")
        if any(mod.use_dora.values()) or any(getattr(mod, "lora_bias", {}).values()):
            raise ValueError(f"{name}: merged publishing does not cover DoRA or LoRA biases")
        out[name] = mod
    return out


def _is_adapter_key(key: str) -> bool:
    return any(part.startswith("lora_") for part in key.split("."))


def _merged_weight(layer: Any) -> torch.Tensor:
    w = layer.get_base_layer().weight.detach()
    if layer.merged:
        return w  # the adapters are already folded into the base weight
    acc = torch.promote_types(w.dtype, torch.float32)  # bf16: one rounding, at the end
    out = w.to(acc)
    for name in layer.active_adapters:
        if name in layer.lora_A:
            a = layer.lora_A[name].weight.detach().to(acc)
            b = layer.lora_B[name].weight.detach().to(acc)
            out = out + layer.scaling[name] * (b @ a)  # a new tensor: w is never written
    return out.to(w.dtype)


def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict of the plain HF model equal to `model` (keys, order, shapes, dtypes).

    Adapted layers carry W + scaling * B @ A (fresh tensors); every other entry is the live
    (frozen) tensor itself, detached, as `state_dict()` gives it."""
    layers = lora_layers(model)
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for key, t in _base(model).state_dict().items():
            if _is_adapter_key(key):
                continue
            name = key.replace(".base_layer.", ".")
            owner, _, leaf = name.rpartition(".")
            is_merged = leaf == "weight" and owner in layers
            out[name] = _merged_weight(layers[owner]) if is_merged else t.detach()
    return out


def adapted_names(model: nn.Module) -> list[str]:
    """Base names of the weights the adapters change (all the others are frozen base weights)."""
    return [f"{name}.weight" for name in lora_layers(model)]
