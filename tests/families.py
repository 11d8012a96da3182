"""Every model family's tiny random-weight pipeline (``tests/builds/``) as a folder the app loads, and what
the tests check of the first nine families' folders (``FAMILIES``).

``build_family`` writes a family's pipeline with ``save_pretrained`` (safetensors) into a folder that
``DiffusionPipeline.from_pretrained`` loads like any downloaded model::

    from tests.families import FAMILIES, build_family, built_family
    path = build_family("sdxl", Path("/tmp/sdxl"))   # -> /tmp/sdxl (model_index.json, unet/, ...)
    path = built_family("flux-dev")                  # built once per process into a temp folder

    python -m tests.families OUT_DIR [FAMILY ...]     # build folders from the command line

Which module builds which family: ``tests/builds/__init__.py``.
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.builds import BUILDS


@dataclass(frozen=True)
class FamilySpec:
    """What a family's built folder is, as the tests check it."""

    name: str
    pipeline_class: str  # model_index.json's _class_name
    vae_scale_factor: int
    latent_channels: int  # the VAE's (FLUX's transformer takes them packed 2x2: 4x as many)
    default_size: int  # the real model's default width and height
    size_multiple: int  # sizes must be multiples of this (vae_scale_factor * patch size)
    scheduler_class: str
    prediction_type: str  # "epsilon", "v_prediction" or "flow"
    tokenizers: dict[str, int]  # component -> model_max_length
    max_sequence_length: int | None  # the __call__ default for the T5/Gemma prompt, where it has one


FAMILIES: dict[str, FamilySpec] = {
    spec.name: spec
    for spec in (
        FamilySpec(
            name="sd1",
            pipeline_class="StableDiffusionPipeline",
            vae_scale_factor=8,
            latent_channels=4,
            default_size=512,
            size_multiple=8,
            scheduler_class="PNDMScheduler",
            prediction_type="epsilon",
            tokenizers={"tokenizer": 77},
            max_sequence_length=None,
        ),
        FamilySpec(
            name="sd2-v",
            pipeline_class="StableDiffusionPipeline",
            vae_scale_factor=8,
            latent_channels=4,
            default_size=768,
            size_multiple=8,
            scheduler_class="DDIMScheduler",
            prediction_type="v_prediction",
            tokenizers={"tokenizer": 77},
            max_sequence_length=None,
        ),
        FamilySpec(
            name="sdxl",
            pipeline_class="StableDiffusionXLPipeline",
            vae_scale_factor=8,
            latent_channels=4,
            default_size=1024,
            size_multiple=8,
            scheduler_class="EulerDiscreteScheduler",
            prediction_type="epsilon",
            tokenizers={"tokenizer": 77, "tokenizer_2": 77},
            max_sequence_length=None,
        ),
        FamilySpec(
            name="sd3",
            pipeline_class="StableDiffusion3Pipeline",
            vae_scale_factor=8,
            latent_channels=16,
            default_size=1024,
            size_multiple=16,
            scheduler_class="FlowMatchEulerDiscreteScheduler",
            prediction_type="flow",
            tokenizers={"tokenizer": 77, "tokenizer_2": 77, "tokenizer_3": 512},
            max_sequence_length=256,
        ),
        FamilySpec(
            name="flux-schnell",
            pipeline_class="FluxPipeline",
            vae_scale_factor=8,
            latent_channels=16,
            default_size=1024,
            size_multiple=16,
            scheduler_class="FlowMatchEulerDiscreteScheduler",
            prediction_type="flow",
            tokenizers={"tokenizer": 77, "tokenizer_2": 512},
            max_sequence_length=512,  # the __call__ default; schnell was trained with 256
        ),
        FamilySpec(
            name="flux-dev",
            pipeline_class="FluxPipeline",
            vae_scale_factor=8,
            latent_channels=16,
            default_size=1024,
            size_multiple=16,
            scheduler_class="FlowMatchEulerDiscreteScheduler",
            prediction_type="flow",
            tokenizers={"tokenizer": 77, "tokenizer_2": 512},
            max_sequence_length=512,
        ),
        FamilySpec(
            name="pixart-alpha",
            pipeline_class="PixArtAlphaPipeline",
            vae_scale_factor=8,
            latent_channels=4,
            default_size=1024,
            size_multiple=16,  # patch 2 (resolution binning, on by default, snaps any size to a bin)
            scheduler_class="DPMSolverMultistepScheduler",
            prediction_type="epsilon",
            tokenizers={"tokenizer": 512},
            max_sequence_length=120,
        ),
        FamilySpec(
            name="pixart-sigma",
            pipeline_class="PixArtSigmaPipeline",
            vae_scale_factor=8,
            latent_channels=4,
            default_size=1024,
            size_multiple=16,
            scheduler_class="DPMSolverMultistepScheduler",
            prediction_type="epsilon",
            tokenizers={"tokenizer": 512},
            max_sequence_length=300,
        ),
        FamilySpec(
            name="sana",
            pipeline_class="SanaPipeline",
            vae_scale_factor=32,
            latent_channels=32,
            default_size=1024,
            size_multiple=32,
            scheduler_class="DPMSolverMultistepScheduler",
            prediction_type="flow",
            tokenizers={"tokenizer": 8192},
            max_sequence_length=300,
        ),
    )
}


