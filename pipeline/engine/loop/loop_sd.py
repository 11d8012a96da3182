"""The step-level loop of ``StableDiffusionPipeline`` (SD 1.x and 2.x, epsilon and v-prediction).

Each member is what one ``StableDiffusionPipeline.__call__`` keeps (diffusers 0.42), step for step:

1. **Guidance** as the pipeline decides ``do_classifier_free_guidance``: ``guidance_scale > 1`` and
   a UNet without a guidance embedding (``time_cond_proj_dim``, LCM-distilled UNets, which get
   their guidance as ``timestep_cond`` per row instead).
2. **Prompts** as the model's own calls encode them (``DiffusersModel.clip_embeddings``: AUTOMATIC1111's
   weights and chunks of 75 tokens, ``prompt_weights``); rows ``[uncond, cond]`` with guidance, ``[cond]``
   without.
3. **Sampler** ``samplers.build`` from the model's config, then ``retrieve_timesteps``.
4. **Latents** ``randn_tensor`` with the member's list of per-image CPU generators, times its
   sampler's ``init_noise_sigma`` (the pipeline's ``prepare_latents``, which reads
   ``pipe.scheduler``: never used here, so the pipeline's own scheduler stays untouched).
5. **Step kwargs** the pipeline's ``prepare_extra_step_kwargs`` (eta 0, the same generators).

A step scales each member's input with its own ``scale_model_input`` at its own timestep, runs
the UNet once on all rows (the timestep as a per-row vector; members whose prompts take other numbers
of 77-token chunks are padded to the longest and masked, ``stacked_texts``), then guides each
member's slice with its own scale. The decode is
the pipeline's: ``latents / scaling_factor``, the VAE, the safety checker when there is one, and
``image_processor.postprocess(..., output_type="pil")``.

Members need not share the negative prompt or whether they use guidance: the loop key is the size
and the sampler name.

An image-to-image member (``job.mode == "image"``) is what ``StableDiffusionImg2ImgPipeline.__call__``
keeps: the last ``int(steps × strength)`` of its sampler's timesteps (``get_timesteps``, with the
sampler's begin index), and its pictures' VAE latents noised to the first of them
(``prepare_latents``: each picture encoded with its own generator, then the noise from the same
generators). It then steps beside text members, each at its own timestep: it enters a running
loop at its own first timestep as a text member enters at its step 0.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion import retrieve_timesteps
from diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion_img2img import retrieve_latents
from diffusers.utils.torch_utils import randn_tensor
from PIL import Image

from ...protocol import InferenceJob
from ..model import samplers
from .control import member_control, residuals
from .loop_base import LoopMember, MemberLoop, generators_of, step_kwargs


class SDLoop(MemberLoop):
    """``joining.Loop`` for ``StableDiffusionPipeline`` (see the module docstring)."""

    def _enter(self, job: InferenceJob) -> LoopMember:
        pipe, device = self.pipe, self.device
        unet_config = pipe.unet.config
        # 1. Guidance, as the pipeline decides it.
        cfg = job.guidance_scale > 1 and unet_config.time_cond_proj_dim is None
        # 2. Prompts as the model's own calls encode them (A1111's chunks and weights: ``prompt_weights``).
        embeds, negative_embeds = self.model.clip_embeddings(job, negatives=cfg)
        if negative_embeds is not None:
            embeds = torch.cat([negative_embeds, embeds])
        rows_of = {"encoder_hidden_states": embeds}
        # 3. The member's own scheduler and timesteps.
        sampler = samplers.build(self.model.base_sampler, job.sampler)
        timesteps, _ = retrieve_timesteps(sampler, job.num_inference_steps, device)
        # 4. Starting latents from the member's own generators (prepare_latents, with its scheduler).
        generators = generators_of(job)
        if job.mode == "image":  # image-to-image: its picture, noised to its own first timestep
            timesteps, latents = self._from_pictures(job, sampler, generators, embeds.dtype)
        else:
            scale = pipe.vae_scale_factor
            shape = (job.num_images, unet_config.in_channels, int(job.height) // scale, int(job.width) // scale)
            latents = randn_tensor(shape, generator=generators, device=device, dtype=embeds.dtype)
            latents = latents * sampler.init_noise_sigma
        # 5. Guidance embedding of guidance-distilled UNets (rows [cond] only: no CFG there).
        if unet_config.time_cond_proj_dim is not None:
            scales = torch.tensor(job.guidance_scale - 1).repeat(job.num_images)
            rows_of["timestep_cond"] = pipe.get_guidance_scale_embedding(
                scales, embedding_dim=unet_config.time_cond_proj_dim
            ).to(device=device, dtype=latents.dtype)
        return LoopMember(
            job=job,
            sampler=sampler,
            timesteps=timesteps,
            latents=latents,
            cfg=cfg,
            rows_of=rows_of,
            step_kwargs=step_kwargs(sampler, generators),
            # 6. Its ControlNet map, scale and window (issue 51), as the ControlNet pipeline prepares them.
            control=member_control(pipe, self.model.controlnets, job, cfg, device, latents.dtype),
        )

    def _from_pictures(
        self, job: InferenceJob, sampler: Any, generators: list[torch.Generator], dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``StableDiffusionImg2ImgPipeline``'s ``get_timesteps`` and ``prepare_latents``: the last
        ``int(steps × strength)`` timesteps, and each picture's VAE latents (sampled with its own
        generator) noised to the first of them with noise from the same generators."""
        pipe, device = self.pipe, self.device
        steps = job.num_inference_steps
        start = max(steps - min(int(steps * job.strength), steps), 0) * sampler.order
        timesteps = sampler.timesteps[start:]
        if hasattr(sampler, "set_begin_index"):
            sampler.set_begin_index(start)
        pixels = pipe.image_processor.preprocess(list(job.images)).to(device=device, dtype=dtype)
        encoded = torch.cat(
            [retrieve_latents(pipe.vae.encode(pixels[i : i + 1]), generator=gen) for i, gen in enumerate(generators)]
        )
        encoded = pipe.vae.config.scaling_factor * encoded
        noise = randn_tensor(encoded.shape, generator=generators, device=device, dtype=dtype)
        return timesteps, sampler.add_noise(encoded, noise, timesteps[:1].repeat(encoded.shape[0]))

    def _predict(self, members: list[LoopMember]) -> list[torch.Tensor]:
        inputs, times = [], []
        for m in members:
            x = torch.cat([m.latents] * 2) if m.cfg else m.latents
            if hasattr(m.sampler, "scale_model_input"):
                x = m.sampler.scale_model_input(x, m.timestep)
            inputs.append(x)
            times.append(m.timestep.reshape(1).expand(x.shape[0]))
        conditioning = {name: torch.cat([m.rows_of[name] for m in members]) for name in members[0].rows_of if
                        name != "encoder_hidden_states"}  # fmt: skip
        own_texts = [m.rows_of["encoder_hidden_states"] for m in members]
        texts, mask = stacked_texts(own_texts)
        x, t = torch.cat(inputs), torch.cat(times)
        down, mid = residuals(self.model.controlnets, members, x, t, own_texts)  # each member's own ControlNet
        with text_pooled_per_row(self.pipe.unet, mask):
            out = self.pipe.unet(
                x,
                t,
                encoder_hidden_states=texts,
                encoder_attention_mask=mask,
                timestep_cond=conditioning.get("timestep_cond"),
                cross_attention_kwargs=None,
                added_cond_kwargs=None,
                down_block_additional_residuals=down,
                mid_block_additional_residual=mid,
                return_dict=False,
            )[0]
        return [m.guided(chunk) for m, chunk in zip(members, out.split([m.rows for m in members]))]

    def _pixels(self, latents: torch.Tensor, job: InferenceJob) -> list[Image.Image]:
        pipe = self.pipe
        image = pipe.vae.decode(latents / pipe.vae.config.scaling_factor, return_dict=False)[0]
        image, nsfw = pipe.run_safety_checker(image, self.device, latents.dtype)  # latents: the embeddings' dtype
        denormalize = [True] * image.shape[0] if nsfw is None else [not flagged for flagged in nsfw]
        images: Any = pipe.image_processor.postprocess(image, output_type="pil", do_denormalize=denormalize)
        return list(images)


