"""A device that fails as a GPU does, injected from outside the app: diffusers' own UNet class is patched
inside the model process, by the picklable loader that process runs (the app's code is untouched)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

STICKY = "CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be asynchronously reported"
INPUT = "mat1 and mat2 shapes cannot be multiplied (2x768 and 1024x320)"


@dataclass(frozen=True)
class FaultyDenoiser:
    """Loads the embedded model; then the first UNet call after ``marker`` appears (in any process)
    takes the marker and fails with ``message``. A ``sticky`` fault poisons that process, as an
    illegal address poisons a CUDA context: every later call there fails too. A new process is clean."""

    marker: str
    message: str = STICKY
    sticky: bool = True

    def __call__(self) -> Any:
        from diffusers import UNet2DConditionModel

        from pipeline.config import Settings
        from pipeline.engine.model.loading import load_model

        model = load_model(Settings(device="cpu"))
        original = UNet2DConditionModel.forward
        poisoned: list[bool] = []
        marker, message, sticky = self.marker, self.message, self.sticky

        def forward(unet: Any, *args: Any, **kwargs: Any) -> Any:
            if not poisoned:
                try:
                    os.unlink(marker)
                except FileNotFoundError:
                    return original(unet, *args, **kwargs)
                if not sticky:
                    raise RuntimeError(message)
                poisoned.append(True)
            raise RuntimeError(message)

        UNet2DConditionModel.forward = forward
        return model
