"""What a person (or a program) sees change while a request runs: its place in line, its steps and
previews (at most every ``PROGRESS_INTERVAL``), its images and info record, as the generate handler's
outputs (``web.page.handler``). Pure functions and ``ProgressView``; no I/O."""

from __future__ import annotations

import html
import time
from pathlib import Path
from typing import Any, Sequence

import gradio as gr

from ...protocol import Output
from .site import Site

PROGRESS_INTERVAL = 0.25  # seconds between streamed progress outputs of one request


def progress_gallery() -> Any:
    """The gallery's value in a progress output: None, never ``gr.skip()``.

    Gradio answers a skip (a prop update) by rebuilding the component and its JSON schema on the
    event loop, at every yield.
    """
    return None


class ProgressView:
    """What one request's caller sees of its progress: it says which events would change it.

    Every progress output costs Gradio a diff and a message on the event loop, and takes the GIL
    from the model thread, so the handler sends one only when a person would see something new:

    - "waiting for the GPU: k ahead" / "starting" when the text changes, never twice the same;
    - "step k/N" at most once per PROGRESS_INTERVAL, always N/N (the bar is full during the
      decode); previews too at most once per PROGRESS_INTERVAL after the first (a fast device
      makes more than a person can see: the latest one wins), and once a preview is on screen,
      only previews, N/N included (a progress output sends no picture: its gallery value, None,
      would blank the preview);
    - a 1-step job sends no step at all (its one step is followed by its images; its preview would
      be replaced by them at once) and no "starting" unless a "k ahead" is on screen to replace.
    """

    def __init__(self, num_inference_steps: Any, interval: float = PROGRESS_INTERVAL) -> None:
        self.one_step = num_inference_steps == 1  # a raw value: 1 or 1.0 (a bad one never gets here)
        self.interval = interval
        self.text: str | None = None  # the progress text on screen
        self.previewed = False  # a preview is on screen
        self.last_sent = 0.0

    def waiting(self, ahead: int, eta_seconds: float | None = None, switch: str = "") -> str | None:
        """The text to send for ``ahead`` requests in line (``switch``: the model the GPU switches to for it,
        several models), or None if the screen would not change."""
        text = f"waiting for the GPU: {ahead} ahead" if ahead else "starting"
        if switch:
            text += f", then a switch to {switch}"
        if ahead and eta_seconds is not None:
            text += f", about {duration_text(eta_seconds)}"
        if text == self.text or (self.one_step and not ahead and self.text is None):
            return None
        self.text = text
        return text

    def step(self, event: Output, now: float) -> bool:
        """Whether to send ``event`` (its "step k/N", and its preview if it has one)."""
        if event.total <= 1:
            return False
        if self.previewed and event.preview is None:
            return False  # a progress output sends no picture: it would blank the preview on screen
        last = event.step >= event.total
        if not last and now - self.last_sent < self.interval and (event.preview is None or self.previewed):
            return False  # coalesced: the caller needs the latest step (and preview), not every one
        self.last_sent = now
        self.previewed = self.previewed or event.preview is not None
        self.text = step_text(event)
        return True


