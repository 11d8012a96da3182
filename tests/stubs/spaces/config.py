"""``spaces.config`` as in spaces 0.51.0: ``Config.zero_gpu`` comes from ``SPACES_ZERO_GPU``, read once at import.

Only the switch that decides whether ``@spaces.GPU`` wraps anything is kept. The real module also asserts
``SPACES_ZERO_DEVICE_API_URL`` is set when ``zero_gpu`` is true (the device API this stand-in has no use for)
and reads the fake-CUDA settings of its torch patching, which is not reproduced.
"""

from __future__ import annotations

import os


def boolean(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "t", "true")


class Settings:
    def __init__(self) -> None:
        self.zero_gpu: bool = boolean(os.getenv("SPACES_ZERO_GPU"))


Config = Settings()
