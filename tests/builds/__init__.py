"""Tiny random-weight diffusers pipelines of every model family the app may be pointed at, built in
memory in seconds: one module per family or group of related families, named after them.

- ``stable_diffusion``: sd1, sd2-v, sdxl, sd3, sd-turbo, sdxl-lcm;
- ``flux_chroma_ovis_longcat_ernie``: flux-schnell, flux-dev, flux2-dev, flux2-klein, flux2-klein-base,
  chroma, ovis-image, longcat-image, ernie-image;
- ``pixart_sana``: pixart-alpha, pixart-sigma, sana, sana-sprint;
- ``qwen_image_z_image_hidream_hunyuan_kandinsky``: qwen-image, z-image-turbo, z-image, hidream,
  hunyuanimage-2.1, kandinsky5;
- ``krea_ideogram_lumina_cogview``: krea2, ideogram4, lumina2, cogview4;
- ``components``: what several of them share (tokenizers, text encoders, VAEs, the seed).

The family names are ``BUILDS``' keys, the names ``tests.families`` and the tests know them by.

Each is built from configs (nothing is downloaded: the tokenizers are learned or written here) with
seeded random weights, tiny widths and few layers -- but with the real model's structure wherever the
app reads it: the VAE's downsampling, the latent channels, the denoiser's ``sample_size`` (the default
size), patch sizes and latent packing, the schedulers of the real model cards, the tokenizers' maximum
lengths. The newer families follow diffusers' own test components (``get_dummy_components()``). The
pictures are noise; the plumbing (shapes, schedulers, tokenizers, call arguments) is real.
``tests.families`` saves them as folders the app loads with ``from_pretrained``.
"""

from __future__ import annotations

from typing import Any, Callable

from tests.builds import (
    flux_chroma_ovis_longcat_ernie,
    krea_ideogram_lumina_cogview,
    pixart_sana,
    qwen_image_z_image_hidream_hunyuan_kandinsky,
    stable_diffusion,
)

# family -> its pipeline in memory (seeded random weights: the same weights every call)
BUILDS: dict[str, Callable[[], Any]] = {
    **stable_diffusion.BUILDS,
    **flux_chroma_ovis_longcat_ernie.BUILDS,
    **pixart_sana.BUILDS,
    **qwen_image_z_image_hidream_hunyuan_kandinsky.BUILDS,
    **krea_ideogram_lumina_cogview.BUILDS,
}
