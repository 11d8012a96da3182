"""Live previews: the scheduler's denoised estimate, mapped to RGB by a map fitted to this VAE.

A preview must look like the picture it announces, so two things matter:

- **What is previewed:** the denoised estimate (the scheduler's predicted clean latents, x0), not the
  noisy latents of the step; two steps before the end of a 20-step Euler run the noisy latents still
  differ from the final ones by 20-35 %. ``denoised`` reads it from the scheduler's output where the
  scheduler reports it, and derives it from the model output where it does not (flow matching:
  x0 = x - sigma * v; DDPM-family: from alphas_cumprod and the prediction type).
- **How latents become colours:** a per-pixel map fitted to *this* VAE. The embedded model ships a
  small 4 -> 32 -> 3 network fitted when it was trained (``preview/`` in its folder); any other VAE
  gets a linear map fitted once at load from a few smooth colour pictures, encoded and decoded by
  this VAE (``fit_from_vae``: the decoder's colours are the target).
  Factors fitted for one VAE draw the wrong colours on another.

FLUX's packed latents are unpacked first. Runs on the model thread; a preview costs a few small
matrix products on the CPU, never a VAE decode, and is drawn at display size (``display_size``: at
most ``PREVIEW_MAX_SIDE`` px on its longest side), then encoded there as a small JPEG
(``protocol.EncodedPreview``).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from ...protocol import display_size

log = logging.getLogger(__name__)

PREVIEW_FOLDER = "preview"  # inside a model folder: preview.safetensors + preview.json


class PreviewMap:
    """A per-pixel map from C latent channels to RGB in [0, 1]: linear layers with ReLU between."""

    def __init__(self, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.layers = [(w.float().cpu(), b.float().cpu()) for w, b in layers]

    @property
    def channels(self) -> int:
        return int(self.layers[0][0].shape[1])

    @property
    def finite(self) -> bool:
        return all(bool(torch.isfinite(w).all() and torch.isfinite(b).all()) for w, b in self.layers)

    def rgb(self, latents: torch.Tensor) -> torch.Tensor:
        """(C, h, w) latents -> (3, h, w) colours in [0, 1]."""
        x = latents.detach().float().cpu().flatten(1).T  # (h*w, C)
        for i, (weight, bias) in enumerate(self.layers):
            x = x @ weight.T + bias
            if i < len(self.layers) - 1:
                x = torch.relu(x)
        return x.T.reshape(3, *latents.shape[1:]).clamp(0, 1)

    def image(self, latents: torch.Tensor, width: int, height: int) -> Image.Image:
        array = (self.rgb(latents).permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
        return Image.fromarray(array, "RGB").resize(display_size(width, height), Image.Resampling.BILINEAR)

    def save(self, folder: Path) -> None:
        from safetensors.torch import save_file

        folder.mkdir(parents=True, exist_ok=True)
        tensors = {
            f"{kind}.{i}": t.contiguous()
            for i, pair in enumerate(self.layers)
            for kind, t in zip(("weight", "bias"), pair)
        }
        save_file(tensors, str(folder / "preview.safetensors"))
        (folder / "preview.json").write_text(json.dumps({"layers": len(self.layers), "channels": self.channels}))

    @classmethod
    def load(cls, folder: Path) -> PreviewMap:
        from safetensors.torch import load_file

        tensors = load_file(str(folder / "preview.safetensors"))
        count = json.loads((folder / "preview.json").read_text())["layers"]
        return cls([(tensors[f"weight.{i}"], tensors[f"bias.{i}"]) for i in range(count)])


class DecoderPreview:
    """Previews decoded by a tiny autoencoder (``--preview-decoder``: TAESD, TAESDXL, TAESD3, TAEF1).

    Sharper than a per-pixel map, for a small decode on the model's device. The tiny decoders
    read the pipeline's latents as they are (their scaling factor is 1 and their shift 0).
    """

    def __init__(self, decoder: Any) -> None:
        self.decoder = decoder

    @property
    def channels(self) -> int:
        return int(self.decoder.config.latent_channels)

    @torch.inference_mode()
    def image(self, latents: torch.Tensor, width: int, height: int) -> Image.Image:
        param = next(self.decoder.parameters())
        decoded = self.decoder.decode(latents[None].to(param.device, param.dtype)).sample[0]
        array = ((decoded.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 0).cpu().numpy()
        return Image.fromarray(array, "RGB").resize(display_size(width, height), Image.Resampling.BILINEAR)


def load_decoder(path: Path, device: str, dtype: torch.dtype) -> DecoderPreview:
    from diffusers import AutoencoderTiny

    return DecoderPreview(AutoencoderTiny.from_pretrained(str(path), torch_dtype=dtype).to(device))


Previewer = PreviewMap | DecoderPreview


def fit_linear(latents: torch.Tensor, targets: torch.Tensor) -> PreviewMap:
    """Least squares: (N, C, h, w) latents -> (N, 3, h, w) colours, with a bias (NaN where they are not finite)."""
    x = latents.float().permute(0, 2, 3, 1).reshape(-1, latents.shape[1])
    y = targets.float().permute(0, 2, 3, 1).reshape(-1, 3)
    if not (torch.isfinite(x).all() and torch.isfinite(y).all()):
        channels = latents.shape[1]
        return PreviewMap([(torch.full((3, channels), math.nan), torch.full((3,), math.nan))])
    x1 = torch.cat([x, torch.ones(len(x), 1)], dim=1)
    solution = torch.linalg.lstsq(x1, y).solution  # (C + 1, 3)
    return PreviewMap([(solution[:-1].T.contiguous(), solution[-1].contiguous())])


def fit_mlp(
    latents: torch.Tensor, targets: torch.Tensor, hidden: int = 32, steps: int = 1500, seed: int = 0
) -> PreviewMap:
    """A per-pixel C -> hidden -> 3 network (seconds on a CPU), fitted with L1 on the colours."""
    x = latents.float().permute(0, 2, 3, 1).reshape(-1, latents.shape[1])
    y = targets.float().permute(0, 2, 3, 1).reshape(-1, 3)
    gen = torch.Generator().manual_seed(seed)
    first, last = torch.nn.Linear(x.shape[1], hidden), torch.nn.Linear(hidden, 3)
    net = torch.nn.Sequential(first, torch.nn.ReLU(), last)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    for _ in range(steps):
        batch = torch.randint(0, len(x), (4096,), generator=gen)
        loss = (net(x[batch]).clamp(0, 1) - y[batch]).abs().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return PreviewMap([(first.weight.detach(), first.bias.detach()), (last.weight.detach(), last.bias.detach())])


def _smooth_pictures(count: int, size: int, seed: int = 0) -> torch.Tensor:
    """Smooth colour fields with a few flat shapes: what pictures look like to a VAE, in [0, 1]."""
    gen = torch.Generator().manual_seed(seed)
    coarse = torch.rand(count, 3, 4, 4, generator=gen)
    pictures = torch.nn.functional.interpolate(coarse, size=(size, size), mode="bicubic", align_corners=False)
    ys, xs = torch.meshgrid(torch.arange(size), torch.arange(size), indexing="ij")
    for n in range(count):
        for _ in range(3):
            cy, cx, r = (torch.rand(3, generator=gen) * torch.tensor([size, size, size / 4])).tolist()
            mask = (ys - cy) ** 2 + (xs - cx) ** 2 < (r + size / 16) ** 2
            pictures[n, :, mask] = torch.rand(3, 1, generator=gen)
    return pictures.clamp(0, 1)


def to_latent_space(vae: Any, z: torch.Tensor) -> torch.Tensor:
    """A VAE's raw latents as the pipeline sees them: shifted and scaled by its config."""
    mean, std = getattr(vae.config, "latents_mean", None), getattr(vae.config, "latents_std", None)
    if mean is not None and std is not None and len(mean) == z.shape[1] == len(std):  # per-channel (Qwen, Wan VAEs)
        shape = (1, -1) + (1,) * (z.ndim - 2)
        return (z - torch.tensor(mean).view(shape)) / torch.tensor(std).view(shape)
    shift = getattr(vae.config, "shift_factor", None) or 0.0
    scale = getattr(vae.config, "scaling_factor", None) or 1.0
    return (z - shift) * scale