def build_pipeline(name: str) -> Any:
    """The family's pipeline in memory, seeded random weights (the same weights every call)."""
    pipe = BUILDS[name]()
    for component in pipe.components.values():  # as from_pretrained leaves them: T5's dropout off
        if hasattr(component, "eval"):
            component.eval()
    return pipe


def build_family(name: str, out_dir: Path) -> Path:
    """Build family ``name`` and write it to ``out_dir`` with ``save_pretrained`` (safetensors)."""
    pipe = build_pipeline(name)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


_BUILT: dict[str, Path] = {}
_ROOT: list[Path] = []


def built_family(name: str) -> Path:
    """``build_family`` into a temporary folder, once per process (removed when the process exits)."""
    if name not in BUILDS:
        raise KeyError(f"unknown family {name!r}; known: {', '.join(BUILDS)}")
    if name not in _BUILT:
        if not _ROOT:
            root = Path(tempfile.mkdtemp(prefix="t2i-families-"))
            atexit.register(shutil.rmtree, root, True)
            _ROOT.append(root)
        _BUILT[name] = build_family(name, _ROOT[0] / name)
    return _BUILT[name]


def build_controlnet(family: str, out_dir: Path) -> Path:
    """A tiny random-weight ControlNet for family ``family``'s build (issue 51), written with ``save_pretrained``:
    ``ControlNetModel.from_unet`` for SD 1.x and SDXL, ``FluxControlNetModel.from_transformer`` (one block of
    each kind) for FLUX.1. Its zero-initialised convolutions and blocks are given small seeded weights, so
    that the map moves the pictures (a zero ControlNet would make every control test pass vacuously)."""
    import torch
    from diffusers import ControlNetModel, FluxControlNetModel

    pipe = build_pipeline(family)
    torch.manual_seed(5)
    if hasattr(pipe, "unet"):
        net = ControlNetModel.from_unet(pipe.unet)
    else:
        config = pipe.transformer.config
        net = FluxControlNetModel.from_transformer(pipe.transformer, num_layers=1, num_single_layers=1,
                                                   attention_head_dim=config.attention_head_dim,
                                                   num_attention_heads=config.num_attention_heads)  # fmt: skip
    with torch.no_grad():
        for parameter in net.parameters():
            if parameter.ndim > 1 and not parameter.any():  # weights only: a bias would add the same everywhere
                parameter.normal_(0.0, 0.2)
        embedding = getattr(net, "controlnet_cond_embedding", None)
        for name, parameter in embedding.named_parameters() if embedding is not None else ():
            # the map's own part: zero where the map is black, strong where it is white
            parameter.zero_() if name.endswith("bias") else parameter.normal_(0.0, 0.5)
    out_dir = Path(out_dir)
    net.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def built_controlnet(family: str) -> Path:
    """``build_controlnet`` into the process's temporary folder, once per family."""
    key = f"controlnet-{family}"
    if key not in _BUILT:
        built_family(family)  # makes the folder
        _BUILT[key] = build_controlnet(family, _ROOT[0] / key)
    return _BUILT[key]


