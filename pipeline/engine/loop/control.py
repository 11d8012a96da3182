"""ControlNet per member inside shared loops (issue 51): each member its own map, weight and window.

diffusers' ControlNet pipelines run one ControlNet on the whole batch with one ``conditioning_scale``.
Here a member keeps what one ``StableDiffusionControlNetPipeline.__call__`` keeps for its call
(``MemberControl``): its ControlNet's name, its map prepared as the pipeline's ``prepare_image`` does
(the control image processor, at the member's size, repeated for the guidance rows ``[uncond, cond]``),
its scale and its window (``control_guidance_start``/``end``: the pipeline's ``controlnet_keep``, from
the member's own step index and step count). A step runs each ControlNet on the rows of the members
that use it now (grouped by prompt length: the ControlNet's cross-attention takes no text mask), scales
each row's residuals by its member's scale, and adds them to those rows of the UNet's blocks; every
other row gets zeros, which leave it as it is without a ControlNet (``x + 0 == x``), so a member draws
what it draws alone whoever shares its steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...protocol import NONE, InferenceJob
from ..model.controls import settings_of


@dataclass
class MemberControl:
    """One member's ControlNet: its name, its map's rows, its scale and window (fractions of its steps)."""

    name: str
    cond: torch.Tensor  # (rows, 3, height, width), the pipeline's prepared image, per denoiser row
    scale: float
    start: float
    end: float

    def now(self, step: int, total: int) -> float:
        """The pipeline's ``controlnet_conditioning_scale * controlnet_keep[step]``."""
        keep = 1.0 - float(step / total < self.start or (step + 1) / total > self.end)
        return self.scale * keep


def member_control(pipe: Any, controlnets: dict[str, Any], job: InferenceJob, cfg: bool, device: torch.device,
                   dtype: torch.dtype) -> MemberControl | None:  # fmt: skip
    """The member's control as the ControlNet pipeline prepares it, or None without one."""
    name, scale, start, end = settings_of(job)
    if name == NONE:
        return None
    if name not in controlnets:
        raise ValueError(f"no ControlNet named {name!r} is loaded")
    if len(job.controls) != job.num_images:
        raise ValueError(f"a control map per image: {job.num_images} images, {len(job.controls)} maps")
    cond = prepared(pipe, list(job.controls), job.width, job.height, device, dtype)
    return MemberControl(name, torch.cat([cond] * 2) if cfg else cond, scale, start, end)


def prepared(pipe: Any, maps: list[Any], width: int, height: int, device: torch.device, dtype: torch.dtype) -> Any:
    """The ControlNet pipeline's ``prepare_image`` (no CFG repeat): its control image processor
    (RGB, resized to the size, in [0, 1])."""
    from diffusers.image_processor import VaeImageProcessor

    processor = VaeImageProcessor(vae_scale_factor=pipe.vae_scale_factor, do_convert_rgb=True, do_normalize=False)
    image = processor.preprocess(maps, height=height, width=width).to(dtype=torch.float32)
    return image.to(device=device, dtype=dtype)


def residuals(
    controlnets: dict[str, Any],
    members: list[Any],
    inputs: torch.Tensor,
    times: torch.Tensor,
    texts: list[torch.Tensor],
) -> tuple[list[torch.Tensor] | None, torch.Tensor | None]:
    """The UNet's ``down_block_additional_residuals`` and ``mid_block_additional_residual`` for one call
    of ``members`` (their rows of ``inputs`` and ``times`` in order; ``texts``: each member's own
    prompt rows, unpadded), or (None, None) where no member's control acts at this step."""
    groups: dict[tuple[str, int], list[tuple[int, Any, float]]] = {}
    start = 0
    for m, text in zip(members, texts):
        control = getattr(m, "control", None)
        if control is not None and (scale := control.now(m.done, m.total)) != 0.0:
            groups.setdefault((control.name, text.shape[1]), []).append((start, m, scale))
        start += m.rows
    if not groups:
        return None, None
    down: list[torch.Tensor] | None = None
    mid: torch.Tensor | None = None
    for (name, _), entries in groups.items():
        rows = torch.cat([torch.arange(s, s + m.rows) for s, m, _ in entries]).to(inputs.device)
        scales = torch.cat([torch.full((m.rows,), scale) for _, m, scale in entries]).to(inputs.device)
        texts_of = torch.cat([texts[members.index(m)] for _, m, _ in entries])
        cond = torch.cat([m.control.cond for _, m, _ in entries])
        got_down, got_mid = controlnets[name](inputs.index_select(0, rows), times.index_select(0, rows),
                                              encoder_hidden_states=texts_of, controlnet_cond=cond,
                                              conditioning_scale=1.0, guess_mode=False, return_dict=False)  # fmt: skip
        if down is None or mid is None:
            down = [torch.zeros((inputs.shape[0], *d.shape[1:]), dtype=d.dtype, device=d.device) for d in got_down]
            mid = torch.zeros((inputs.shape[0], *got_mid.shape[1:]), dtype=got_mid.dtype, device=got_mid.device)
        for total, part in zip([*down, mid], [*got_down, got_mid]):
            # in float32, as the pipeline's ``sample * conditioning_scale`` multiplies by a Python float
            total.index_copy_(0, rows, (part.float() * scales.reshape(-1, 1, 1, 1)).to(part.dtype))
    return down, mid
