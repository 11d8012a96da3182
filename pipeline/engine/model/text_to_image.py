"""Load ``--model`` as a text-to-image pipeline, or refuse it at start with what it holds.

A folder's ``model_index.json`` names its pipeline class (a ``modular_model_index.json`` alone: a
``ModularPipeline``, ``modular``). A text-to-image class diffusers'
``AutoPipelineForText2Image`` knows is loaded through it; one the family registry knows but the
auto mapping does not (HiDream, HunyuanImage, Kandinsky 5, Sana Sprint, LongCat, ERNIE) through
``DiffusionPipeline``; an image-to-image, inpainting, video or audio pipeline is refused with a
message naming it; and an unknown class is served generically when its ``__call__`` takes a prompt,
a size and a step count (``families.traits`` logs what it guessed), else refused.
"""

from __future__ import annotations

import inspect
import json
import logging
import re
from pathlib import Path
from typing import Any

from ...errors import ModelRefused
from .family_table import family_for
from .modular import load_modular, modular_class

log = logging.getLogger(__name__)

_NOT_TEXT_TO_IMAGE = (
    (re.compile(r"Img2Img|Image2Image|I2I|Edit|Refiner|Upscale|Variation|Kontext"), "an image-to-image pipeline"),
    (re.compile(r"Inpaint"), "an inpainting pipeline"),
    (re.compile(r"Video|T2V|I2V|V2V|Wan|Mochi|LTX|Hunyuan(?!Image|DiT)|Cog(?!View)|Allegro|Latte"), "a video pipeline"),
    (re.compile(r"Audio|Music|Speech|TTS"), "an audio pipeline"),
    (re.compile(r"ControlNet|Control|Adapter|Prior|Decoder|Layered"), "a pipeline that needs more than a prompt"),
)
_REQUIRED = ("prompt", "num_inference_steps")


def _auto_mappings() -> tuple[set[str], dict[str, str]]:
    """The text-to-image classes diffusers' auto pipeline knows, and the other tasks' classes (name -> task)."""
    from diffusers.pipelines import auto_pipeline as auto

    t2i = {cls.__name__ for cls in auto.AUTO_TEXT2IMAGE_PIPELINES_MAPPING.values()}
    others: dict[str, str] = {}
    for attr, what in (
        ("AUTO_IMAGE2IMAGE_PIPELINES_MAPPING", "an image-to-image pipeline"),
        ("AUTO_INPAINT_PIPELINES_MAPPING", "an inpainting pipeline"),
        ("AUTO_TEXT2VIDEO_PIPELINES_MAPPING", "a video pipeline"),
        ("AUTO_IMAGE2VIDEO_PIPELINES_MAPPING", "a video pipeline"),
        ("AUTO_VIDEO2VIDEO_PIPELINES_MAPPING", "a video pipeline"),
        ("AUTO_TEXT2AUDIO_PIPELINES_MAPPING", "an audio pipeline"),
    ):
        for cls in getattr(auto, attr, {}).values():
            others.setdefault(cls.__name__, what)
    return t2i, others


def what_it_holds(pipeline_class: str) -> str | None:
    """Why a class is not text-to-image (``"an inpainting pipeline"``), or None when it may be."""
    if family_for(pipeline_class) is not None:
        return None
    t2i, others = _auto_mappings()
    if pipeline_class in t2i:
        return None
    if pipeline_class in others:
        return others[pipeline_class]
    return next((what for pattern, what in _NOT_TEXT_TO_IMAGE if pattern.search(pipeline_class)), None)


def refuse_unless_callable(pipe: Any, source: str) -> None:
    """An unknown class must take a prompt, a size and a step count the generic way."""
    params = inspect.signature(pipe.__call__).parameters
    missing = [p for p in (*_REQUIRED, "height", "width") if p not in params]
    if missing:
        raise ModelRefused(
            f"{source} holds {type(pipe).__name__}, whose __call__ takes no {', '.join(missing)}: "
            "it cannot be served as text-to-image from a prompt"
        )


