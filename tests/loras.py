"""Tiny random LoRAs made with peft, saved the way diffusers' trainers save them.

``make_lora(folder, out_dir, seed)`` loads the pipeline at ``folder``, adds a peft ``LoraConfig``
adapter with random A and B (``init_lora_weights=False``, so it changes the picture) to the
denoiser's attention projections (and, with ``text_encoder=True``, to the first text encoder's),
and writes ``pytorch_lora_weights.safetensors`` with the pipeline class's own ``save_lora_weights``
(diffusers' key format), which ``load_lora_weights`` reads back::

    python -m tests.loras MODEL_FOLDER OUT_DIR [SEED]

The tests' adapters: ``loras_of(family)`` makes three per family once a run; ``model_of`` loads the
app's model with them, ``plain_diffusers`` runs a job through a stock pipeline with them, and ``mad``
compares two jobs' pixels (the bound: ``BOUND``).
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from PIL import Image

    from pipeline.engine.model.diffusers_model import DiffusersModel
    from pipeline.protocol import InferenceJob

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
    with torch.no_grad():  # random B, scaled so the LoRA changes the picture without drowning it
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

    pipe = DiffusionPipeline.from_pretrained(str(folder))  # a fresh copy: the LoRA stays in it
    component = "unet" if getattr(pipe, "unet", None) is not None else "transformer"
    layers = {f"{component}_lora_layers": _adapter_state(getattr(pipe, component), ATTENTION, seed, rank, strength)}
    if text_encoder and getattr(pipe, "text_encoder", None) is not None:
        layers["text_encoder_lora_layers"] = _adapter_state(pipe.text_encoder, TEXT, seed + 1, rank, strength)
    out_dir.mkdir(parents=True, exist_ok=True)
    type(pipe).save_lora_weights(str(out_dir), **layers)
    return out_dir


# -- the tests' adapters, made and loaded once a run -------------------------------------------------

# Pixels: the largest mean |a - b| over a job's images (1.0 = 1/255). Mixed-adapter rows add their LoRA
# on a sub-batch (peft's _mixed_batch_forward), which rounds differently from the whole-batch add:
# measured at most 0.0002 on the CPU; the bound for batching is 1/255.
BOUND = 0.05
_CACHE: dict[Any, Any] = {}


def mad(a: tuple[Image.Image, ...], b: tuple[Image.Image, ...]) -> float:
    import numpy as np

    assert len(a) == len(b)
    return max(float(np.abs(np.asarray(x, np.float32) - np.asarray(y, np.float32)).mean()) for x, y in zip(a, b))


def source_of(family: str) -> Path:
    from pipeline.default_model import ensure_default_model
    from tests.families import built_family

    return ensure_default_model() if family == "default" else built_family(family)


def loras_of(family: str) -> dict[str, Path]:
    """Three adapters per family (b also adapts the text encoder), made once per run."""
    if ("loras", family) not in _CACHE:
        import tempfile

        out = Path(tempfile.mkdtemp(prefix=f"loras-{family}-"))
        src = source_of(family)
        k = 0.5 if family == "default" else 4.0  # the tiny random builds barely react to a small LoRA
        _CACHE["loras", family] = {
            "a": make_lora(src, out / "a", 1, strength=k),
            "b": make_lora(src, out / "b", 2, text_encoder=family == "default", strength=k),
            "c": make_lora(src, out / "c", 3, rank=8, strength=k),
        }
    loras: dict[str, Path] = _CACHE["loras", family]
    return loras


def model_of(family: str, *, hotswap: bool = False, loras: bool = True) -> DiffusersModel:
    from pipeline.config import Settings
    from pipeline.engine.model.diffusers_model import DiffusersModel
    from pipeline.engine.model.loading import load_model

    key = ("model", family, hotswap, loras)
    if key not in _CACHE:
        specs = tuple(f"{n}={p}" for n, p in loras_of(family).items() if not (hotswap and n == "b")) if loras else ()
        source = None if family == "default" else str(source_of(family))
        if hotswap:  # --compile's path, without compiling (CPU): the LoRAs hotswap into one slot
            from pipeline.engine.model.loading import lora_batching
            from pipeline.engine.model.lora import load_loras

            model = load_model(Settings(model=source, device="cpu"), warmup=False)
            model.loras = load_loras(model.pipe, Settings(loras=specs).lora_specs(), hotswap=True)
            batching = lora_batching(model.pipe, model.loras, "auto")
            model.profile = replace(model.profile, loras=model.loras.infos, lora_batching=batching)
        else:
            settings = Settings(model=source, device="cpu", loras=specs, lora_batching="mixed")
            model = load_model(settings, warmup=False)
        _CACHE[key] = model
    model = _CACHE[key]
    assert isinstance(model, DiffusersModel)
    return model


def plain_diffusers(family: str, j: InferenceJob, adapter: str | None) -> tuple[Image.Image, ...]:
    """The same job through a stock pipeline: ``load_lora_weights`` then ``set_adapters``, no app code
    on the way (the call arguments are the ones the app sends, ``DiffusersModel.call_arguments``)."""
    import torch
    from diffusers import DiffusionPipeline

    key = ("plain", family)
    if key not in _CACHE:
        pipe = DiffusionPipeline.from_pretrained(str(source_of(family)), torch_dtype=torch.float32)
        pipe.set_progress_bar_config(disable=True)
        with warnings.catch_warnings():  # peft's warning for every adapter after the first
            warnings.filterwarnings("ignore", message="Already found a `peft_config`")
            for name, path in loras_of(family).items():
                pipe.load_lora_weights(str(path), adapter_name=name)
        _CACHE[key] = pipe
    pipe = _CACHE[key]
    if adapter is None:
        pipe.disable_lora()
    else:
        pipe.enable_lora()
        pipe.set_adapters([adapter], [j.lora_scale])
    kwargs = model_of(family).call_arguments(j)
    generators = [torch.Generator("cpu").manual_seed(s) for s in j.seeds]
    out = pipe(prompt=list(j.prompts), width=j.width, height=j.height, num_inference_steps=j.num_inference_steps,
               generator=generators, **kwargs)  # fmt: skip
    return tuple(out.images)


if __name__ == "__main__":
    make_lora(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 0)
