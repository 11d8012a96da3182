"""``--model`` is loaded as text-to-image or refused at start with what it holds (engine/model/text_to_image.py),
and a class the family registry does not know is served generically (engine/model/families.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from pipeline.config import Settings
from pipeline.engine.model.text_to_image import what_it_holds
from pipeline.errors import ModelRefused


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        ("StableDiffusionImg2ImgPipeline", "an image-to-image pipeline"),
        ("QwenImageEditPipeline", "an image-to-image pipeline"),
        ("StableDiffusionXLInpaintPipeline", "an inpainting pipeline"),
        ("ChromaInpaintPipeline", "an inpainting pipeline"),
        ("WanPipeline", "a video pipeline"),
        ("Kandinsky5T2VPipeline", "a video pipeline"),
        ("HunyuanImagePipeline", None),  # text-to-image, in the registry, not in diffusers' auto mapping
        ("Flux2KleinPipeline", None),  # in both of diffusers' text-to-image and image-to-image mappings
        ("AuraFlowPipeline", None),  # text-to-image by diffusers' auto mapping, served generically
    ],
)
def test_what_a_folder_holds_is_named(cls: str, expected: str | None) -> None:
    assert what_it_holds(cls) == expected


def test_an_image_to_image_folder_is_refused_at_start_naming_what_it_holds(tmp_path: Path) -> None:
    from pipeline.engine.model.loading import load_model

    folder = tmp_path / "sd-img2img"
    folder.mkdir()
    (folder / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionImg2ImgPipeline"}))
    with pytest.raises(ModelRefused, match=r"holds an image-to-image pipeline \(StableDiffusionImg2ImgPipeline\)"):
        load_model(Settings(model=str(folder)))
    with pytest.raises(ModelRefused, match="no model_index.json"):
        load_model(Settings(model=str(tmp_path)))


def test_a_class_the_registry_does_not_know_is_served_generically_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """StableDiffusionPAGPipeline: SD's components, a class with no registry entry."""
    import threading

    from diffusers import StableDiffusionPAGPipeline

    from pipeline.engine.model.loading import load_model
    from pipeline.protocol import InferenceJob
    from tests.families import build_pipeline

    components = build_pipeline("sd1").components
    StableDiffusionPAGPipeline(**components, requires_safety_checker=False).save_pretrained(tmp_path / "pag")
    caplog.set_level(logging.INFO)
    model = load_model(Settings(model=str(tmp_path / "pag")))
    p = model.profile
    assert (p.pipeline_class, p.family, p.size_multiple, p.guidance_arg) == (
        "StableDiffusionPAGPipeline",
        "other",
        8,
        "guidance_scale",
    )
    assert any("not in the family registry" in r.getMessage() and "guessed" in r.getMessage() for r in caplog.records)
    job = InferenceJob("one", ("a red circle",), ("",), (1,), 64, 64, 2, p.default_guidance)
    assert model.generate(job, threading.Event(), lambda *_: None).images[0].size == (64, 64)


def test_a_folder_whose_tokenizer_is_a_processor_loads_without_torchvision(tmp_path: Path) -> None:
    """FLUX.2-dev's model_index names a ``PixtralProcessor`` for its tokenizer, which needs torchvision
    (not loadable beside the pinned CPU torch here): the folder's plain tokenizer is loaded instead."""
    import importlib.util
    import shutil

    from pipeline.engine.model.text_to_image import load_text_to_image, plain_tokenizers
    from tests.families import built_family

    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed: the processor itself loads")
    folder = tmp_path / "flux2-dev"
    shutil.copytree(built_family("flux2-dev"), folder)
    index = json.loads((folder / "model_index.json").read_text())
    index["tokenizer"] = ["transformers", "PixtralProcessor"]  # what the real folder says
    (folder / "model_index.json").write_text(json.dumps(index))
    assert plain_tokenizers(folder / "model_index.json") == {"tokenizer": "PixtralProcessor"}
    pipe = load_text_to_image(str(folder), None)
    assert type(pipe).__name__ == "Flux2Pipeline" and not type(pipe.tokenizer).__name__.endswith("Processor")
    import torch

    pipe.set_progress_bar_config(disable=True)
    with torch.inference_mode():
        image = pipe(
            prompt=["a red circle"],
            width=64,
            height=64,
            num_inference_steps=1,
            generator=[torch.Generator().manual_seed(0)],
        ).images[0]
    assert image.size == (64, 64)
    assert json.loads((folder / "model_index.json").read_text())["tokenizer"][1] == "PixtralProcessor"  # untouched