def _decoded(vae: Any, z: torch.Tensor, video: bool) -> torch.Tensor:
    """What the VAE's decoder draws from raw latents ``z``: (N, 3, H, W) colours in [0, 1]."""
    out = vae.decode(z[:, :, None] if video else z)
    sample = out.sample if hasattr(out, "sample") else out[0]
    if sample.ndim == 5:
        sample = sample[:, :, 0]
    return ((sample.float().cpu() + 1) / 2).clamp(0, 1)


def fit_from_vae(vae: Any, count: int = 6, size: int = 128) -> PreviewMap:
    """A linear map for any VAE (once, at load, on the model thread): latents of a few encoded
    pictures against what the VAE's *decoder* draws from them, pooled to the latent grid.

    The decoder is what makes the final picture, so its colours are the target: for a trained VAE
    they are the pictures again; for one whose encoder and decoder disagree (random weights, a
    retrained decoder) a map fitted to the pictures would announce colours the picture never has.

    In float32 whenever the final decode is: a VAE that diffusers upcasts (``force_upcast``, the
    SDXL VAE, whose activations overflow float16) or one whose half-precision fit is not finite.
    """
    param = next(vae.parameters())
    if param.dtype in (torch.float16, torch.bfloat16) and getattr(vae.config, "force_upcast", False):
        return _fit_in_float32(vae, count, size)
    fitted = _fit(vae, count, size)
    if param.dtype != torch.float32 and not fitted.finite:
        log.info("the preview map is not finite in %s: fitting it in float32", param.dtype)
        return _fit_in_float32(vae, count, size)
    return fitted


