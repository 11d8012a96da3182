"""Sampler choice per request: which schedulers a family offers, and a fresh one for every job.

The names are AUTOMATIC1111's (what its PNG ``parameters`` say and what people know), each built
from the model's own scheduler config, so its betas, prediction type, zero-SNR rescaling and
timestep spacing carry over, the way diffusers' documentation swaps schedulers
(``DDIMScheduler.from_config(pipe.scheduler.config)``):

- **Euler** ``EulerDiscreteScheduler``; **Euler a** ``EulerAncestralDiscreteScheduler``;
  **DPM++ 2M Karras** ``DPMSolverMultistepScheduler`` (dpmsolver++, order 2, Karras sigmas);
  **DDIM** ``DDIMScheduler``; **UniPC** ``UniPCMultistepScheduler``.
- **Where they are offered:** the UNet families (SD 1.x/2.x, SDXL) and PixArt, whose models
  predict noise (or v) on a DDPM schedule. Flow-matching models (SD3, FLUX, Sana, Lumina: a
  FlowMatch scheduler, or flow sigmas) keep their own scheduler, and so do consistency-distilled
  ones (LCM, TCD), whose few steps only their own scheduler takes. ``"default"`` is always
  offered: the model's own scheduler.
- **Per job:** schedulers are stateful (step index, multistep history), so every job gets its
  own instance, built on the model thread, and the pipeline's own (``base``) is never stepped.
"""

from __future__ import annotations

from typing import Any

DEFAULT = "default"
# A1111 name -> (diffusers class, options over the model's config). The sigma options are spelled
# out so that a base config's own choice (Karras, exponential, beta sigmas) never leaks into a name
# that means something else.
_PLAIN_SIGMAS = {"use_karras_sigmas": False, "use_exponential_sigmas": False, "use_beta_sigmas": False}
SAMPLERS: dict[str, tuple[str, dict[str, Any]]] = {
    "Euler": ("EulerDiscreteScheduler", _PLAIN_SIGMAS),
    "Euler a": ("EulerAncestralDiscreteScheduler", {}),
    "DPM++ 2M Karras": (
        "DPMSolverMultistepScheduler",
        {
            **_PLAIN_SIGMAS,
            "use_karras_sigmas": True,
            "use_lu_lambdas": False,
            "algorithm_type": "dpmsolver++",
            "solver_order": 2,
        },
    ),
    "DDIM": ("DDIMScheduler", {"clip_sample": False}),  # its default clips x0 to [-1, 1]: wrong for latents
    "UniPC": ("UniPCMultistepScheduler", _PLAIN_SIGMAS),
}
_OWN_ONLY = ("LCMScheduler", "TCDScheduler")  # consistency-distilled: their own scheduler or nothing


def _is_flow(scheduler: Any) -> bool:
    config = scheduler.config
    return (
        "FlowMatch" in type(scheduler).__name__
        or bool(getattr(config, "use_flow_sigmas", False))
        or getattr(config, "prediction_type", "epsilon") == "flow_prediction"
    )


def offered(family: str, scheduler: Any) -> tuple[str, ...]:
    """The sampler names a request may ask for on this model: ``"default"`` first."""
    if family not in ("sd", "sdxl", "pixart") or _is_flow(scheduler) or type(scheduler).__name__ in _OWN_ONLY:
        return (DEFAULT,)
    return (DEFAULT, *SAMPLERS)


def build(base: Any, name: str) -> Any:
    """A new scheduler for one job: ``name`` (or the model's own class for ``"default"``) from ``base``'s config."""
    if name == DEFAULT:
        return type(base).from_config(base.config)
    import diffusers

    class_name, options = SAMPLERS[name]
    return getattr(diffusers, class_name).from_config(base.config, **options)
