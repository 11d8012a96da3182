"""The page's own CSS (``demo.launch(css=...)``: Gradio 6 takes it at launch), for what Gradio's
components leave to the page.

- **Every picture whole** (issue 48). Gradio's gallery draws its items as squares as wide as their
  grid column, and with fewer results than columns one result takes the whole width: a 64 px
  picture became 700×700 at 1280 px (1084×1084 at 1920) inside the gallery's 460 px box, its bottom
  third (or more) hidden. Here the results' rows share the box's height (one row the whole height,
  two rows half each) and each picture is scaled down into its cell at its own aspect ratio, never
  cropped; a click still opens it at full size (Gradio's preview). The history keeps one row of
  thumbnails in view, each whole, and scrolls to the rest.
- **The mode's controls** show by CSS (``mode_panel.MODE_CSS``: why not by Gradio's visibility).
"""

from __future__ import annotations

from .mode_panel import MODE_CSS

PAGE_CSS = """
#gallery .grid-container { height: 100%; grid-auto-rows: minmax(0, 1fr); }
#gallery .gallery-item, #gallery .thumbnail-item { width: 100%; height: 100%; aspect-ratio: auto; }
#gallery .thumbnail-item img { width: 100%; height: 100%; object-fit: contain; }
#history .thumbnail-item { height: 150px; aspect-ratio: auto; }
#history .thumbnail-item img { width: 100%; height: 100%; object-fit: contain; }
"""
PAGE_CSS += MODE_CSS
