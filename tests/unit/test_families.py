"""Every model family's tiny random-weight pipeline loads through ``from_pretrained`` with the real structure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.families import FAMILIES, FamilySpec, build_pipeline, built_family

PROMPT = "a red circle on a blue background"


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest) -> tuple[FamilySpec, Path, Any]:
    """(spec, folder, pipeline loaded from the folder): built and loaded once per family."""
    from diffusers import DiffusionPipeline

    spec = FAMILIES[request.param]
    path = built_family(spec.name)
    pipe = DiffusionPipeline.from_pretrained(path)
    pipe.set_progress_bar_config(disable=True)
    return spec, path, pipe


def _denoiser(pipe: Any) -> Any:
    return getattr(pipe, "unet", None) or pipe.transformer


def test_the_folder_loads_into_the_family_pipeline(family: tuple[FamilySpec, Path, Any]) -> None:
    spec, path, pipe = family
    assert type(pipe).__name__ == spec.pipeline_class
    assert json.loads((path / "model_index.json").read_text())["_class_name"] == spec.pipeline_class
    weights = [p.name for p in path.rglob("*") if p.suffix in (".safetensors", ".bin", ".pt", ".ckpt")]
    assert weights and all(name.endswith(".safetensors") for name in weights), weights


def test_structure_is_the_real_models(family: tuple[FamilySpec, Path, Any]) -> None:
    """VAE factor, default size, latent channels, patch size and scheduler as the real model has them."""
    spec, _, pipe = family
    denoiser = _denoiser(pipe)
    assert pipe.vae_scale_factor == spec.vae_scale_factor
    # How the app derives the default size (pipeline.engine.model.loading.build_profile).
    sample = getattr(pipe, "default_sample_size", None) or denoiser.config.sample_size
    assert sample * pipe.vae_scale_factor == spec.default_size
    assert pipe.vae.config.latent_channels == spec.latent_channels
    packed = 4 if spec.pipeline_class == "FluxPipeline" else 1  # FLUX packs 2x2 latent patches
    assert denoiser.config.in_channels == spec.latent_channels * packed
    patch = getattr(denoiser.config, "patch_size", None) or 1
    assert spec.size_multiple == spec.vae_scale_factor * (2 if packed == 4 else patch)
    assert type(pipe.scheduler).__name__ == spec.scheduler_class
    config = pipe.scheduler.config
    if spec.prediction_type == "flow":
        assert "FlowMatch" in spec.scheduler_class or config.prediction_type == "flow_prediction"
    else:
        assert config.prediction_type == spec.prediction_type
    if spec.name == "sdxl":
        assert pipe.config.force_zeros_for_empty_prompt is True
        assert denoiser.config.addition_embed_type == "text_time"
        assert denoiser.config.cross_attention_dim == (
            pipe.text_encoder.config.hidden_size + pipe.text_encoder_2.config.hidden_size
        )
        assert denoiser.config.projection_class_embeddings_input_dim == (
            6 * denoiser.config.addition_time_embed_dim + pipe.text_encoder_2.config.projection_dim
        )
    if spec.name == "sd3":
        assert config.shift == 3.0
    if spec.name.startswith("flux"):
        dev = spec.name == "flux-dev"
        assert denoiser.config.guidance_embeds is dev
        assert config.use_dynamic_shifting is dev and config.shift == (3.0 if dev else 1.0)


def test_a_two_step_64px_generation_returns_a_64px_rgb_picture(family: tuple[FamilySpec, Path, Any]) -> None:
    spec, _, pipe = family
    assert 64 % spec.size_multiple == 0
    images = pipe(
        PROMPT,
        height=64,
        width=64,
        num_inference_steps=2,
        output_type="pil",
        generator=torch.Generator("cpu").manual_seed(0),
    ).images
    assert len(images) == 1
    assert images[0].size == (64, 64) and images[0].mode == "RGB"


def test_tokenizers_reload_and_the_build_is_seeded(family: tuple[FamilySpec, Path, Any]) -> None:
    """The saved tokenizers tokenize as the built ones do; building again gives the same weights."""
    spec, _, pipe = family
    fresh = build_pipeline(spec.name)
    for slot, max_length in spec.tokenizers.items():
        loaded, made = getattr(pipe, slot), getattr(fresh, slot)
        assert type(loaded) is type(made), slot
        assert loaded.model_max_length == max_length, slot
        assert (loaded.pad_token, loaded.pad_token_id) == (made.pad_token, made.pad_token_id), slot
        ids = loaded(PROMPT).input_ids
        assert ids == made(PROMPT).input_ids, slot
        # Every word is known (CLIP's unknown token is its end token, so the ends are left out).
        assert loaded.unk_token_id not in ids[1:-1], (slot, loaded.convert_ids_to_tokens(ids))
        encoder = getattr(pipe, slot.replace("tokenizer", "text_encoder"))
        assert len(loaded) <= encoder.config.vocab_size, slot
    for t5 in (getattr(pipe, slot) for slot in spec.tokenizers if spec.tokenizers[slot] == 512):
        assert (t5.pad_token, t5.pad_token_id, t5.eos_token, t5.unk_token) == ("<pad>", 0, "</s>", "<unk>")
        assert t5(PROMPT).input_ids[-1] == t5.eos_token_id
    name, weight = next(iter(_denoiser(fresh).state_dict().items()))
    assert torch.equal(_denoiser(pipe).state_dict()[name], weight)


def test_every_offered_sampler_runs_with_progress_and_previews(family: tuple[FamilySpec, Path, Any]) -> None:
    """Each sampler the app offers for the family (``engine/model/samplers.py``) runs through the app's own model
    class: a step report at every step, a denoised estimate for the preview, the pipeline's scheduler untouched.
    Flow-matching families offer only their own scheduler; the UNet families and PixArt all five."""
    import threading

    from pipeline.engine.model.diffusers_model import DiffusersModel
    from pipeline.engine.model.loading import build_profile
    from pipeline.engine.model.previews import PreviewMap
    from pipeline.protocol import InferenceJob

    spec, _, pipe = family
    profile = build_profile(pipe, spec.name, "cpu", torch.float32)
    flow = spec.prediction_type == "flow"
    assert profile.samplers == (
        ("default",) if flow else ("default", "Euler", "Euler a", "DPM++ 2M Karras", "DDIM", "UniPC")
    )
    channels = pipe.vae.config.latent_channels
    model = DiffusersModel(pipe, profile, PreviewMap([(torch.zeros(3, channels), torch.full((3,), 0.5))]))
    base, base_config = pipe.scheduler, dict(pipe.scheduler.config)
    # PixArt-alpha runs PixArt-Sigma's code path (and binning draws it at 1024 px): its own scheduler only.
    for name in profile.samplers if spec.name != "pixart-alpha" else ("default",):
        job = InferenceJob("s", (PROMPT,), ("",), (0,), 64, 64, 2, 4.0, preview_every=1, sampler=name)
        seen: list[tuple[int, int, bool]] = []
        result = model.generate(job, threading.Event(), lambda k, n, shown: seen.append((k, n, 0 in shown)))
        total = seen[-1][1]  # 2; PNDM (SD 1.5's own) runs one more scheduler step than it was asked for
        assert total == 2 or (name, spec.name) == ("default", "sd1"), (name, seen)
        # A report at every step, and a preview (the denoised estimate) on every step but the last.
        assert seen == [(k, total, k < total) for k in range(1, total + 1)], name
        assert result.images[0].size == (64, 64) and result.steps_done == total, name
        assert pipe.scheduler is base and dict(base.config) == base_config, name
