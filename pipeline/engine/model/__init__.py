"""The diffusers model: loading, families, samplers, previews, LoRAs, speedups, and the simulated device."""