def plain_tokenizers(index: Path) -> dict[str, str]:
    """The components a ``model_index.json`` loads as a multimodal processor (``PixtralProcessor``,
    ``Qwen2VLProcessor``): their folders hold a plain tokenizer too, which these pipelines accept."""
    entries = json.loads(index.read_text())
    return {
        name: str(value[1])
        for name, value in entries.items()
        if isinstance(value, list) and len(value) == 2 and str(value[1]).endswith("Processor")
    }


def _load_with_plain_tokenizers(loader: Any, source: Path, plain: dict[str, str], dtype: Any) -> Any:
    """Load ``source`` through an overlay folder (links to its parts) whose index names the plain
    tokenizer class where the original names a processor; the user's folder is not touched."""
    import shutil
    import tempfile

    overlay = Path(tempfile.mkdtemp(prefix="t2i-overlay-"))
    try:
        for part in source.iterdir():
            if part.name != "model_index.json":
                (overlay / part.name).symlink_to(part.resolve())
        index = json.loads((source / "model_index.json").read_text())
        from transformers import AutoTokenizer

        for name in plain:  # the class AutoTokenizer picks for the processor's own tokenizer files
            index[name] = ["transformers", type(AutoTokenizer.from_pretrained(str(source / name))).__name__]
        (overlay / "model_index.json").write_text(json.dumps(index))
        return loader.from_pretrained(str(overlay), dtype=dtype)
    finally:
        shutil.rmtree(overlay, ignore_errors=True)  # the weights are loaded (or mapped) by now


def _torchvision_note() -> str:
    """ "torchvision" when it cannot be imported (a processor's failure does not always name it)."""
    try:
        import torchvision  # type: ignore[import-not-found]  # noqa: F401
    except Exception:
        return "torchvision"
    return ""


def load_text_to_image(source: str, dtype: Any) -> Any:
    """``source`` (a folder or hub id) loaded through ``from_pretrained``, or ``ModelRefused``."""
    from diffusers import AutoPipelineForText2Image, DiffusionPipeline

    if (modular := modular_class(source)) is not None:  # a ModularPipeline folder (issue 52 §5)
        if (what := what_it_holds(modular.replace("ModularPipeline", "Pipeline"))) is not None:
            raise ModelRefused(f"{source} holds {what} ({modular}); --model needs a text-to-image pipeline")
        pipe = load_modular(source, dtype)
        refuse_unless_callable(pipe, source)
        return pipe
    index = Path(source) / "model_index.json"
    cls = ""
    if index.exists():
        cls = str(json.loads(index.read_text()).get("_class_name", ""))
    elif Path(source).exists():
        raise ModelRefused(f"{source} has no model_index.json: it is not a diffusers pipeline folder")
    if cls and (what := what_it_holds(cls)) is not None:
        raise ModelRefused(f"{source} holds {what} ({cls}); --model needs a text-to-image pipeline")
    t2i, _ = _auto_mappings()
    loader = AutoPipelineForText2Image if cls in t2i else DiffusionPipeline
    try:
        pipe = loader.from_pretrained(source, dtype=dtype)
    except (ImportError, AttributeError, ValueError):  # a processor class is a placeholder without torchvision
        plain = plain_tokenizers(index) if index.exists() else {}
        if not plain or not _torchvision_note():  # torchvision is there: the failure is another one
            raise
        log.warning(
            "%s's %s need torchvision, which is not installed: loading their plain tokenizers instead",
            source,
            " and ".join(f"{name} ({kind})" for name, kind in plain.items()),
        )
        pipe = _load_with_plain_tokenizers(loader, Path(source), plain, dtype)
    if loader is DiffusionPipeline and (what := what_it_holds(type(pipe).__name__)) is not None:  # a hub id's class
        raise ModelRefused(f"{source} holds {what} ({type(pipe).__name__}); --model needs a text-to-image pipeline")
    if family_for(type(pipe).__name__) is None:
        refuse_unless_callable(pipe, source)
    return pipe