def _fit_in_float32(vae: Any, count: int, size: int) -> PreviewMap:
    dtype = next(vae.parameters()).dtype
    vae.to(torch.float32)
    try:
        return _fit(vae, count, size)
    finally:
        vae.to(dtype)


@torch.inference_mode()
def _fit(vae: Any, count: int, size: int) -> PreviewMap:
    pictures = _smooth_pictures(count, size)
    param = next(vae.parameters())
    x = pictures.to(param.device, param.dtype) * 2 - 1
    video = False
    try:
        encoded = vae.encode(x)
    except (RuntimeError, ValueError, TypeError, IndexError):  # a video-style VAE takes (B, C, T, H, W)
        encoded, video = vae.encode(x[:, :, None]), True
    dist = getattr(encoded, "latent_dist", None)
    z: Any = dist.mode() if dist is not None else getattr(encoded, "latent", None)
    if z is None:
        z = encoded[0]
    if z.ndim == 5:
        z = z[:, :, 0]
    latents = to_latent_space(vae, z.float().cpu())
    drawn = _decoded(vae, z, video)
    targets = torch.nn.functional.adaptive_avg_pool2d(drawn, (latents.shape[-2], latents.shape[-1]))
    return fit_linear(latents, targets)


def load_preview_map(pipe: Any, source: Path | None, *, fit: bool = True) -> tuple[PreviewMap | None, str]:
    """The map saved with the model, else (``fit``) one fitted to its VAE now; and, when there is
    none, why (said at start, in ``/health`` and on the page: previews are never silently off)."""
    if source is not None and (source / PREVIEW_FOLDER / "preview.safetensors").exists():
        return PreviewMap.load(source / PREVIEW_FOLDER), ""
    vae = getattr(pipe, "vae", None)
    if vae is None or not hasattr(vae, "encode"):
        return None, "the model has no VAE to fit a preview map to; give --preview-decoder"
    if not fit:
        return None, "on ZeroGPU the device exists only inside a request's GPU call; give --preview-decoder"
    try:
        fitted = fit_from_vae(vae)
    except Exception as exc:  # a VAE we cannot encode with: previews off, serving on
        log.warning("could not fit a preview map to this VAE: %s", exc, exc_info=True)
        return None, f"no preview map could be fitted to this VAE ({type(exc).__name__}); give --preview-decoder"
    if not fitted.finite:
        return None, "the preview map fitted to this VAE is not finite, even in float32; give --preview-decoder"
    return fitted, ""


