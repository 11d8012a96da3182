"""Tiny random LoRA adapters made with peft, saved the way diffusers' trainers save them.

``make_lora(folder, out_dir, seed)`` loads the pipeline at ``folder``, adds a peft ``LoraConfig``
adapter with random A and B (``init_lora_weights=False``, so it changes the picture) to the
denoiser's attention projections (and, with ``text_encoder=True``, to the first text encoder's),
and writes ``pytorch_lora_weights.safetensors`` with the pipeline class's own ``save_lora_weights``
(diffusers' key format), which ``load_lora_weights`` reads back::

    python -m tests.loras MODEL_FOLDER OUT_DIR [SEED]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ATTENTION = ["to_q", "to_k", "to_v", "to_out.0"]
TEXT = ["q_proj", "k_proj", "v_proj", "out_proj"]


def _adapter_state(module: Any, targets: list[str], seed: int, rank: int, strength: float) -> dict[str, Any]:
    import torch
    from diffusers.utils import convert_state_dict_to_diffusers
    from peft import LoraConfig, inject_adapter_in_model
    from peft.utils import get_peft_model_state_dict

    torch.manual_seed(seed)
    config = LoraConfig(r=rank, lora_alpha=rank, target_modules=targets, init_lora_weights=False)
    inject_adapter_in_model(config, module, adapter_name="made")  # peft's own (transformers' asks a newer peft)
    with torch.no_grad():  # random B, scaled so the adapter changes the picture without drowning it
        for name, p in module.named_parameters():
            if "lora_B" in name:
                p.mul_(strength)
    return convert_state_dict_to_diffusers(get_peft_model_state_dict(module, adapter_name="made"))


def make_lora(
    folder: Path, out_dir: Path, seed: int, *, rank: int = 4, text_encoder: bool = False, strength: float = 0.5
) -> Path:
    """A random LoRA for the pipeline at ``folder``, written to ``out_dir`` (returned). ``strength`` scales
    its B matrices: a tiny random-weight transformer barely reacts to its inputs, so it needs more."""
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(str(folder))  # a fresh copy: the adapter stays in it
    component = "unet" if getattr(pipe, "unet", None) is not None else "transformer"
    layers = {f"{component}_lora_layers": _adapter_state(getattr(pipe, component), ATTENTION, seed, rank, strength)}
    if text_encoder and getattr(pipe, "text_encoder", None) is not None:
        layers["text_encoder_lora_layers"] = _adapter_state(pipe.text_encoder, TEXT, seed + 1, rank, strength)
    out_dir.mkdir(parents=True, exist_ok=True)
    type(pipe).save_lora_weights(str(out_dir), **layers)
    return out_dir


if __name__ == "__main__":
    make_lora(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 0)