def built_modular(family: str) -> Path:
    """Family ``family``'s build as a ``ModularPipeline`` folder (issue 52 §5): ``ModularPipeline.from_pretrained``
    of its folder, components loaded, written with ``save_pretrained``: a ``modular_model_index.json`` and
    the components, no ``model_index.json`` (as FLUX.3's repository has only the modular index)."""
    from diffusers import ModularPipeline

    key = f"modular-{family}"
    if key not in _BUILT:
        modular = ModularPipeline.from_pretrained(str(built_family(family)))
        modular.load_components()
        out = _ROOT[0] / key
        modular.save_pretrained(str(out))
        _BUILT[key] = out
    return _BUILT[key]


def plain_diffusers_images(
    name: str, size: int, steps: int, guidance: float, seed: int, dtype: Any = None
) -> list[Any]:
    """Family ``name`` through a plain diffusers call of its built folder: ``"a red circle"`` at ``size``,
    one CPU generator seeded ``seed`` (the reference the app's pixels are held to)."""
    import torch
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(str(built_family(name)), **({"torch_dtype": dtype} if dtype else {}))
    pipe.set_progress_bar_config(disable=True)
    with torch.inference_mode():
        images: list[Any] = pipe(
            prompt=["a red circle"],
            width=size,
            height=size,
            num_inference_steps=steps,
            guidance_scale=guidance,
            generator=[torch.Generator("cpu").manual_seed(seed)],
        ).images
    return images


def mode_files(folder: Path, width: int, height: int) -> tuple[Path, Path]:
    """A noise picture and a mask (white: its middle half) at ``width`` x ``height``, saved as PNGs in
    ``folder``: the inputs of the family matrices' image-mode rows."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(9)
    source, mask = folder / "source.png", folder / "mask.png"
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(source)
    hole = np.zeros((height, width), dtype=np.uint8)
    hole[height // 4 : 3 * height // 4, width // 4 : 3 * width // 4] = 255
    Image.fromarray(hole).save(mask)
    return source, mask


def plain_mode_images(
    name: str,
    mode: str,
    size: int,
    steps: int,
    guidance: float,
    seed: int,
    image: Any,
    mask: Any = None,
    strength: float = 0.75,
    guidance_arg: str | None = "guidance_scale",
    **fixed: Any,
) -> list[Any]:
    """Family ``name``'s image-to-image (``mode`` "image") or inpainting ("inpaint") pipeline, made by
    ``AutoPipelineFor*.from_pipe`` of a plain load of its built folder, on ``image`` (and ``mask``):
    ``"a red circle"``, one CPU generator seeded ``seed``; ``width``/``height`` where the class takes them."""
    import inspect

    import torch
    from diffusers import AutoPipelineForImage2Image, AutoPipelineForInpainting, DiffusionPipeline

    auto = AutoPipelineForImage2Image if mode == "image" else AutoPipelineForInpainting
    pipe = auto.from_pipe(DiffusionPipeline.from_pretrained(str(built_family(name))))
    pipe.set_progress_bar_config(disable=True)
    takes = inspect.signature(pipe.__call__).parameters
    extra: dict[str, Any] = {"mask_image": [mask]} if mode == "inpaint" else {}
    extra.update({guidance_arg: guidance} if guidance_arg else {}, **fixed)
    if "width" in takes and "height" in takes:
        extra.update(width=size, height=size)
    with torch.inference_mode():
        images: list[Any] = pipe(
            prompt=["a red circle"],
            image=[image],
            strength=strength,
            num_inference_steps=steps,
            generator=[torch.Generator("cpu").manual_seed(seed)],
            **extra,
        ).images
    return images


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder; each family goes into OUT/<family>")
    parser.add_argument(
        "families",
        nargs="*",
        metavar="FAMILY",
        help=f"default: all of {', '.join(FAMILIES)}; or any of {', '.join(BUILDS)}",
    )
    args = parser.parse_args(argv)
    unknown = [name for name in args.families if name not in BUILDS]
    if unknown:
        parser.error(f"unknown families: {', '.join(unknown)}")
    for name in args.families or FAMILIES:
        t0 = time.time()
        path = build_family(name, args.out / name)
        print(f"{name}: {path} ({time.time() - t0:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
