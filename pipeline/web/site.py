"""What the page's events, its handler and the front door share about one app, kept per Blocks."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr

from .door.identity import TrustedProxies
from .page.results import SessionResults


@dataclass
class LiveCalls:
    """MCP tool calls whose caller is still connected (the handler stops a call's job when it goes).

    The front door adds a call when its request starts and drops it when the request ends or its
    client disconnects; the handler's liveness check reads it. Event loop only.
    """

    open: set[str] = field(default_factory=set)

    def alive(self, call: str) -> bool:
        """Whether call ``call`` is still connected; "" (a call the door does not follow) always is."""
        return not call or call in self.open


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