def duration_text(seconds: float) -> str:
    """ "12 s", "2 min 5 s", "under 1 s": an estimate as a person reads it."""
    if seconds < 1:
        return "under 1 s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    return f"{whole // 60} min {whole % 60} s" if whole % 60 else f"{whole // 60} min"


def step_text(event: Output) -> str:
    """ "step k/N", and the time left once it is known: "step 3/20 · 12 s left"."""
    text = f"step {event.step}/{event.total}"
    if event.eta_seconds is not None and event.step < event.total:
        text += f" · {duration_text(event.eta_seconds)} left"
    return text


def status_html(text: str, step: int | None = None, total: int | None = None, *, running: bool = False) -> str:
    """The UI's own progress line: Gradio hides its progress bar once a handler streams outputs.

    ``running``: a request in flight (waiting or stepping), marked ``data-running`` for the page's
    Escape (``page_tools.KEYS_JS``): the page's event hides Gradio's own pending marks."""
    bar = f'<progress max="{total}" value="{step}" style="width:100%"></progress>' if total else ""
    mark = ' data-running="1"' if running else ""
    return f'<div class="t2i-status"{mark}>{bar}<span>{html.escape(text)}</span></div>'


def gallery_items(paths: Sequence[Path], info: dict[str, Any]) -> list[tuple[str, str]]:
    """Each image with its caption: its own seed and the time it took (the request's time over its images)."""
    each = info["durations_ms"]["total"] / 1000 / max(1, len(paths))
    return [(str(p), f"seed {seed} · {each:.2f} s") for p, seed in zip(paths, info["seeds"])]


def waiting_output(
    event: Output, view: ProgressView, request_id: str, progress: gr.Progress | None
) -> tuple[Any, ...] | None:
    """A place in line as the outputs show it (None: nothing a person would see changed)."""
    assert event.ahead is not None
    switch = str(event.info.get("model_switch", ""))  # several models: its model is not the one loaded
    if (text := view.waiting(event.ahead, event.eta_seconds, switch)) is None:
        return None
    if progress is not None:  # API callers: a progress message
        progress(0.0, desc=text)
    record = {"status": "waiting", "ahead": event.ahead, "eta_seconds": event.eta_seconds, "request_id": request_id,
              **({"model_switch": switch} if switch else {})}  # fmt: skip
    return (progress_gallery(), record, status_html(text, running=True))


def step_output(
    event: Output, view: ProgressView, request_id: str, progress: gr.Progress | None, as_file: bool
) -> tuple[Any, ...] | None:
    """A step as the outputs show it, with its preview (None: too soon after the last, or a 1-step job).

    API callers' steps are recorded for their "progress" messages: Gradio's progress sender (see
    tune_queue) sends the latest one every PROGRESS_INTERVAL. Not on the page: its status line shows
    the step, and each progress message put Gradio's tracker back to its pending overlay over the
    gallery until the next output (the preview hidden half the time)."""
    if event.total <= 1:
        return None  # a 1-step job: no progress at all, its images follow
    text = step_text(event)
    if progress is not None:
        progress((event.step, event.total), desc=text, unit="steps")
    if not view.step(event, time.monotonic()):
        return None
    shown = event.preview
    # the encoded preview as its file (Postprocess), or as a picture where Gradio postprocesses the yield
    preview = [shown if as_file else shown.image()] if shown is not None else progress_gallery()
    record = {"status": "running", "step": event.step, "total": event.total, "eta_seconds": event.eta_seconds,
              "request_id": request_id}  # fmt: skip
    return (preview, record, status_html(text, event.step, event.total, running=True))


def done_output(
    event: Output, site: Site | None, session: str | None, first_pass: Sequence[str] = ()
) -> tuple[Any, ...]:
    """The images, the info record and the time taken; on the page, filed in the tab's history.

    ``first_pass``: a hires fix's first pass per image, as the file route names them (``served_name``);
    the record lists them (the page's slider shows the first against the result)."""
    for warning in event.info["warnings"]:
        gr.Warning(warning)
    if site is not None:  # the tab's history: the server's own record
        site.results.add(session, event.paths, event.info)
    took = event.info["durations_ms"]["total"] / 1000
    record = {"status": "done", **event.info, **({"first_pass": list(first_pass)} if first_pass else {})}
    return gallery_items(event.paths, event.info), record, status_html(f"done in {took:.2f} s")


# The status line of a request refused at the join: watched from the click for a few seconds, it
# takes the fields' new messages (as text) while it still shows what it showed before the click.
# Gradio redraws the line at the request's first output, so an accepted request is never touched.
REFUSED_JS = """
() => {
  const line = document.querySelector('#status .t2i-status span');
  if (!line) { return; }
  const before = line.textContent, old = new Set(document.querySelectorAll('.validation-error'));
  const until = Date.now() + 5000;
  const look = () => {
    const now = document.querySelector('#status .t2i-status span');
    if (!now || now.textContent !== before) { return; }
    const said = [...document.querySelectorAll('.validation-error')].filter((e) => !old.has(e))
      .map((e) => e.textContent.trim()).filter(Boolean);
    if (said.length) { now.textContent = 'Error: ' + [...new Set(said)].join('; '); return; }
    if (Date.now() < until) { setTimeout(look, 50); }
  };
  setTimeout(look, 50);
}
"""
