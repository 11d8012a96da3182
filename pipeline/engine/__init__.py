"""The model side, in three parts by concern. Imports ``protocol``, ``errors``, ``config``, ``default_model``.

- ``hosting``: what owns the model and how the server reaches it: the model thread (``runner``), the
  model process (``process``, ``child``, its socket's messages ``wire``) and ZeroGPU (``zerogpu``);
- ``model``: the diffusers model itself: ``loading``, ``diffusers_model``, the families, samplers,
  previews, LoRAs, speedups, and the benchmarks' ``simulated`` device;
- ``loop``: step-level joining: the driver (``joining``) and each family's denoising loop.

``hosting`` drives the other two; the loops read the model through ``loop.loop_base.LoopHost`` (so no
module imports one that imports it back: ``tests/unit/test_layout.py`` checks there is no cycle).
"""
