"""Family knowledge as data: one entry per model family, keyed by the exact diffusers pipeline class.

Each entry says what the loaded pipeline itself cannot: how the user's guidance control reaches
the model, when the negative prompt is read, how latents are packed, where the output is, which
arguments a call must always carry, and the model cards' defaults for the well-known distilled
checkpoints. Everything else (step and guidance defaults, the VAE factor, patch sizes, tokenizer
windows) is read from the pipeline in ``engine.model.families``; a class with no entry here is served
generically from its ``__call__`` signature (``generic``), and the guesses are logged at start.

**Guidance** (``Family.guidance``), the parameter the guidance control drives:

- ``"cfg"``: ``guidance_scale`` is classifier-free guidance; it runs (and the negative prompt is
  read) only above 1. SD, SDXL, SD3, PixArt, Sana, Chroma, Lumina 2, CogView4, Z-Image, ...
- ``"true_cfg"``: classifier-free guidance is ``true_cfg_scale`` (above 1, with a negative prompt
  given: Qwen-Image runs the unconditional branch only when one is sent, so an empty one is sent
  as a space). ``guidance_scale`` there is for guidance-distilled checkpoints only.
- ``"embedded"``: a guidance-distilled model reads ``guidance_scale`` through an embedding; there
  is no unconditional branch and no negative prompt (FLUX.1-dev, FLUX.2-dev, Sana Sprint, SDXL with
  an LCM UNet's ``time_cond_proj_dim``).
- ``"distilled"``: guidance is baked in (FLUX.1-schnell, FLUX.2-klein with ``is_distilled``); the
  control is pinned at the model's value and the negative prompt is not offered.
- ``"schedule"``: a per-step schedule (Ideogram 4): the control sends one constant
  ``guidance_scale`` and ``guidance_schedule=None`` (the two are exclusive).
- ``"guider"``: the scale lives in the pipeline's ``guider`` component (HunyuanImage 2.1): each job
  gets a copy of it with the requested ``guidance_scale``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

GUIDANCE_KINDS = ("cfg", "true_cfg", "embedded", "distilled", "schedule", "guider")


@dataclass(frozen=True)
class CardDefaults:
    """A well-known checkpoint's recommended settings (from its model card), matched on its name."""

    pattern: str  # a regular expression over the model id or folder name
    steps: int
    guidance: float
    by_name: bool = False  # applies on the name alone (the config cannot tell); else only with a config marker

    def matches(self, name: str) -> bool:
        return re.search(self.pattern, name, re.I) is not None


@dataclass(frozen=True)
class Family:
    key: str  # the family's name (profile, README table)
    classes: tuple[str, ...]  # the exact diffusers pipeline classes it covers
    guidance: str = "cfg"  # see the module docstring
    packing: int = 1  # the pipeline packs p x p latents into one token (FLUX: 2); the size step grows by it
    output: str = "images"  # the attribute of the pipeline's output holding the pictures
    bf16: bool = False  # trained in bf16: fp16 overflows (black images), so bf16 on a GPU
    samplers: bool = False  # A1111's samplers apply (DDPM-family noise or v prediction)
    loop: str | None = None  # the step-level loop (engine.loop.loop_sd / loop_flow), else job-level
    fixed: dict[str, Any] = field(default_factory=dict)  # arguments every call carries
    default_size: int | None = None  # what __call__ draws with no size, where the pipeline does not say
    step_choices: tuple[int, ...] = ()  # only these step counts run (empty: any in the range)
    # only these (width, height) are drawn as asked: the pipeline resizes any other (Kandinsky 5, HiDream)
    size_choices: tuple[tuple[int, int], ...] = ()
    min_steps: int = 1
    max_guidance: float = 20.0
    cards: tuple[CardDefaults, ...] = ()  # distilled checkpoints' defaults, by name
    previews: bool = True
    cfg_above: float = 1.0  # classifier-free guidance (and so the negative prompt) runs above this guidance
    patch_last: bool = False  # packed tokens hold (py, px, c), not FLUX's (c, py, px) (Ideogram 4)
    truncate: bool = False  # the pipeline raises on a prompt over its window: the app cuts it to the window
    # (name, prompt tokens read or None: computed) per tokenizer, in the pipeline's order, where the
    # tokenizer's class does not say (a Mistral tokenizer loads as a generic fast tokenizer)
    encoders: tuple[tuple[str, int | None], ...] = ()
    note: str = ""  # what the README's family table says besides the traits


