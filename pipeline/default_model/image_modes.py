"""Whether the model's image modes follow their input, measured through a running app with the real
``gradio_client`` (issue 48 §6: the first embedded model's VAE could not give a picture back, so its
image-to-image drew the prompt whatever the input):

    python -m pipeline.default_model.image_modes --url http://127.0.0.1:7860/ [--json FILE]

Two drawn pictures (a yellow circle on green, a red square on blue, 64 px), one prompt (the first
picture's caption), one seed, 20 steps at the model's guidance:

- ``image_to_image``: the second picture under the first's caption, each strength's mean absolute
  difference to its input (0-255): small at 0.1 and 0.3, larger at 0.6, where the prompt takes over;
- ``apart``: the two inputs' outputs at strength 0.3 against each other: an image-to-image that
  follows its input keeps them about as far apart as the inputs are (``inputs_apart``), one that
  draws the prompt whatever the input brings them together;
- ``inpaint``: a square in the middle redrawn as a red square: the difference inside the mask and
  outside it (kept).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from . import shapes

STRENGTHS = (0.1, 0.3, 0.6)
SEED = 3
STEPS = 20
FIRST = shapes.Spec("yellow", "circle", "green")
SECOND = shapes.Spec("red", "square", "blue")
INPAINT_PROMPT = "a red square on a green background"


def _pixels(path: str | Path) -> np.ndarray:
    with Image.open(path) as png:
        return np.asarray(png.convert("RGB"), dtype=np.float64)


def _apart(a: np.ndarray, b: np.ndarray, where: np.ndarray | None = None) -> float:
    diff = np.abs(a - b).mean(axis=-1)
    return round(float(diff[where].mean() if where is not None else diff.mean()), 1)


def measure(url: str, folder: Path | None = None) -> dict[str, Any]:
    """The figures above, from the app at ``url`` (its ``/generate`` API)."""
    from gradio_client import Client, handle_file

    client = Client(url, verbose=False)
    with tempfile.TemporaryDirectory() as tmp:
        here = folder or Path(tmp)
        files = {}
        for name, spec in (("first", FIRST), ("second", SECOND)):
            files[name] = here / f"{name}.png"
            shapes.render(spec).save(files[name])
        mask = np.zeros((shapes.SIZE, shapes.SIZE), np.uint8)
        mask[20:44, 20:44] = 255
        files["mask"] = here / "mask.png"
        Image.fromarray(mask).save(files["mask"])
        inputs = {name: _pixels(files[name]) for name in ("first", "second")}

        def run(prompt: str, source: str, **fields: Any) -> np.ndarray:
            gallery, info = client.predict(
                prompt=prompt, seed=SEED, randomize_seed=False, num_inference_steps=STEPS,
                image=handle_file(str(files[source])), api_name="/generate", **fields,
            )  # fmt: skip
            assert info["status"] == "done", info
            return _pixels(gallery[0]["image"])

        prompt = shapes.caption(FIRST)
        strengths = {s: run(prompt, "second", mode="image", strength=s) for s in STRENGTHS}
        first = run(prompt, "first", mode="image", strength=0.3)
        painted = run(INPAINT_PROMPT, "first", mode="inpaint", strength=1.0, mask=handle_file(str(files["mask"])),
                      mask_blur=0)  # fmt: skip
    inside = mask > 127
    return {
        "prompt": prompt,
        "image_to_image": {f"{s:g}": _apart(out, inputs["second"]) for s, out in strengths.items()},
        "first_input_at_0.3": _apart(first, inputs["first"]),
        "apart": _apart(strengths[0.3], first),
        "inputs_apart": _apart(inputs["first"], inputs["second"]),
        "inpaint": {
            "inside": _apart(painted, inputs["first"], inside),
            "outside": _apart(painted, inputs["first"], ~inside),
        },
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the running app")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    figures = measure(args.url)
    print(json.dumps(figures, indent=1))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
