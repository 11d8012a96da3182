"""The UI's example prompts: plain constants, so serving gets them without the drawing code."""

from __future__ import annotations

# Prompts the default model draws well: the UI's examples, the README's grid and a test's prompts
# (each uses only ``shapes``' colours and shapes, in ``shapes.caption``'s phrasing).
EXAMPLE_PROMPTS: tuple[str, ...] = (
    "a red circle on a blue background",
    "a yellow star on a purple background",
    "a small white square in the top left on a black background",
    "a green triangle on a yellow background",
    "a large orange circle in the center on a green background",
    "a blue square on a white background",
    "a small black star in the bottom right on an orange background",
    "a purple triangle on a white background",
)
# For any other model: ordinary text-to-image prompts.
GENERIC_PROMPTS: tuple[str, ...] = (
    "an astronaut riding a horse on the moon, detailed illustration",
    "a watercolor painting of a lighthouse at sunset",
    "a cozy cabin in a snowy forest, warm light in the windows",
)
