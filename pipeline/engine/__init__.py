"""The model side: the model thread, the diffusers model it owns, and ZeroGPU. Imports ``protocol``."""
