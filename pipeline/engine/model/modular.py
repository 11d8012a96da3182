"""``--model`` a diffusers ``ModularPipeline`` (issue 52 §5): a folder or hub id whose index is a
``modular_model_index.json`` (diffusers 0.42.1 ships FLUX.3, Qwen-Image 2.1, Krea 2 and others only as
modular pipelines), loaded with ``ModularPipeline.from_pretrained`` and ``load_components``.

Where diffusers has the family's classic pipeline (``FluxModularPipeline``: ``FluxPipeline``), that
pipeline is made over the loaded components (``classic_of``: no new memory, the same pixels) and the
family is served as it always is: its step-level loops, LoRAs, ControlNets. Otherwise (FLUX.3, modular
only) the loaded pipeline is served through the same profile the generic way (``families.traits``,
which reads its ``__call__``): ``ModularText2Image`` shows it as a text-to-image pipeline, its
components as its attributes and a ``__call__`` whose parameters are the inputs its blocks take (the
prompt, the size, the steps, the guidance, the generators, ...), calling the blocks with
``output="images"``: whole calls, job-level batching (its blocks are not the classic pipeline's
methods the step-level loops call); progress, stop and previews come from its scheduler's steps, as
for every pipeline (``stepping.StepWatch``).
"""

from __future__ import annotations

import inspect
import json
import logging
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

log = logging.getLogger(__name__)

MODULAR_INDEX = "modular_model_index.json"
# The blocks' inputs a text-to-image call may pass (an image input would make an auto pipeline edit)
_TEXT_INPUTS = ("prompt", "negative_prompt", "prompt_2", "height", "width", "num_inference_steps", "guidance_scale",
                "true_cfg_scale", "generator", "num_images_per_prompt", "max_sequence_length", "sigmas")  # fmt: skip


def modular_class(source: str) -> str | None:
    """The modular pipeline class a ``modular_model_index.json`` names, where ``source`` holds one and no
    ``model_index.json`` (a folder, or a hub id whose repository has only the modular index); None for
    anything else (a hub that cannot be reached: the classic loader says why)."""
    folder = Path(source)
    index: Path | None = folder / MODULAR_INDEX
    if not folder.exists():
        index = _hub_modular_index(source)
    elif not (folder / MODULAR_INDEX).exists() or (folder / "model_index.json").exists():
        index = None
    return None if index is None else str(json.loads(index.read_text()).get("_class_name", "ModularPipeline"))


def _hub_modular_index(source: str) -> Path | None:
    """A hub repository's ``modular_model_index.json``, where it has no ``model_index.json``."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    try:
        hf_hub_download(source, "model_index.json")
        return None  # a classic pipeline's repository
    except EntryNotFoundError:
        pass
    except Exception:  # offline, no such repository, no access: not a modular one we can tell
        return None
    try:
        return Path(hf_hub_download(source, MODULAR_INDEX))
    except Exception:
        return None


class _QuietStops(logging.Filter):
    """A modular pipeline logs any exception from its blocks with its traceback, then raises it: a stop at
    a step (``stepping.StoppedAtStep``, how a cancel ends a call) is no error to log."""

    def filter(self, record: logging.LogRecord) -> bool:
        handled = sys.exc_info()[1]  # the blocks log from their ``except`` clause
        return type(handled).__name__ != "StoppedAtStep" and "StoppedAtStep" not in record.getMessage()


def load_modular(source: str, dtype: Any) -> Any:
    """The modular pipeline at ``source`` with its components loaded in ``dtype``, as ``ModularText2Image``."""
    from diffusers import ModularPipeline

    blocks_log = logging.getLogger("diffusers.modular_pipelines.modular_pipeline")
    if not any(isinstance(f, _QuietStops) for f in blocks_log.filters):
        blocks_log.addFilter(_QuietStops())

    modular = ModularPipeline.from_pretrained(source)
    modular.load_components(dtype=dtype)
    classic = classic_of(modular)
    if classic is not None:
        log.info("%s: %s served as %s over its components (the same weights and pixels; its family's loops)",
                 source, type(modular).__name__, type(classic).__name__)  # fmt: skip
        return classic
    return served(modular)


def classic_of(modular: Any) -> Any:
    """The family's classic pipeline over ``modular``'s loaded components (no new memory), where diffusers
    has one the family registry knows and the components hold every argument it needs (``FluxModularPipeline``:
    ``FluxPipeline``, which draws the same pixels); None otherwise (FLUX.3: modular only)."""
    import diffusers

    from .family_table import family_for

    name = type(modular).__name__.replace("ModularPipeline", "Pipeline")
    cls = getattr(diffusers, name, None)
    if cls is None or family_for(name) is None:
        return None
    components = dict(modular.components)
    wanted = [p for p in inspect.signature(cls.__init__).parameters.values() if p.name != "self"]
    if any(p.default is inspect.Parameter.empty and components.get(p.name) is None for p in wanted):
        return None
    return cls(**{p.name: components[p.name] for p in wanted if components.get(p.name) is not None})


class ModularText2Image:
    """A ``ModularPipeline`` seen as a text-to-image pipeline (see the module docstring)."""

    def __init__(self, modular: Any) -> None:
        object.__setattr__(self, "modular", modular)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.modular, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.modular, name, value)

    @property
    def components(self) -> dict[str, Any]:
        return dict(self.modular.components)

    def set_progress_bar_config(self, **kwargs: Any) -> None:
        """The pipeline's and each denoising loop block's own (the loop blocks draw the bar)."""
        stack = [self.modular, self.modular.blocks]
        while stack:
            item = stack.pop()
            if (setter := getattr(item, "set_progress_bar_config", None)) is not None:
                setter(**kwargs)
            stack.extend(dict(getattr(item, "sub_blocks", None) or {}).values())

    def to(self, *args: Any, **kwargs: Any) -> ModularText2Image:
        self.modular.to(*args, **kwargs)
        return self


def served(modular: Any) -> ModularText2Image:
    """``modular`` wrapped in a class of its own name (``/health`` names the modular class), whose
    ``__call__`` takes the text-to-image inputs its blocks take, with the blocks' defaults."""
    inputs = {i.name: i for i in modular.blocks.inputs}
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for name in _TEXT_INPUTS:
        if name in inputs:
            default = inputs[name].default
            parameters.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default))
    takes = frozenset(p.name for p in parameters[1:])

    def __call__(self: ModularText2Image, **kwargs: Any) -> SimpleNamespace:
        unknown = set(kwargs) - takes
        if unknown:
            raise TypeError(f"{type(self).__name__} takes no {', '.join(sorted(unknown))}")
        return SimpleNamespace(images=list(self.modular(**kwargs, output="images")))

    __call__.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    cls = type(type(modular).__name__, (ModularText2Image,), {"__call__": __call__, "__module__": __name__})
    return cls(modular)
