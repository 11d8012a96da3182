"""Speed settings for a loaded pipeline: ``--channels-last`` and ``--compile`` (issue 17).

Applied by ``engine.model.loading`` once the pipeline is on its device and in its dtype, on the model
thread, before the warm-up:

- **channels_last** puts the convolution weights of a UNet denoiser and of the VAE in NHWC order,
  which cuDNN's tensor-core convolutions prefer. A transformer denoiser (FLUX, SD3, PixArt, Sana)
  has no convolutions to speak of and is left alone (the VAE is still converted). On the 2-core
  CPU the embedded model ran 8 % faster at 64-128 px and no faster at 256 px
  (``tests/server/test_compile.py``'s module docstring has the figures).
- **compile** wraps the denoiser (``pipe.unet`` or ``pipe.transformer``) in ``torch.compile``. On
  CUDA ``mode="reduce-overhead"``: inductor's kernels replayed as CUDA graphs, which removes the
  per-kernel launch cost that bounds a fast GPU on few-step models (the seeds' choice over side
  streams); with model CPU offload the default mode instead (the weights move every call). Elsewhere
  the default mode (inductor's C++/OpenMP kernels on the CPU, which need a C++ compiler; without
  one the denoiser stays eager, with a warning).

Compilation is lazy: the first call compiles (the warm-up, at the default size), with the batch
dimension symbolic (``dynamic_batch``), so members joining and leaving a step-level loop never
recompile. ``dynamic=None`` (the default) compiles the first width and height statically and, the
first time they differ, once more with them symbolic, so later sizes reuse that graph instead of
recompiling each time.
On CUDA, graphs are still recorded once per distinct shape (a replay needs fixed sizes), which
costs a recording and some pool memory per new size. The recompile limit is raised to
``RECOMPILE_LIMIT`` so batch 1 / batch 2 (guidance on or off) and a few static sizes all fit;
past it dynamo runs that frame eagerly rather than failing.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger(__name__)

RECOMPILE_LIMIT = 16  # torch's default is 8 graphs per code object


def denoiser_name(pipe: Any) -> str | None:
    """``"unet"`` or ``"transformer"``: the pipeline's denoiser attribute, or None if it has neither."""
    for name in ("unet", "transformer"):
        if getattr(pipe, name, None) is not None:
            return name
    return None


def is_compiled(module: Any) -> bool:
    return isinstance(module, torch._dynamo.eval_frame.OptimizedModule)


def use_channels_last(pipe: Any) -> tuple[str, ...]:
    """Convolution weights of the UNet and the VAE in channels_last; returns what was converted."""
    converted = []
    name = denoiser_name(pipe)
    if name == "unet":
        _to_channels_last(pipe.unet)
        converted.append("unet")
    elif name is not None:
        log.info(
            "channels_last: the denoiser is a transformer (%s), not a convolutional UNet: left as it is",
            type(getattr(pipe, name)).__name__,
        )
    vae = getattr(pipe, "vae", None)
    if isinstance(vae, torch.nn.Module):
        _to_channels_last(vae)
        converted.append("vae")
    log.info("channels_last: %s", ", ".join(converted) or "nothing to convert")
    return tuple(converted)


def _to_channels_last(module: Any) -> None:
    """``Module.to(memory_format=...)``: converts the 4-D weights (``Any``: torch's stubs leave it out)."""
    module.to(memory_format=torch.channels_last)


def cpu_compiler() -> str | None:
    """The C++ compiler inductor would use for CPU kernels, or None if it finds none."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        return str(get_cpp_compiler())
    except Exception:  # InvalidCxxCompiler, or a torch that moved the private helper
        return None


def compile_denoiser(pipe: Any, device: str, *, offloaded: bool = False) -> str | None:
    """Wrap the denoiser in ``torch.compile``; returns the mode used, or None if it stays eager.

    ``offloaded``: model CPU offload moves the weights onto the GPU for every call, to new addresses,
    which a recorded CUDA graph cannot follow; such a denoiser is compiled without CUDA graphs.
    """
    name = denoiser_name(pipe)
    if name is None:
        log.warning("--compile: the pipeline has no unet or transformer; nothing compiled")
        return None
    if is_compiled(getattr(pipe, name)):
        return "already compiled"
    if device == "cpu" and cpu_compiler() is None:
        log.warning("--compile: no C++ compiler found (inductor needs one for CPU kernels); the %s stays eager", name)
        return None
    mode = "reduce-overhead" if device == "cuda" and not offloaded else "default"
    dynamo_config: Any = torch._dynamo.config
    dynamo_config.recompile_limit = max(int(dynamo_config.recompile_limit), RECOMPILE_LIMIT)
    compiled: Any = torch.compile(getattr(pipe, name), mode=mode)
    compiled.register_forward_pre_hook(dynamic_batch, with_kwargs=True)
    setattr(pipe, name, compiled)
    log.info(
        "--compile: pipe.%s wrapped in torch.compile(mode=%r); the first call of each new shape compiles "
        "(tens of seconds, minutes on a CPU)",
        name,
        mode,
    )
    return mode


def dynamic_batch(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Mark the batch dimension of every input of the compiled denoiser dynamic, before dynamo sees it.

    A step-level loop's batch changes at every join and leave (its rows: each member's images, twice
    under guidance). Without this the warm-up compiles one static batch and the first join at another
    stalls every member for a recompile; with it the warm-up's graph is symbolic in the batch and
    serves every row count (on CUDA, a CUDA graph is still recorded once per new row count). A batch
    of 1 stays static (dynamo specialises 0 and 1): at most one more graph, once.
    """
    for value in (*args, *kwargs.values()):
        # SDXL's added_cond_kwargs (a dict); a ControlNet's residuals (a list: down_block_additional_residuals)
        tensors = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else (value,)
        for tensor in tensors:
            if isinstance(tensor, torch.Tensor) and tensor.ndim >= 1 and tensor.shape[0] > 1:
                torch._dynamo.maybe_mark_dynamic(tensor, 0)


def uncompile_denoiser(pipe: Any) -> bool:
    """Put the eager denoiser back (a compile that failed at the warm-up); True if there was one to undo."""
    name = denoiser_name(pipe)
    if name is None or not is_compiled(getattr(pipe, name)):
        return False
    setattr(pipe, name, getattr(pipe, name)._orig_mod)
    return True