def stacked_texts(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The members' prompt embeddings as one tensor. Prompts of one chunk count stack as they are;
    of several, each is padded to the longest and masked there (``encoder_attention_mask``: the
    cross-attention gives the padding no weight), so each member reads only its own chunks and draws
    what it draws alone (issue 49). None: no mask (every member's count is the same)."""
    longest = max(r.shape[1] for r in rows)
    if all(r.shape[1] == longest for r in rows):
        return torch.cat(rows), None
    positions = torch.arange(longest, device=rows[0].device)
    mask = torch.cat([(positions < r.shape[1]).expand(r.shape[0], -1) for r in rows]).long()
    padded = [torch.nn.functional.pad(r, (0, 0, 0, longest - r.shape[1])) for r in rows]
    return torch.cat(padded), mask


@contextlib.contextmanager
def text_pooled_per_row(unet: Any, mask: torch.Tensor | None) -> Iterator[None]:
    """A UNet that pools the prompt into its time embedding (``addition_embed_type`` "text": the
    embedded default model's ``TextTimeEmbedding``) pools over every position, the padding too, with no
    mask: for this call, each row is pooled over its own positions alone (``mask``'s ones)."""
    embedding = getattr(unet, "add_embedding", None)
    if mask is None or embedding is None or getattr(unet.config, "addition_embed_type", None) != "text":
        yield
        return
    lengths = [int(n) for n in mask.sum(dim=1).tolist()]

    def per_row(module: Any, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        handle.remove()  # the calls below run the module itself, without this hook
        return torch.cat([module(args[0][i : i + 1, :n]) for i, n in enumerate(lengths)])

    handle = embedding.register_forward_hook(per_row)
    try:
        yield
    finally:
        handle.remove()
