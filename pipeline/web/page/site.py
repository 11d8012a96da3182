"""What the page's events, its handler and the front door share about one app (``Site``), kept per Blocks."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr

from ..door.admission import LiveCalls
from ..door.identity import TrustedProxies
from .results import SessionResults


@dataclass
class Site:
    output_dir: Path
    trusted: TrustedProxies
    results: SessionResults = field(default_factory=SessionResults)
    calls: LiveCalls = field(default_factory=LiveCalls)


_SITES: weakref.WeakKeyDictionary[gr.Blocks, Site] = weakref.WeakKeyDictionary()


def attach(demo: gr.Blocks, site: Site) -> Site:
    _SITES[demo] = site
    return site


def site_of(demo: gr.Blocks) -> Site:
    return _SITES[demo]
