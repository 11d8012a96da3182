"""The diffusers model: loading, families, samplers, previews, LoRA adapters, speedups, and the simulated device."""
