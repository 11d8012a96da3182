"""Defaults, limits and dtype follow the model's configuration, not its name (engine/model/families.py)."""

from __future__ import annotations

from typing import Any

import pytest
from diffusers import (
    DDIMScheduler,
    DPMSolverMultistepScheduler,
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    LCMScheduler,
    PNDMScheduler,
)

from pipeline.engine.model.families import call_arguments, family_of, pick_dtype_name, pipeline_class_of, traits


def fake_pipe(
    cls: str,
    scheduler: Any,
    *,
    steps: int = 50,
    guidance: float = 7.5,
    negative: bool = True,
    guidance_embeds: bool | None = None,
    patch_size: int | None = None,
    vae_scale: int = 8,
) -> Any:
    """An object shaped like a diffusers pipeline: its class name, ``__call__`` defaults and configs."""
    config = type("Config", (), {"sample_size": 64, "guidance_embeds": guidance_embeds, "patch_size": patch_size})

    if negative:

        def call(
            self: Any,
            prompt: Any = None,
            negative_prompt: Any = None,
            num_inference_steps: int = steps,
            guidance_scale: float = guidance,
        ) -> None: ...
    else:

        def call(
            self: Any,
            prompt: Any = None,
            num_inference_steps: int = steps,
            guidance_scale: float = guidance,
        ) -> None: ...

    denoiser = "transformer" if patch_size or guidance_embeds is not None else "unet"
    return type(
        cls,
        (),
        {
            "__call__": call,
            "scheduler": scheduler,
            "vae_scale_factor": vae_scale,
            denoiser: type("D", (), {"config": config})(),
        },
    )()


@pytest.mark.parametrize(
    ("case", "pipe", "name", "expected"),
    [
        ("SD 1.5", lambda: fake_pipe("StableDiffusionPipeline", EulerDiscreteScheduler()), "x", (50, 7.5, False, 8)),
        (
            "SDXL",
            lambda: fake_pipe("StableDiffusionXLPipeline", EulerDiscreteScheduler(), guidance=5.0),
            "x",
            (50, 5.0, False, 8),
        ),
        (
            "SD-Turbo by config",
            lambda: fake_pipe("StableDiffusionPipeline", EulerDiscreteScheduler(timestep_spacing="trailing")),
            "my-weights",
            (4, 0.0, True, 8),
        ),
        (
            "SD-Turbo by config, named",
            lambda: fake_pipe("StableDiffusionPipeline", EulerDiscreteScheduler(timestep_spacing="trailing")),
            "stabilityai/sd-turbo",
            (1, 0.0, True, 8),
        ),
        (
            "zero-SNR, trailing",
            lambda: fake_pipe(
                "StableDiffusionPipeline",
                EulerDiscreteScheduler(
                    timestep_spacing="trailing", rescale_betas_zero_snr=True, prediction_type="v_prediction"
                ),
            ),
            "x",
            (50, 7.5, False, 8),
        ),
        (
            "a turbo name on a plain schedule",
            lambda: fake_pipe("StableDiffusionPipeline", DDIMScheduler()),
            "someone/sd-turbo-lookalike",
            (50, 7.5, False, 8),
        ),
        ("LCM", lambda: fake_pipe("StableDiffusionPipeline", LCMScheduler()), "x", (4, 0.0, True, 8)),
        (
            "FLUX schnell saved as flux-dev",
            lambda: fake_pipe(
                "FluxPipeline",
                FlowMatchEulerDiscreteScheduler(),
                steps=28,
                guidance=3.5,
                negative=False,
                guidance_embeds=False,
                patch_size=1,
            ),
            "flux-dev",
            (4, 0.0, True, 16),
        ),
        (
            "FLUX dev",
            lambda: fake_pipe(
                "FluxPipeline",
                FlowMatchEulerDiscreteScheduler(),
                steps=28,
                guidance=3.5,
                negative=False,
                guidance_embeds=True,
                patch_size=1,
            ),
            "x",
            (28, 3.5, False, 16),
        ),
        (
            "SD3",
            lambda: fake_pipe(
                "StableDiffusion3Pipeline",
                FlowMatchEulerDiscreteScheduler(shift=3.0),
                steps=28,
                guidance=7.0,
                patch_size=2,
            ),
            "x",
            (28, 7.0, False, 16),
        ),
    ],
)
def test_defaults_and_size_step_come_from_the_configuration(
    case: str, pipe: Any, name: str, expected: tuple[int, float, bool, int]
) -> None:
    t = traits(pipe(), name)
    assert (t.default_steps, t.default_guidance, t.distilled, t.size_multiple) == expected, case


UNET_SAMPLERS = ("default", "Euler", "Euler a", "DPM++ 2M Karras", "DDIM", "UniPC")


