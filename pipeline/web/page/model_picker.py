"""The page's model picker (issue 52: several models on one server).

A dropdown of the served models (hidden where the server serves one), the API's ``model`` field. Picking
one moves the settings to that model's: the size presets and the sliders' ranges and defaults, the steps,
the guidance (hidden where the model bakes it in), the samplers, the LoRAs that loaded on it, the step
caches it offers and whether it reads a negative prompt. A pasted text names its model (``Model:``) and
sets the picker; the other settings it holds were read against that model's limits (``a1111.fill_from``).
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from ...fields import NONE
from ...protocol import ModelProfile
from ...request import Limits
from ...serving.postprocess import sampler_name
from .mode_panel import MODE_LABELS, offered_modes
from .presets import SizePreset, preset_value, size_presets


def model_picker(p: ModelProfile) -> gr.Dropdown:
    """The picker, the default model first (value: its name, what a request's ``model`` takes)."""
    served = p.served
    return gr.Dropdown(
        [(m.model_id if m.model_id == m.name else f"{m.model_id} · {m.family}", m.model_id) for m in served],
        value=served[0].model_id,
        label="Model",
        info="Each model keeps its own sizes, steps and guidance; a switch adds its move to the wait",
        elem_id="model",
        visible=len(served) > 1,
    )


def wire_model_picker(picker: gr.Dropdown, p: ModelProfile, limits: Limits, adv: dict[str, Any], preset: gr.Radio,
                      panels: tuple[gr.Radio, gr.Dropdown], ui: dict[str, Any]) -> None:  # fmt: skip
    """A pick updates the settings to the model's (``settings_of``), and the mode and ControlNet choices
    (``panels``: the mode radio, the control dropdown) to what it serves; nothing is wired for one model."""
    if len(p.served) < 2:
        return
    names = ("width", "height", "num_inference_steps", "guidance_scale", "scheduler", "lora", "step_cache",
             "negative_prompt")  # fmt: skip

    def picked(name: Any) -> list[Any]:
        model = p.of(name if isinstance(name, str) else None)
        modes = offered_modes(model)
        return [*settings_of(model, limits.pick(model.model_id)),
                gr.update(choices=[(MODE_LABELS[m], m) for m in modes], value="text", visible=len(modes) > 1),
                gr.update(choices=[NONE, *model.controls], value=NONE)]  # fmt: skip

    picker.input(fn=picked, inputs=[picker], outputs=[preset, *(adv[n] for n in names), *panels], **ui)


def every_preset(p: ModelProfile, limits: Limits) -> list[SizePreset]:
    """The size presets of every served model (the radio marks a size as its preset whichever model is picked)."""
    seen: dict[str, SizePreset] = {}
    for m in p.served:
        for preset in size_presets(m.default_width, m.default_height, limits.pick(m.model_id)):
            seen.setdefault(preset.value, preset)
    return list(seen.values())


def settings_of(m: ModelProfile, lim: Limits) -> list[Any]:
    """The updates a pick sends: the preset radio, then width, height, steps, guidance, sampler, LoRA, step
    cache and negative prompt, each at the model's default within the model's range."""
    presets = size_presets(m.default_width, m.default_height, lim)
    return [
        gr.update(choices=[(s.label, s.value) for s in presets], value=preset_value(presets, m.default_width,
                                                                                    m.default_height)),
        gr.update(minimum=lim.min_size, maximum=lim.max_size, step=lim.size_multiple, value=m.default_width),
        gr.update(minimum=lim.min_size, maximum=lim.max_size, step=lim.size_multiple, value=m.default_height),
        gr.update(minimum=lim.min_steps, maximum=max(lim.max_steps, lim.min_steps + 1), value=m.default_steps),
        gr.update(minimum=lim.min_guidance, maximum=max(lim.max_guidance, lim.min_guidance + 0.1),
                  value=m.default_guidance, visible=m.guidance_arg is not None),
        gr.update(choices=[(f"default ({sampler_name(m.sampler)})", "default")]
                  + [(n, n) for n in lim.samplers if n != "default"], value="default"),
        gr.update(choices=[NONE, *(i.name for i in m.loras)], value=NONE),
        gr.update(choices=[(f"default (the server's: {lim.step_cache})", "default"), ("off", "off"),
                           *((n, n) for n in lim.step_caches)], value="default", visible=bool(lim.step_caches)),
        gr.update(visible=m.supports_negative_prompt, value=""),
    ]  # fmt: skip
