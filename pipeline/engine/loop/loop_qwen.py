"""The step-level loop of ``QwenImagePipeline`` (diffusers 0.42), step for step.

Each member is what one pipeline ``__call__`` keeps:

1. Prompts through the pipeline's ``encode_prompt`` (Qwen2.5-VL's last hidden state, the template's
   first tokens dropped, one length per prompt, padded to the call's longest with a mask); with true
   CFG (``true_cfg_scale > 1`` and a negative prompt, which the app always sends: ``" "`` for an empty
   one, as the model card's examples do) the negative prompts the same way. Here the negative and
   positive rows are rows of one transformer call (the pipeline makes two calls: the same per-row
   arithmetic), every member's text padded to the loop's longest, the padding masked
   (``encoder_hidden_states_mask``); the text's rotary positions start at the same place for any
   length, so a row reads what it reads alone.
2. Latents through the pipeline's own ``prepare_latents`` with the member's per-image CPU generators
   (packed 2x2).
3. Scheduler ``samplers.build``, then ``retrieve_timesteps`` with the pipeline's sigmas
   (``linspace(1, 1/N, N)``) and its dynamic shift ``mu`` from the token count, ``set_begin_index(0)``.
4. Per step the timestep ``t / 1000`` per row, then the member's true CFG with the pipeline's
   renormalisation: ``neg + s·(cond - neg)``, rescaled to the conditional prediction's norm per token.

The decode is the pipeline's: unpack to ``(B, C, 1, h, w)``, ``latents / (1 / std) + mean`` per
channel, the VAE's first frame, ``image_processor.postprocess``.

First-Block Cache per row (issue 50, ``step_cache.RowCache``) runs the transformer's forward here
(``qwen_rows``): the first block on every row, the remaining blocks on the rows that miss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from diffusers.models.transformers.transformer_qwenimage import compute_text_seq_len_from_mask
from diffusers.pipelines.flux.pipeline_flux import calculate_shift, retrieve_timesteps
from PIL import Image

from ...protocol import InferenceJob
from ..model import samplers
from ..model.families import call_arguments, call_default
from . import loop_flow  # its row_hits and rows_kept, read at the call (a mutant replaces row_hits there)
from .loop_base import LoopMember, MemberLoop, generators_of
from .step_cache import RowCache


@dataclass
class QwenMember(LoopMember):
    """A Qwen-Image member: rows ``[negative, prompt]`` with true CFG, each row's text mask in ``rows_of``."""

    def guided(self, prediction: torch.Tensor) -> torch.Tensor:
        """The pipeline's true CFG, renormalised to the conditional prediction's norm per token."""
        if not self.cfg:
            return prediction
        negative, cond = prediction.chunk(2)
        combined = negative + self.job.guidance_scale * (cond - negative)
        return combined * (torch.norm(cond, dim=-1, keepdim=True) / torch.norm(combined, dim=-1, keepdim=True))


def _padded(tensors: list[torch.Tensor], length: int) -> torch.Tensor:
    """Each ``(rows, tokens, ...)`` tensor zero-padded along its tokens to ``length``, stacked as rows."""
    out = []
    for t in tensors:
        pad = length - t.shape[1]
        out.append(torch.cat([t, t.new_zeros(t.shape[0], pad, *t.shape[2:])], dim=1) if pad else t)
    return torch.cat(out)