def denoised(scheduler: Any, out: Any, model_output: torch.Tensor, timestep: Any, sample: torch.Tensor) -> torch.Tensor:
    """The scheduler's estimate of the clean latents at this step (see the module docstring)."""
    x0 = getattr(out, "pred_original_sample", None)
    if x0 is None and isinstance(out, tuple) and len(out) > 1 and isinstance(out[1], torch.Tensor):
        x0 = out[1]
    if x0 is not None:
        return x0
    config = scheduler.config
    t = float(timestep.flatten()[0]) if isinstance(timestep, torch.Tensor) else float(timestep)
    if "FlowMatch" in type(scheduler).__name__:
        sigma = t / float(getattr(config, "num_train_timesteps", 1000))
        return sample - sigma * model_output
    alphas = getattr(scheduler, "alphas_cumprod", None)
    if alphas is not None:
        a = float(alphas[min(round(t), len(alphas) - 1)])
        kind = getattr(config, "prediction_type", "epsilon")
        if kind == "v_prediction":
            return math.sqrt(a) * sample - math.sqrt(1 - a) * model_output
        if kind == "sample":
            return model_output
        return (sample - math.sqrt(1 - a) * model_output) / math.sqrt(a)
    return out[0] if isinstance(out, tuple) else out.prev_sample


def _denormalize(pipe: Any, latents: torch.Tensor, dim: int) -> torch.Tensor:
    """FLUX.2's and ERNIE's VAE normalise the 2x2-patchified latents with a batch norm's running statistics."""
    bn = getattr(getattr(pipe, "vae", None), "bn", None)
    mean, var = getattr(bn, "running_mean", None), getattr(bn, "running_var", None)
    if mean is None or var is None or latents.shape[dim] != mean.shape[0]:
        return latents
    shape = [1] * latents.ndim
    shape[dim] = -1
    std = torch.sqrt(var.float().cpu() + float(getattr(bn, "eps", 1e-5)))
    return latents.float().cpu() * std.view(shape) + mean.float().cpu().view(shape)


def unpack(pipe: Any, latents: torch.Tensor, width: int, height: int) -> torch.Tensor:
    """(B, C, h, w) VAE latents from what the denoiser steps on.

    - (B, C, T, h, w) from a video-style VAE (Qwen-Image, Krea 2), or (B, T, h, w, C) (Kandinsky 5):
      the one frame.
    - (B, tokens, C*p*p) packed p x p (FLUX, FLUX.2, Chroma, Qwen-Image, HiDream, ...): p follows
      from the token count and the latent grid; the tokens unfold in FLUX's order (c, then the patch).
    - (B, C*4, h/2, w/2) patchified by the VAE itself (ERNIE): unfolded the same way.
    FLUX.2's and ERNIE's batch-norm statistics are undone first.
    """
    latent_channels = getattr(getattr(getattr(pipe, "vae", None), "config", None), "z_dim", None) or getattr(
        getattr(getattr(pipe, "vae", None), "config", None), "latent_channels", None
    )
    if latents.ndim == 5:  # (B, C, T, h, w), or channels last (B, T, h, w, C) (Kandinsky 5)
        channels_last = latents.shape[-1] == latent_channels and latents.shape[1] != latent_channels
        latents = latents[:, 0].permute(0, 3, 1, 2) if channels_last else latents[:, :, 0]
    vae = int(getattr(pipe, "vae_scale_factor", None) or getattr(pipe, "vae_scale_factor_spatial", None) or 8)
    if latents.ndim == 4:
        if latent_channels and latents.shape[1] == 4 * latent_channels:  # patchified 2x2 by the VAE (ERNIE)
            x = _denormalize(pipe, latents, 1)
            b, _, h, w = x.shape
            x = x.reshape(b, latent_channels, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3)
            return x.reshape(b, latent_channels, h * 2, w * 2)
        return latents
    if latents.ndim != 3:
        return latents
    rows, cols = height // vae, width // vae
    batch, tokens, depth = latents.shape
    p = math.isqrt(max(1, rows * cols // max(1, tokens)))
    if p < 1 or (rows // p) * (cols // p) != tokens or depth % (p * p):
        return latents  # a packing we do not know: the caller skips the preview
    latents = _denormalize(pipe, latents, 2)
    from .family_table import family_for

    family = family_for(type(pipe).__name__)
    if family is not None and family.patch_last:  # (py, px, c) per token
        x = latents.reshape(batch, rows // p, cols // p, p, p, depth // (p * p))
        return x.permute(0, 5, 1, 3, 2, 4).reshape(batch, depth // (p * p), rows // p * p, cols // p * p)
    x = latents.reshape(batch, rows // p, cols // p, depth // (p * p), p, p)
    return x.permute(0, 3, 1, 4, 2, 5).reshape(batch, depth // (p * p), rows // p * p, cols // p * p)
