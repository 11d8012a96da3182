"""The I/O side: on the event loop and its pool threads; no torch, no gradio.

Events, the ``Adapter`` protocol and its shared base, the line and batching, ``LocalAdapter``,
the model-stream thread, PNG postprocessing, metrics and the output sweeper. Imports only
``request``, ``protocol``, ``errors`` (and ``config`` for settings) from the rest of ``pipeline``.
"""