class QwenImageLoop(MemberLoop):
    """``joining.Loop`` for ``QwenImagePipeline`` (see the module docstring)."""

    def _enter(self, job: InferenceJob) -> LoopMember:
        pipe, device = self.pipe, self.device
        profile = self.model.profile
        negative = call_arguments(profile.family, job.negative_prompts, profile.supports_negative_prompt,
                                  "true_cfg").get("negative_prompt")  # fmt: skip
        cfg = job.guidance_scale > 1 and negative is not None
        length = call_default(pipe, "max_sequence_length", 512)

        def encoded(prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
            embeds, mask = pipe.encode_prompt(prompt=prompts, device=device, max_sequence_length=length)
            if mask is None:
                mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=device)
            return embeds, mask

        embeds, mask = encoded(list(job.prompts))
        if negative is not None and cfg:
            negative_embeds, negative_mask = encoded(list(negative))
            longest = max(embeds.shape[1], negative_embeds.shape[1])
            embeds = _padded([negative_embeds, embeds], longest)
            mask = _padded([negative_mask, mask], longest)
        channels = pipe.transformer.config.in_channels // 4
        latents = pipe.prepare_latents(
            job.num_images, channels, job.height, job.width, embeds.dtype, device, generators_of(job), None
        )
        sampler = samplers.build(self.model.base_sampler, job.sampler)
        steps = job.num_inference_steps
        config = sampler.config
        mu = calculate_shift(
            latents.shape[1],
            config.get("base_image_seq_len", 256),
            config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5),
            config.get("max_shift", 1.15),
        )
        sigmas: Any = np.linspace(1.0, 1 / steps, steps)
        timesteps, _ = retrieve_timesteps(sampler, steps, device, sigmas=sigmas, mu=mu)
        sampler.set_begin_index(0)
        shape = (1, job.height // pipe.vae_scale_factor // 2, job.width // pipe.vae_scale_factor // 2)
        return QwenMember(job=job, sampler=sampler, timesteps=timesteps, latents=latents, cfg=cfg,
                          rows_of={"encoder_hidden_states": embeds, "encoder_hidden_states_mask": mask},
                          shared={"img_shape": shape})  # fmt: skip

    def _predict(self, members: list[LoopMember]) -> list[torch.Tensor]:
        inputs = torch.cat([torch.cat([m.latents] * 2) if m.cfg else m.latents for m in members])
        timestep = torch.cat([m.timestep.expand(m.rows).to(inputs.dtype) for m in members]) / 1000
        longest = max(m.rows_of["encoder_hidden_states"].shape[1] for m in members)
        texts = _padded([m.rows_of["encoder_hidden_states"] for m in members], longest)
        mask: torch.Tensor | None = _padded([m.rows_of["encoder_hidden_states_mask"] for m in members], longest)
        assert mask is not None
        if bool(mask.all()):
            mask = None  # as ``encode_prompt`` leaves it: no padding, no mask
        shapes = [[members[0].shared["img_shape"]]] * inputs.shape[0]
        transformer = self.pipe.transformer
        if any(isinstance(m.cache, RowCache) for m in members):  # First-Block Cache, per row (issue 50)
            out = qwen_rows(transformer, members, inputs, timestep, texts, mask, shapes)
        else:
            out = transformer(
                hidden_states=inputs,
                timestep=timestep,
                guidance=None,
                encoder_hidden_states_mask=mask,
                encoder_hidden_states=texts,
                img_shapes=shapes,
                attention_kwargs={},
                return_dict=False,
            )[0]
        return [m.guided(chunk) for m, chunk in zip(members, out.split([m.rows for m in members]))]

    def _pixels(self, latents: torch.Tensor, job: InferenceJob) -> list[Image.Image]:
        pipe = self.pipe
        vae = pipe.vae
        latents = pipe._unpack_latents(latents, job.height, job.width, pipe.vae_scale_factor).to(vae.dtype)
        channels = vae.config.z_dim
        mean = torch.tensor(vae.config.latents_mean).view(1, channels, 1, 1, 1).to(latents.device, latents.dtype)
        std = 1.0 / torch.tensor(vae.config.latents_std).view(1, channels, 1, 1, 1).to(latents.device, latents.dtype)
        image = vae.decode(latents / std + mean, return_dict=False)[0][:, :, 0]
        images: Any = pipe.image_processor.postprocess(image, output_type="pil")
        return list(images)


def qwen_rows(
    transformer: Any,
    members: list[LoopMember],
    inputs: torch.Tensor,
    timestep: torch.Tensor,
    texts: torch.Tensor,
    mask: torch.Tensor | None,
    shapes: list[Any],
) -> torch.Tensor:
    """diffusers 0.42's Qwen-Image transformer forward (no ControlNet, no guidance embedding, no
    ``zero_cond_t``), with First-Block Cache decided per row as ``loop_flow.flux_rows``: the first block
    on every row, the remaining blocks on the rows that miss with their text and mask."""
    t = transformer
    hidden = t.img_in(inputs)
    temb = t.time_text_embed(timestep.to(hidden.dtype), hidden)
    texts = t.txt_in(t.txt_norm(texts))
    text_length, _, mask = compute_text_seq_len_from_mask(texts, mask)
    rotary = t.pos_embed(shapes, max_txt_seq_len=text_length, device=hidden.device)
    blocks = t.transformer_blocks
    kwargs: dict[str, Any] = dict(image_rotary_emb=rotary, joint_attention_kwargs={}, modulate_index=None)
    texts, first_out = blocks[0](hidden_states=hidden, encoder_hidden_states=texts, encoder_hidden_states_mask=mask,
                                 temb=temb, **kwargs)  # fmt: skip
    first = first_out - hidden
    hits = loop_flow.row_hits(members, first)
    out = first_out.clone()
    miss = (~hits).nonzero().squeeze(1)
    if miss.numel():
        h, e, tm = first_out.index_select(0, miss), texts.index_select(0, miss), temb.index_select(0, miss)
        m = mask.index_select(0, miss) if mask is not None else None
        for block in blocks[1:]:
            e, h = block(hidden_states=h, encoder_hidden_states=e, encoder_hidden_states_mask=m, temb=tm, **kwargs)
        out.index_copy_(0, miss, h)
    return t.proj_out(t.norm_out(loop_flow.rows_kept(members, hits, first, first_out, out), temb))
