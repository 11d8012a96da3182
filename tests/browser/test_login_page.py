"""Under ``--auth``, in Debian's chromium: the login page renders and logs in with only the routes the
front door leaves open without a login (``guards.OPEN_UNDER_AUTH``), and then the app appears."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fakes import FakeModel


@pytest.fixture(scope="module")
def app_url(launch: Any) -> str:
    return str(launch("--auth", "ann:s3cret", load=FakeModel, name="login-page")[0])


def test_the_login_page_renders_and_logs_in_and_nothing_else_is_refused(browser: Any, app_url: str) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    refused: list[str] = []
    page.on("response", lambda r: refused.append(f"{r.status} {r.url}") if r.status in (401, 403, 404) else None)
    try:
        page.goto(app_url)
        page.get_by_label("username").fill("ann")
        page.get_by_label("password").fill("s3cret")
        page.get_by_role("button", name="Login").click()
        page.locator("#generate").wait_for(timeout=30_000)
        before = len(refused)
        page.reload()
        page.locator("#generate").wait_for(timeout=30_000)
    finally:
        page.close()
    # Before logging in, Gradio itself answers /config with 401 (that is how the page knows to show
    # the form), and the door answers the routes it guards; after, nothing is refused.
    assert all("/config" in r or "login_check" in r or "heartbeat" in r for r in refused[:before]), refused
    assert refused[before:] == [], refused
