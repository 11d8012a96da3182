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

FLUX.1 (``FluxControlNetPipeline``) likewise: a member's map is prepared as that pipeline prepares it
(``flux_member_control``: encoded by the VAE with the member's own generators, before its starting
latents are drawn from them, and packed; a ControlNet with an input hint block takes the pixels), its
ControlNet gets its own guidance rows where its config embeds guidance, and ``flux_residuals`` gives
the transformer's ``controlnet_block_samples`` and ``controlnet_single_block_samples`` for the whole
call, zeros on the rows of members without a control acting now. The ControlNets of one FLUX loop
share their block counts (``loopable``); otherwise control requests run as whole calls.
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


@dataclass
class FlowControl(MemberControl):
    """A FLUX.1 member's ControlNet: its map packed (or its pixels, for a hint block) and its guidance rows."""

    guidance: torch.Tensor | None = None  # its ControlNet's own, where its config embeds guidance, per image


def flux_member_control(pipe: Any, controlnets: dict[str, Any], job: InferenceJob, generators: list[torch.Generator],
                        device: torch.device) -> FlowControl | None:  # fmt: skip
    """The member's control as ``FluxControlNetPipeline`` prepares it (step 3, before the latents: the
    VAE's sample takes the member's generators first), or None without one."""
    name, scale, start, end = settings_of(job)
    if name == NONE:
        return None
    if name not in controlnets:
        raise ValueError(f"no ControlNet named {name!r} is loaded")
    net = controlnets[name]
    image = pipe.image_processor.preprocess(list(job.controls), height=job.height, width=job.width)
    cond = image.to(device=device, dtype=pipe.vae.dtype)
    if net.input_hint_block is None:  # InstantX's kind: the map's packed VAE latents
        from diffusers.pipelines.flux.pipeline_flux_controlnet import retrieve_latents

        latents = retrieve_latents(pipe.vae.encode(cond), generator=generators)  # type: ignore[arg-type]  # a list, as the pipeline passes
        latents = (latents - pipe.vae.config.shift_factor) * pipe.vae.config.scaling_factor
        cond = pipe._pack_latents(latents, latents.shape[0], latents.shape[1], latents.shape[2], latents.shape[3])
    guidance = None
    if net.config.guidance_embeds:
        guidance = torch.full([job.num_images], job.guidance_scale, device=device, dtype=torch.float32)
    return FlowControl(name, cond, scale, start, end, guidance)


def loopable(controlnets: dict[str, Any]) -> bool:
    """Whether the ControlNets can share one FLUX loop: the same block counts and kind (the transformer
    takes one list of samples for every row)."""
    shapes = {(len(n.controlnet_blocks), len(n.controlnet_single_blocks), n.input_hint_block is None)
              for n in controlnets.values()}  # fmt: skip
    return len(shapes) <= 1


def flux_residuals(
    controlnets: dict[str, Any], members: list[Any], latents: torch.Tensor, timestep: torch.Tensor,
    texts: torch.Tensor, pooled: torch.Tensor, ids: tuple[torch.Tensor, torch.Tensor],
) -> tuple[list[torch.Tensor] | None, list[torch.Tensor] | None, bool]:  # fmt: skip
    """The FLUX.1 transformer's ``controlnet_block_samples``, ``controlnet_single_block_samples`` and
    ``controlnet_blocks_repeat`` for one call of ``members`` (their rows of ``latents``, ``timestep``, the
    call's ``timestep / 1000``, ``texts`` and ``pooled`` in order; ``ids``: the text's and the image's),
    each row's scaled by its member's weight, zeros elsewhere; (None, None, False) where none acts now."""
    groups: dict[str, list[tuple[int, Any, float]]] = {}
    start = 0
    for m in members:
        control = getattr(m, "control", None)
        if control is not None and (scale := control.now(m.done, m.total)) != 0.0:
            groups.setdefault(control.name, []).append((start, m, scale))
        start += m.rows
    if not groups:
        return None, None, False
    totals: list[list[torch.Tensor] | None] = [None, None]
    repeat = False
    for name, entries in groups.items():
        net = controlnets[name]
        repeat = net.input_hint_block is not None
        rows = torch.cat([torch.arange(s, s + m.rows) for s, m, _ in entries]).to(latents.device)
        scales = torch.cat([torch.full((m.rows,), scale) for _, m, scale in entries]).to(latents.device)
        guidance = [m.control.guidance for _, m, _ in entries]
        cond = torch.cat([m.control.cond for _, m, _ in entries])
        got = net(hidden_states=latents.index_select(0, rows), controlnet_cond=cond, controlnet_mode=None,
                  conditioning_scale=1.0, timestep=timestep.index_select(0, rows),
                  guidance=torch.cat(guidance) if guidance[0] is not None else None,
                  pooled_projections=pooled.index_select(0, rows), encoder_hidden_states=texts.index_select(0, rows),
                  txt_ids=ids[0], img_ids=ids[1], joint_attention_kwargs={}, return_dict=False)  # fmt: skip
        for k, parts in enumerate(got):
            if parts is None:
                continue
            if totals[k] is None:
                totals[k] = [
                    torch.zeros((latents.shape[0], *p.shape[1:]), dtype=p.dtype, device=p.device) for p in parts
                ]
            for total, part in zip(totals[k] or [], parts):
                shape = (-1, *[1] * (part.ndim - 1))
                total.index_copy_(0, rows, (part.float() * scales.reshape(shape)).to(part.dtype))
    return totals[0], totals[1], repeat


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
