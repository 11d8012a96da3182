"""An SDXL whose VAE decoder overflows float16, as the real SDXL VAE does (issue 36 §2).

The tiny SDXL build's decoder gets its first convolution scaled by 1e5: in float32 the group norms
after it take the scale away, in float16 its activations pass 65,504 and become inf, then NaN, as the
real SDXL VAE's do. diffusers upcasts such a VAE (``force_upcast``) for the final decode; whatever
else decodes or fits in the model's dtype (the preview map) must upcast too.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

HOT = 1e5


def hot_sdxl() -> Path:
    import torch

    from tests.families import build_pipeline

    pipe = build_pipeline("sdxl")
    with torch.no_grad():
        pipe.vae.decoder.conv_in.weight.mul_(HOT)
        pipe.vae.decoder.conv_in.bias.mul_(HOT)
    out = Path(tempfile.mkdtemp(prefix="t2i-sdxl-hot-")) / "sdxl-hot"
    pipe.save_pretrained(out, safe_serialization=True)
    return out
