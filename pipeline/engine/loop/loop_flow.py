"""The step-level loops of the flow-matching families: ``FluxPipeline``, ``StableDiffusion3Pipeline``,
``ChromaPipeline`` and ``ZImagePipeline``.

Each member is what one pipeline ``__call__`` keeps (diffusers 0.42), step for step.

**FLUX** (dev with a guidance embedding, schnell without; no true CFG: the app never sends
``true_cfg_scale``, so every member has one row per image):

1. Prompts through the pipeline's ``encode_prompt`` (CLIP pooled + T5 padded to the call's
   ``max_sequence_length``, so every member's T5 rows stack and the text ids are the same).
2. Latents through the pipeline's own ``prepare_latents`` with the member's per-image CPU
   generators: packed 2x2, with latent image ids (the same for every member of a size).
3. Scheduler ``samplers.build``, then ``retrieve_timesteps`` with the pipeline's sigmas
   (``linspace(1, 1/N, N)``) and its dynamic shift ``mu`` (from the token count: same size, same mu),
   and ``set_begin_index(0)``.
4. Guidance (dev): the member's scale, as a per-row vector next to the per-row timestep.

**SD3** (flow-matching Euler, classifier-free guidance per member when ``guidance_scale > 1``):

1. Prompts as the model's calls encode them (``DiffusersModel.encoded``: CLIP-L + CLIP-G in chunks of
   77, A1111's syntax read, then T5 at ``max_sequence_length`` tokens; a plain short prompt is the
   pipeline's ``encode_prompt`` to the bit), rows ``[uncond, cond]`` for the embeddings and the pooled
   embeddings with guidance. Its joint attention takes no text mask, so a loop holds one CLIP chunk
   count (the scheduler keys it: ``fields.CHUNK_KEYED``).
2. Latents through ``prepare_latents`` with the member's generators.
3. Scheduler and ``retrieve_timesteps`` (``mu`` only where the config shifts dynamically).

**Chroma** (FLUX's packed 2x2 latents and T5 conditioning, no pooled embedding, classifier-free
guidance when ``guidance_scale > 1``, an attention mask over the padded T5 tokens):

1. Prompts through ``encode_prompt`` at the call's ``max_sequence_length`` (512), with their masks;
   with guidance, rows ``[negative, prompt]`` (the pipeline runs the two as separate transformer
   calls; here they are rows of one call, the same per-row arithmetic).
2. Latents through ``prepare_latents`` with the member's generators; masks extended over the image
   tokens as ``_prepare_attention_mask`` does.
3. FLUX's sigmas ``linspace(1, 1/N, N)`` and dynamic shift ``mu``, ``set_begin_index(0)``.

**Z-Image** (a transformer that takes *lists* of latents and of variable-length prompt embeddings,
so members with prompts of any length share one call; classifier-free guidance when
``guidance_scale > 0``, with the pipeline's CFG truncation and renormalisation per member):

1. Prompts (and, with guidance, negative prompts) through ``encode_prompt``: one embedding per prompt.
2. Latents through ``prepare_latents`` (float32) with the member's generators.
3. ``get_default_z_image_sigmas`` and the dynamic shift from the token count, ``set_begin_index(0)``.
4. Per step the timestep ``(1000 - t) / 1000`` per row, the member's guidance (0 once its
   ``cfg_truncation`` is passed), and the negated prediction to its own sampler.

One step runs the transformer once on every member's rows, each at its own timestep, then each
member's own ``sampler.step``. The decode is the pipeline's: (unpack,) ``latents /
scaling_factor + shift_factor``, the VAE, ``image_processor.postprocess(..., output_type="pil")``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from diffusers.pipelines.flux.pipeline_flux import calculate_shift as flux_shift
from diffusers.pipelines.flux.pipeline_flux import retrieve_timesteps
from diffusers.pipelines.stable_diffusion_3.pipeline_stable_diffusion_3 import calculate_shift as sd3_shift
from diffusers.pipelines.z_image.pipeline_z_image import calculate_shift as z_shift
from diffusers.pipelines.z_image.pipeline_z_image import get_default_z_image_sigmas
from PIL import Image

from ...protocol import InferenceJob
from ..model import samplers
from ..model.families import call_arguments, call_default
from .control import flux_member_control, flux_residuals
from .loop_base import LoopMember, MemberLoop, generators_of
from .step_cache import RowCache


def _cat_rows(members: list[LoopMember], name: str) -> torch.Tensor:
    return torch.cat([m.rows_of[name] for m in members])


def packed_latents(pipe: Any, job: InferenceJob, dtype: torch.dtype, device: torch.device,
                   generators: list[torch.Generator] | None = None) -> Any:  # fmt: skip
    """FLUX-style 2x2-packed starting latents and their image ids, from the member's own generators
    (``generators``: those a ControlNet's map was encoded with first, else fresh ones)."""
    channels = pipe.transformer.config.in_channels // 4
    return pipe.prepare_latents(
        job.num_images, channels, job.height, job.width, dtype, device, generators or generators_of(job), None
    )


def _shift(config: Any, tokens: int, fn: Any) -> float:
    """The dynamic shift ``mu`` for ``tokens`` image tokens (``fn``: the pipeline's ``calculate_shift``)."""
    return float(
        fn(
            tokens,
            config.get("base_image_seq_len", 256),
            config.get("max_image_seq_len", 4096),
            config.get("base_shift", 0.5),
            config.get("max_shift", 1.15),
        )
    )


def _negatives(loop: _FlowLoop, job: InferenceJob) -> Any:
    """The negative prompts exactly as ``DiffusersModel.call_arguments`` sends them (or None)."""
    profile = loop.model.profile
    return call_arguments(profile.family, job.negative_prompts, profile.supports_negative_prompt).get("negative_prompt")


class _FlowLoop(MemberLoop):
    """The decode every flow family here shares: ``latents / scaling_factor + shift_factor``, then the VAE."""

    def _pixels(self, latents: torch.Tensor, job: InferenceJob) -> list[Image.Image]:
        pipe = self.pipe
        config = pipe.vae.config
        latents = latents / config.scaling_factor + (getattr(config, "shift_factor", None) or 0.0)
        image = pipe.vae.decode(latents, return_dict=False)[0]
        images: Any = pipe.image_processor.postprocess(image, output_type="pil")
        return list(images)


class FluxLoop(_FlowLoop):
    """``joining.Loop`` for ``FluxPipeline`` (see the module docstring)."""

    def _enter(self, job: InferenceJob) -> LoopMember:
        pipe, device = self.pipe, self.device
        # 1. Prompts (CLIP pooled + T5, A1111's syntax read), exactly as the model's calls encode them.
        embeds, pooled, text_ids = self.model.flux_embeddings(job, device)
        # 2. Its ControlNet's map (issue 51), encoded with the member's own generators first, as
        #    ``FluxControlNetPipeline`` does; then packed latents and their image ids from the same generators.
        generators = generators_of(job)
        control = flux_member_control(pipe, self.model.controlnets, job, generators, device)
        latents, image_ids = packed_latents(pipe, job, embeds.dtype, device, generators)
        # 3. The member's own scheduler: the pipeline's sigmas and dynamic shift.
        sampler = samplers.build(self.model.base_sampler, job.sampler)
        steps = job.num_inference_steps
        sigmas: Any = np.linspace(1.0, 1 / steps, steps)
        if getattr(sampler.config, "use_flow_sigmas", False):
            sigmas = None
        mu = _shift(sampler.config, latents.shape[1], flux_shift)
        timesteps, _ = retrieve_timesteps(sampler, steps, device, sigmas=sigmas, mu=mu)
        sampler.set_begin_index(0)
        rows_of = {"encoder_hidden_states": embeds, "pooled_projections": pooled}
        # 4. Guidance-distilled (dev): the member's scale as rows of a vector.
        if pipe.transformer.config.guidance_embeds:
            rows_of["guidance"] = torch.full([job.num_images], job.guidance_scale, device=device, dtype=torch.float32)
        return LoopMember(
            job=job,
            sampler=sampler,
            timesteps=timesteps,
            latents=latents,
            cfg=False,
            rows_of=rows_of,
            shared={"txt_ids": text_ids, "img_ids": image_ids},
            control=control,
        )

    def _predict(self, members: list[LoopMember]) -> list[torch.Tensor]:
        latents = torch.cat([m.latents for m in members])
        timestep = torch.cat([m.timestep.expand(m.images).to(latents.dtype) for m in members])
        transformer = self.pipe.transformer
        pooled, texts = _cat_rows(members, "pooled_projections"), _cat_rows(members, "encoder_hidden_states")
        ids = (members[0].shared["txt_ids"], members[0].shared["img_ids"])
        # each member's own ControlNet on its rows (issue 51), zeros on the others'
        control = flux_residuals(self.model.controlnets, members, latents, timestep / 1000, texts, pooled, ids)
        if any(isinstance(m.cache, RowCache) for m in members):  # First-Block Cache, per row (issue 50)
            out = flux_rows(
                transformer, members, latents, timestep,
                _cat_rows(members, "guidance") if "guidance" in members[0].rows_of else None,
                pooled, texts, *ids, control,
            )  # fmt: skip
            return list(out.split([m.rows for m in members]))
        with transformer.cache_context("cond"):
            out = transformer(
                hidden_states=latents,
                timestep=timestep / 1000,
                guidance=_cat_rows(members, "guidance") if "guidance" in members[0].rows_of else None,
                pooled_projections=pooled,
                encoder_hidden_states=texts,
                controlnet_block_samples=control[0],
                controlnet_single_block_samples=control[1],
                txt_ids=ids[0],
                img_ids=ids[1],
                joint_attention_kwargs={},
                return_dict=False,
                controlnet_blocks_repeat=control[2],
            )[0]
        return list(out.split([m.rows for m in members]))

    def _pixels(self, latents: torch.Tensor, job: InferenceJob) -> list[Image.Image]:
        pipe = self.pipe
        return super()._pixels(pipe._unpack_latents(latents, job.height, job.width, pipe.vae_scale_factor), job)


def flux_rows(
    transformer: Any,
    members: list[LoopMember],
    latents: torch.Tensor,
    timestep: torch.Tensor,
    guidance: torch.Tensor | None,
    pooled: torch.Tensor,
    texts: torch.Tensor,
    txt_ids: torch.Tensor,
    img_ids: torch.Tensor,
    control: tuple[list[torch.Tensor] | None, list[torch.Tensor] | None, bool] = (None, None, False),
) -> torch.Tensor:
    """diffusers 0.42's FLUX.1 transformer forward (no IP-Adapter), with First-Block Cache decided per row
    (``step_cache.RowCache``): the first block on every row, the remaining blocks only on the rows that
    miss, each row of a cached member adding its own residual of them otherwise. Every row of a member
    without a row cache misses (runs every block), so with none cached this is the transformer's own
    forward. ``control``: the ControlNet samples (``control.flux_residuals``), added after each block as
    the forward adds them; a row decides from its first block's own residual, before its sample."""
    t = transformer
    hidden = t.x_embedder(latents)
    steps = (timestep / 1000).to(hidden.dtype) * 1000  # the loop's call passes timestep / 1000
    if guidance is None:
        temb = t.time_text_embed(steps, pooled)
    else:
        temb = t.time_text_embed(steps, guidance.to(hidden.dtype) * 1000, pooled)
    texts = t.context_embedder(texts)
    rotary = t.pos_embed(torch.cat((txt_ids, img_ids), dim=0))
    blocks = [*t.transformer_blocks, *t.single_transformer_blocks]
    kwargs: dict[str, Any] = dict(temb=temb, image_rotary_emb=rotary, joint_attention_kwargs=None)
    texts, first_out = blocks[0](hidden_states=hidden, encoder_hidden_states=texts, **kwargs)
    first = first_out - hidden
    hits = row_hits(members, first)
    out = first_out.clone()
    miss = (~hits).nonzero().squeeze(1)
    if miss.numel():
        h, e = first_out.index_select(0, miss), texts.index_select(0, miss)
        added = _sampled(control, (len(t.transformer_blocks), len(t.single_transformer_blocks)), miss)
        h = h + added(0) if added else h
        kwargs["temb"] = temb.index_select(0, miss)
        for i, block in enumerate(blocks[1:], 1):
            e, h = block(hidden_states=h, encoder_hidden_states=e, **kwargs)
            h = h + added(i) if added else h
        out.index_copy_(0, miss, h)
    return t.proj_out(t.norm_out(rows_kept(members, hits, first, first_out, out), temb))


def _sampled(
    control: tuple[list[torch.Tensor] | None, list[torch.Tensor] | None, bool], counts: tuple[int, int],
    rows: torch.Tensor,
) -> Any:  # fmt: skip
    """The ControlNet sample the FLUX.1 forward adds after its block ``i`` (the double blocks, then the
    single ones; ``counts``: how many of each), on ``rows``, as a function of ``i``; None without a
    ControlNet acting now."""
    samples, singles, repeat = control
    if samples is None and singles is None:
        return None
    doubles = counts[0]

    def at(i: int) -> torch.Tensor | float:
        listed, index, count = (samples, i, doubles) if i < doubles else (singles, i - doubles, counts[1])
        if not listed:
            return 0.0
        if repeat and i < doubles:
            return listed[index % len(listed)].index_select(0, rows)
        return listed[index // int(np.ceil(count / len(listed)))].index_select(0, rows)

    return at


def row_hits(members: list[LoopMember], first: torch.Tensor, counts: list[int] | None = None) -> torch.Tensor:
    """Which rows skip the remaining blocks: each First-Block-cached member's rows by its own residuals
    (``first``: every row's first-block residual; ``counts``: each member's rows in this call, else
    ``m.rows``); every other member's rows run them."""
    counts = counts or [m.rows for m in members]
    return torch.cat([
        m.cache.hits(own) if isinstance(m.cache, RowCache) else torch.zeros(n, dtype=torch.bool)
        for m, n, own in zip(members, counts, first.split(counts))
    ])  # fmt: skip


def rows_kept(
    members: list[LoopMember],
    hits: torch.Tensor,
    first: torch.Tensor,
    first_out: torch.Tensor,
    out: torch.Tensor,
    counts: list[int] | None = None,
) -> torch.Tensor:
    """``out`` (the last block's output, for the rows that missed) with each hit row's own cached residual
    of the remaining blocks added to its first block's output; each cached member keeps its new ones."""
    start, counts = 0, counts or [m.rows for m in members]
    for m, n, own in zip(members, counts, first.split(counts)):
        rows = slice(start, start + n)
        if isinstance(m.cache, RowCache):
            rest = m.cache.keep(hits[rows], own, out[rows] - first_out[rows])
            hit = hits[rows].reshape(-1, *[1] * (out.ndim - 1))
            out[rows] = torch.where(hit, first_out[rows] + rest, out[rows])  # a missed row: its own output
        start += n
    return out


def chroma_rows(
    transformer: Any,
    members: list[LoopMember],
    inputs: torch.Tensor,
    timestep: torch.Tensor,
    texts: torch.Tensor,
    txt_ids: torch.Tensor,
    img_ids: torch.Tensor,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """diffusers 0.42's Chroma transformer forward (no ControlNet or IP-Adapter), with First-Block Cache
    per row as ``flux_rows``: its per-block modulations sliced from the pooled embedding, its text mask
    and guidance rows selected with the rows that miss."""
    t = transformer
    hidden = t.x_embedder(inputs)
    pooled = t.distilled_guidance_layer(t.time_text_embed((timestep / 1000).to(hidden.dtype) * 1000))
    texts = t.context_embedder(texts)
    rotary = t.pos_embed(torch.cat((txt_ids, img_ids), dim=0))
    doubles, singles = t.transformer_blocks, t.single_transformer_blocks
    img_offset = 3 * len(singles)
    txt_offset = img_offset + 6 * len(doubles)

    def double(i: int, p: torch.Tensor) -> torch.Tensor:
        a, b = img_offset + 6 * i, txt_offset + 6 * i
        return torch.cat((p[:, a : a + 6], p[:, b : b + 6]), dim=1)

    kwargs: dict[str, Any] = dict(image_rotary_emb=rotary, attention_mask=mask, joint_attention_kwargs=None)
    texts, first_out = doubles[0](hidden_states=hidden, encoder_hidden_states=texts, temb=double(0, pooled), **kwargs)
    first = first_out - hidden
    hits = row_hits(members, first)
    out = first_out.clone()
    miss = (~hits).nonzero().squeeze(1)
    if miss.numel():
        h, e, p = first_out.index_select(0, miss), texts.index_select(0, miss), pooled.index_select(0, miss)
        kwargs["attention_mask"] = mask.index_select(0, miss) if mask is not None else None
        for i in range(1, len(doubles)):
            e, h = doubles[i](hidden_states=h, encoder_hidden_states=e, temb=double(i, p), **kwargs)
        text_length = e.shape[1]
        h = torch.cat([e, h], dim=1)
        for i, block in enumerate(singles):
            h = block(hidden_states=h, temb=p[:, 3 * i : 3 * i + 3], **kwargs)
        out.index_copy_(0, miss, h[:, text_length:])
    return t.proj_out(t.norm_out(rows_kept(members, hits, first, first_out, out), pooled[:, -2:]))


class SD3Loop(_FlowLoop):
    """``joining.Loop`` for ``StableDiffusion3Pipeline`` (see the module docstring)."""

    def _enter(self, job: InferenceJob) -> LoopMember:
        pipe, device = self.pipe, self.device
        # 1. Guidance as the pipeline decides it; prompts as the model's calls encode them (A1111's
        #    syntax read; CLIP in chunks: a loop holds one chunk count, ``fields.CHUNK_KEYED``).
        cfg = job.guidance_scale > 1
        encoded = self.model.encoded(job, negatives=cfg)
        embeds, pooled = encoded.embeds, encoded.pooled
        assert pooled is not None  # both CLIPs' pooled embeddings
        held = {m.rows_of["encoder_hidden_states"].shape[1] for m in self.members.values()}
        if held and embeds.shape[1] not in held:  # the scheduler keys SD3's loops by chunk count: never met
            raise ValueError(f"SD3's loop holds prompts of {held.pop()} text tokens; this one has {embeds.shape[1]}")
        if cfg:
            assert encoded.negative is not None and encoded.negative_pooled is not None
            embeds = torch.cat([encoded.negative, embeds])
            pooled = torch.cat([encoded.negative_pooled, pooled])
        # 2. Latents from the member's own generators.
        generators = generators_of(job)
        transformer_config = pipe.transformer.config
        latents = pipe.prepare_latents(
            job.num_images,
            transformer_config.in_channels,
            job.height,
            job.width,
            embeds.dtype,
            device,
            generators,
            None,
        )
        # 3. The member's own scheduler (a dynamic shift only where its config asks for one).
        sampler = samplers.build(self.model.base_sampler, job.sampler)
        config, extra = sampler.config, {}
        if config.get("use_dynamic_shifting", None):
            patch = transformer_config.patch_size
            extra["mu"] = sd3_shift(
                (latents.shape[2] // patch) * (latents.shape[3] // patch),
                config.get("base_image_seq_len", 256),
                config.get("max_image_seq_len", 4096),
                config.get("base_shift", 0.5),
                config.get("max_shift", 1.16),
            )
        timesteps, _ = retrieve_timesteps(sampler, job.num_inference_steps, device, sigmas=None, **extra)
        return LoopMember(
            job=job,
            sampler=sampler,
            timesteps=timesteps,
            latents=latents,
            cfg=cfg,
            rows_of={"encoder_hidden_states": embeds, "pooled_projections": pooled},
        )

    def _predict(self, members: list[LoopMember]) -> list[torch.Tensor]:
        inputs = torch.cat([torch.cat([m.latents] * 2) if m.cfg else m.latents for m in members])
        timestep = torch.cat([m.timestep.expand(m.rows) for m in members])
        out = self.pipe.transformer(
            hidden_states=inputs,
            timestep=timestep,
            encoder_hidden_states=_cat_rows(members, "encoder_hidden_states"),
            pooled_projections=_cat_rows(members, "pooled_projections"),
            joint_attention_kwargs=None,
            return_dict=False,
        )[0]
        return [m.guided(chunk) for m, chunk in zip(members, out.split([m.rows for m in members]))]


class ChromaLoop(_FlowLoop):
    """``joining.Loop`` for ``ChromaPipeline`` (see the module docstring)."""

    def _enter(self, job: InferenceJob) -> LoopMember:
        pipe, device = self.pipe, self.device
        cfg = job.guidance_scale > 1
        embeds, text_ids, mask, negative_embeds, _, negative_mask = pipe.encode_prompt(
            prompt=list(job.prompts),
            negative_prompt=_negatives(self, job),
            device=device,
            num_images_per_prompt=1,
            do_classifier_free_guidance=cfg,
            max_sequence_length=call_default(pipe, "max_sequence_length", 512),
        )
        latents, image_ids = packed_latents(pipe, job, embeds.dtype, device)
        tokens = latents.shape[1]

        def extended(m: torch.Tensor) -> torch.Tensor:
            return pipe._prepare_attention_mask(batch_size=latents.shape[0], sequence_length=tokens,
                                                dtype=latents.dtype, attention_mask=m)  # fmt: skip

        sampler = samplers.build(self.model.base_sampler, job.sampler)
        steps = job.num_inference_steps
        sigmas: Any = np.linspace(1.0, 1 / steps, steps)
        mu = _shift(sampler.config, tokens, flux_shift)
        timesteps, _ = retrieve_timesteps(sampler, steps, device, sigmas=sigmas, mu=mu)
        sampler.set_begin_index(0)
        rows = {"encoder_hidden_states": embeds, "attention_mask": extended(mask)}
        if cfg:
            rows = {
                "encoder_hidden_states": torch.cat([negative_embeds, embeds]),
                "attention_mask": torch.cat([extended(negative_mask), rows["attention_mask"]]),
            }
        return LoopMember(job=job, sampler=sampler, timesteps=timesteps, latents=latents, cfg=cfg, rows_of=rows,
                      shared={"txt_ids": text_ids, "img_ids": image_ids})  # fmt: skip

    def _predict(self, members: list[LoopMember]) -> list[torch.Tensor]:
        inputs = torch.cat([torch.cat([m.latents] * 2) if m.cfg else m.latents for m in members])
        timestep = torch.cat([m.timestep.expand(m.rows).to(inputs.dtype) for m in members])
        texts, mask = _cat_rows(members, "encoder_hidden_states"), _cat_rows(members, "attention_mask")
        ids = members[0].shared["txt_ids"], members[0].shared["img_ids"]
        if any(isinstance(m.cache, RowCache) for m in members):  # First-Block Cache, per row (issue 50)
            out = chroma_rows(self.pipe.transformer, members, inputs, timestep, texts, *ids, mask)
        else:
            out = self.pipe.transformer(
                hidden_states=inputs,
                timestep=timestep / 1000,
                encoder_hidden_states=texts,
                txt_ids=ids[0],
                img_ids=ids[1],
                attention_mask=mask,
                joint_attention_kwargs={},
                return_dict=False,
            )[0]
        return [m.guided(chunk) for m, chunk in zip(members, out.split([m.rows for m in members]))]

    def _pixels(self, latents: torch.Tensor, job: InferenceJob) -> list[Image.Image]:
        pipe = self.pipe
        return super()._pixels(pipe._unpack_latents(latents, job.height, job.width, pipe.vae_scale_factor), job)


@dataclass
class ZImageMember(LoopMember):
    """A Z-Image member: its prompt embeddings are a list (one tensor per prompt, each its own length)."""

    embeds: list[torch.Tensor] = field(default_factory=list)
    negative: list[torch.Tensor] = field(default_factory=list)
    t_norms: list[float] | None = None  # CFG is off at a step whose t-norm passes cfg_truncation
    truncation: float = 1.0
    normalization: float = 0.0

    def scale_now(self) -> float:
        if self.t_norms is not None and self.t_norms[self.done] > self.truncation:
            return 0.0
        return self.job.guidance_scale


class ZImageLoop(_FlowLoop):
    """``joining.Loop`` for ``ZImagePipeline`` (see the module docstring)."""

    def _enter(self, job: InferenceJob) -> LoopMember:
        pipe, device = self.pipe, self.device
        signature = inspect.signature(pipe.__call__).parameters
        cfg = job.guidance_scale > 0
        embeds, negative = pipe.encode_prompt(
            prompt=list(job.prompts),  # encode_prompt templates the list in place: a fresh one
            negative_prompt=_negatives(self, job),
            do_classifier_free_guidance=cfg,
            device=device,
            max_sequence_length=call_default(pipe, "max_sequence_length", 512),
        )
        latents = pipe.prepare_latents(
            job.num_images,
            pipe.transformer.in_channels,
            job.height,
            job.width,
            torch.float32,
            device,
            generators_of(job),
            None,
        )
        sampler = samplers.build(self.model.base_sampler, job.sampler)
        tokens = (latents.shape[2] // 2) * (latents.shape[3] // 2)
        mu = _shift(sampler.config, tokens, z_shift)
        sigmas = get_default_z_image_sigmas(job.num_inference_steps)
        timesteps, _ = retrieve_timesteps(sampler, job.num_inference_steps, device, sigmas=sigmas, mu=mu)
        sampler.set_begin_index(0)
        truncation = float(signature["cfg_truncation"].default)
        normalization = float(signature["cfg_normalization"].default or 0.0)
        t_norms = ((1000 - timesteps.float()) / 1000).tolist() if cfg and truncation <= 1 else None
        return ZImageMember(job=job, sampler=sampler, timesteps=timesteps, latents=latents, cfg=cfg, rows_of={},
                       embeds=list(embeds), negative=list(negative) if cfg else [], t_norms=t_norms,
                       truncation=truncation, normalization=normalization)  # fmt: skip

    def _predict(self, members: list[LoopMember]) -> list[torch.Tensor]:
        transformer = self.pipe.transformer
        latents: list[torch.Tensor] = []
        embeds: list[torch.Tensor] = []
        timesteps: list[torch.Tensor] = []
        scales: list[float] = []
        for m in members:
            assert isinstance(m, ZImageMember)
            scale = m.scale_now()
            scales.append(scale)
            t = ((1000 - m.timestep.expand(m.images)) / 1000).to(torch.float32)
            frames = m.latents.to(transformer.dtype).unsqueeze(2)
            if m.cfg and scale > 0:
                latents += [*frames.unbind(0), *frames.unbind(0)]
                embeds += [*m.embeds, *m.negative]
                timesteps += [t, t]
            else:
                latents += list(frames.unbind(0))
                embeds += list(m.embeds)
                timesteps.append(t)
        counts = [m.images * (2 if m.cfg and scale > 0 else 1) for m, scale in zip(members, scales)]
        if any(isinstance(m.cache, RowCache) for m in members):  # First-Block Cache, per row (issue 50)
            out = z_image_rows(transformer, members, counts, latents, torch.cat(timesteps), embeds)
        else:
            out = transformer(latents, torch.cat(timesteps), embeds, joint_attention_kwargs=None, return_dict=False)[0]
        predictions: list[torch.Tensor] = []
        start = 0
        for m, scale in zip(members, scales):
            assert isinstance(m, ZImageMember)
            n = m.images
            if m.cfg and scale > 0:
                pos, neg = out[start : start + n], out[start + n : start + 2 * n]
                start += 2 * n
                rows: list[torch.Tensor] = [self._guided(p.float(), q.float(), scale, m.normalization)
                                            for p, q in zip(pos, neg)]  # fmt: skip
            else:
                rows = [o.float() for o in out[start : start + n]]
                start += n
            predictions.append(-torch.stack(rows).squeeze(2).to(torch.float32))
        return predictions

    @staticmethod
    def _guided(pos: torch.Tensor, neg: torch.Tensor, scale: float, normalization: float) -> torch.Tensor:
        """The pipeline's CFG on one image, with its renormalisation when ``cfg_normalization`` is set."""
        pred = pos + scale * (pos - neg)
        if normalization > 0.0:
            ceiling = torch.linalg.vector_norm(pos) * normalization
            norm = torch.linalg.vector_norm(pred)
            if norm > ceiling:
                pred = pred * (ceiling / norm)
        return pred

    def _pixels(self, latents: torch.Tensor, job: InferenceJob) -> list[Image.Image]:
        return super()._pixels(latents.to(self.pipe.vae.dtype), job)


def z_image_rows(
    transformer: Any,
    members: list[LoopMember],
    counts: list[int],
    latents: list[torch.Tensor],
    timestep: torch.Tensor,
    texts: list[torch.Tensor],
) -> list[torch.Tensor]:
    """diffusers 0.42's Z-Image transformer forward (its basic mode: no ControlNet, SigLIP or omni
    inputs, patch 2x1), with First-Block Cache per row as ``flux_rows``: the first main layer on every
    row, the remaining layers on the rows that miss with their masks, rotary tables and modulation.
    A row's residuals are its image tokens' (they come first, the same count for every row of a loop;
    the caption tokens after them are each row's own length, padded to the call's longest), so a row
    decides from its own picture whoever shares the call (``counts``: each member's rows now)."""
    t, key = transformer, "2-1"
    device = latents[0].device
    adaln = t.t_embedder(timestep * t.t_scale).type_as(latents[0])
    x, caps, sizes, x_ids, cap_ids, x_pad, cap_pad = t.patchify_and_embed(latents, texts, 2, 1)
    x_lengths = [len(xi) for xi in x]
    x = t.all_x_embedder[key](torch.cat(x, dim=0))
    x, x_freqs, x_mask, _, _ = t._prepare_sequence(list(x.split(x_lengths)), x_ids, x_pad, t.x_pad_token, None, device)
    for layer in t.noise_refiner:
        x = layer(x, x_mask, x_freqs, adaln, None, None, None)
    cap_lengths = [len(c) for c in caps]
    cap = t.cap_embedder(torch.cat(caps, dim=0))
    cap, cap_freqs, cap_mask, _, _ = t._prepare_sequence(
        list(cap.split(cap_lengths)), cap_ids, cap_pad, t.cap_pad_token, None, device
    )
    for layer in t.context_refiner:
        cap = layer(cap, cap_mask, cap_freqs)
    unified, freqs, mask, _ = t._build_unified_sequence(
        x, x_freqs, x_lengths, None, cap, cap_freqs, cap_lengths, None, None, None, None, None, False, device
    )
    layers, image = t.layers, x_lengths[0]
    first_out = layers[0](unified, mask, freqs, adaln, None, None, None)
    first = (first_out - unified)[:, :image]
    hits = row_hits(members, first, counts)
    out = first_out.clone()
    miss = (~hits).nonzero().squeeze(1)
    if miss.numel():
        h, f, c = first_out.index_select(0, miss), freqs.index_select(0, miss), adaln.index_select(0, miss)
        m = mask.index_select(0, miss) if mask is not None else None
        for layer in layers[1:]:
            h = layer(h, m, f, c, None, None, None)
        out.index_copy_(0, miss, h)
    rows_kept(members, hits, first, first_out[:, :image], out[:, :image], counts)  # writes into ``out``
    out = t.all_final_layer[key](out, c=adaln)
    return list(t.unpatchify(list(out.unbind(dim=0)), sizes, 2, 1, None))