def _f(key: str, *classes: str, **traits: Any) -> Family:
    return Family(key, classes or (f"{key}Pipeline",), **traits)


FAMILIES: tuple[Family, ...] = (
    _f("sd", "StableDiffusionPipeline", samplers=True, loop="sd",
       cards=(CardDefaults(r"sd-?turbo", 1, 0.0),)),
    _f("sdxl", "StableDiffusionXLPipeline", samplers=True,
       cards=(CardDefaults(r"sdxl-?turbo", 1, 0.0), CardDefaults(r"lcm", 4, 8.0),
              CardDefaults(r"lightning|hyper", 4, 0.0))),
    _f("sd3", "StableDiffusion3Pipeline", bf16=True, loop="sd3"),
    _f("flux", "FluxPipeline", guidance="embedded", packing=2, bf16=True, loop="flux",
       cards=(CardDefaults(r"schnell", 4, 0.0),)),
    _f("pixart", "PixArtAlphaPipeline", "PixArtSigmaPipeline", samplers=True, min_steps=2),
    _f("sana", "SanaPipeline", bf16=True),
    _f("sana-sprint", "SanaSprintPipeline", guidance="embedded", bf16=True, step_choices=(1, 2, 3, 4),
       cards=(CardDefaults(r"", 2, 4.5),)),  # SCM: 1-4 steps; the intermediate timestep only at 2
    _f("lumina2", "Lumina2Pipeline", bf16=True),
    _f("cogview4", "CogView4Pipeline", bf16=True, encoders=(("GLM", None),)),
    _f("flux2", "Flux2Pipeline", guidance="embedded", bf16=True, encoders=(("Mistral", 512),)),
    _f("flux2-klein", "Flux2KleinPipeline", bf16=True),
    _f("chroma", "ChromaPipeline", packing=2, bf16=True, loop="chroma"),
    _f("ovis-image", "OvisImagePipeline", packing=2, bf16=True),
    _f("longcat-image", "LongCatImagePipeline", packing=2, bf16=True, encoders=(("Qwen", 512),)),
    _f("ernie-image", "ErnieImagePipeline", bf16=True, encoders=(("Mistral", None),),
       cards=(CardDefaults(r"turbo", 8, 1.0, by_name=True),)),
    _f("qwen-image", "QwenImagePipeline", guidance="true_cfg", packing=2, bf16=True, min_steps=2,  # 1 step: NaN sigmas
       loop="qwen-image"),
    _f("z-image", "ZImagePipeline", bf16=True, default_size=1024, cfg_above=0.0, loop="z-image",
       cards=(CardDefaults(r"turbo", 9, 0.0, by_name=True),)),
    # HiDream rescales every size to 1024² pixels: these are the sizes its rescaling keeps
    _f("hidream", "HiDreamImagePipeline", bf16=True,
       encoders=(("CLIP", None), ("CLIP", None), ("T5", None), ("Llama", None)),
       size_choices=((1024, 1024), (1168, 896), (896, 1168), (1248, 832), (832, 1248), (1360, 768), (768, 1360))),
    # its ByT5 reads only the prompt's quoted text (the glyphs to draw), formatted, 128 tokens
    _f("hunyuanimage", "HunyuanImagePipeline", guidance="guider", packing=2, bf16=True,
       encoders=(("Qwen", 1000), ("ByT5", 128))),
    _f("kandinsky5", "Kandinsky5T2IPipeline", output="image", bf16=True,
       size_choices=((1024, 1024), (640, 1408), (1408, 640), (768, 1280), (1280, 768), (896, 1152), (1152, 896))),
    _f("krea2", "Krea2Pipeline", bf16=True, cfg_above=0.0),  # CFG on whenever g > 0
    _f("ideogram4", "Ideogram4Pipeline", guidance="schedule", bf16=True, fixed={"guidance_schedule": None},
       patch_last=True, truncate=True, encoders=(("Qwen", 2032),)),  # 2048 with its template
)  # fmt: skip

BY_CLASS: dict[str, Family] = {cls: family for family in FAMILIES for cls in family.classes}


def family_for(pipeline_class: str) -> Family | None:
    """The registry entry for exactly this class (no substring matching: a subclass is not its parent)."""
    return BY_CLASS.get(pipeline_class)
