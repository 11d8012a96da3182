"""The step-level loop: the driver (joining) and each family's denoising loop (loop_*)."""
