"""Hosting the model: the model thread (runner), the model process (process, child, wire) and ZeroGPU."""