@pytest.mark.parametrize(
    ("case", "pipe", "expected"),
    [
        ("SD 1.5 (PNDM)", lambda: fake_pipe("StableDiffusionPipeline", PNDMScheduler()), UNET_SAMPLERS),
        ("SDXL (Euler)", lambda: fake_pipe("StableDiffusionXLPipeline", EulerDiscreteScheduler()), UNET_SAMPLERS),
        (
            "PixArt (DPM-Solver)",
            lambda: fake_pipe("PixArtSigmaPipeline", DPMSolverMultistepScheduler(), patch_size=2),
            UNET_SAMPLERS,
        ),
        ("LCM keeps its own", lambda: fake_pipe("StableDiffusionPipeline", LCMScheduler()), ("default",)),
        (
            "SD3",
            lambda: fake_pipe("StableDiffusion3Pipeline", FlowMatchEulerDiscreteScheduler(shift=3.0), patch_size=2),
            ("default",),
        ),
        (
            "FLUX",
            lambda: fake_pipe(
                "FluxPipeline", FlowMatchEulerDiscreteScheduler(), negative=False, guidance_embeds=True, patch_size=1
            ),
            ("default",),
        ),
        (
            "Sana (flow DPM-Solver)",
            lambda: fake_pipe(
                "SanaPipeline",
                DPMSolverMultistepScheduler(use_flow_sigmas=True, prediction_type="flow_prediction"),
                patch_size=1,
            ),
            ("default",),
        ),
        (
            "a flow scheduler in an SD-named pipeline",
            lambda: fake_pipe("StableDiffusionPipeline", FlowMatchEulerDiscreteScheduler()),
            ("default",),
        ),
    ],
)
def test_samplers_are_offered_where_the_family_supports_them(case: str, pipe: Any, expected: tuple[str, ...]) -> None:
    """UNet families and PixArt: A1111's five; flow matching and consistency models: their own only."""
    assert traits(pipe(), "x").samplers == expected, case


def test_flux_offers_no_negative_prompt_and_sdxl_sends_none_for_an_empty_one() -> None:
    flux = traits(
        fake_pipe("FluxPipeline", FlowMatchEulerDiscreteScheduler(), negative=True, guidance_embeds=True, patch_size=1),
        "x",
    )
    assert not flux.negative_prompt  # FluxPipeline reads it only with true_cfg_scale > 1
    assert call_arguments("flux", ("blurry",), False) == {}
    assert call_arguments("sdxl", ("", ""), True) == {"negative_prompt": None}  # force_zeros_for_empty_prompt
    assert call_arguments("sdxl", ("", "blurry"), True) == {"negative_prompt": ["", "blurry"]}
    assert call_arguments("sd", ("",), True) == {"negative_prompt": [""]}


@pytest.mark.parametrize(
    ("source", "device", "expected"),
    [
        ("black-forest-labs/FLUX.1-dev", "cuda", "bfloat16"),
        ("stabilityai/stable-diffusion-3-medium-diffusers", "cuda", "bfloat16"),
        ("Efficient-Large-Model/Sana_600M_512px_diffusers", "cuda", "bfloat16"),
        ("PixArt-alpha/PixArt-Sigma-XL-2-1024-MS", "cuda", "float16"),
        ("stabilityai/stable-diffusion-xl-base-1.0", "cuda", "float16"),
        ("runwayml/stable-diffusion-v1-5", "cuda", "float16"),
        ("black-forest-labs/FLUX.1-dev", "cpu", "float32"),
    ],
)
def test_dtype_auto_by_family_for_hub_ids(source: str, device: str, expected: str) -> None:
    assert pick_dtype_name("auto", device, pipeline_class_of(source)) == expected
    assert pick_dtype_name("float16", device, pipeline_class_of(source)) == "float16"  # the user's choice wins


def test_dtype_auto_reads_a_folders_model_index(tmp_path: Any) -> None:
    folder = tmp_path / "renamed-weights"
    folder.mkdir()
    (folder / "model_index.json").write_text('{"_class_name": "FluxPipeline"}')
    assert pipeline_class_of(str(folder)) == "FluxPipeline" and family_of("FluxPipeline") == "flux"
    assert pick_dtype_name("auto", "cuda", pipeline_class_of(str(folder))) == "bfloat16"


def test_a_failed_warm_up_is_logged_and_the_model_still_serves(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import threading

    from pipeline.config import Settings
    from pipeline.engine.model import loading
    from pipeline.engine.model.diffusers_model import DiffusersModel
    from pipeline.protocol import InferenceJob
    from tests.families import built_family

    original = DiffusersModel.generate
    warmups: list[InferenceJob] = []

    def fails_at_warm_up(self: DiffusersModel, job: InferenceJob, stop: Any, on_step: Any) -> Any:
        if job.request_id == "warmup":
            warmups.append(job)
            raise RuntimeError("no kernel for this shape")
        return original(self, job, stop, on_step)

    monkeypatch.setattr(DiffusersModel, "generate", fails_at_warm_up)
    model = loading.load_model(Settings(model=str(built_family("pixart-alpha"))))
    assert warmups and warmups[0].num_inference_steps == model.profile.min_steps == 2  # a valid count for PixArt
    assert any("warm-up step failed" in r.getMessage() for r in caplog.records)
    job = InferenceJob("after", ("a red circle",), ("",), (1,), 64, 64, 2, 4.5)
    assert model.generate(job, threading.Event(), lambda *_: None).images[0].size == (64, 64)
