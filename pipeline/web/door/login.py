"""The login, as the front door checks it on every route: which credentials open what, metered.

Under ``--auth`` a request may carry its login as Gradio's cookie (set by the login form), as
``Authorization: Basic`` or ``Bearer user:password`` (programs), and ``/metrics`` also takes the
``--metrics-token`` as a bearer token. Every *failed* check of a credential, whatever the route or
header, takes from the identity's budget of failed logins (``admission.LoginMeter``); past it the
door answers 429 with ``Retry-After`` before it compares anything. Pure functions and one
dataclass; the meter is the event loop's.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
from dataclasses import dataclass, field

from .admission import LoginMeter

log = logging.getLogger(__name__)

# The front door's answer to "which --auth user is this", in the request's scope state (``frontdoor``
# sets it; the HTTP APIs read it).
LOGIN_STATE = "t2i_login"

SCHEMES = ("basic", "bearer")  # the Authorization schemes that carry a credential here


def _entered_backoff(identity: str, seconds: float) -> None:
    log.warning("failed logins from %s: past the budget, backing off %.0f s", identity, seconds)


@dataclass
class Login:
    """The app's one user and password, the metrics token, and the meter of failed checks."""

    auth: tuple[str, str] | None
    metrics_token: str | None = None
    meter: LoginMeter = field(default_factory=lambda: LoginMeter(on_backoff=_entered_backoff))

    def user_of(self, header: str) -> str | None:
        """The user an ``Authorization`` header logs in (Basic, or Bearer ``user:password``); None if none."""
        if self.auth is None:
            return None
        pair = _user_password(header)
        if pair is None:
            return None
        user, password = pair
        return user if hmac.compare_digest(f"{user}:{password}".encode(), ":".join(self.auth).encode()) else None

    def opens_metrics(self, header: str) -> bool:
        """Whether the header opens ``/metrics``: the login, or the metrics token as a bearer token."""
        if self.auth is None:
            return True
        scheme, _, value = header.partition(" ")
        token = self.metrics_token
        if scheme.lower() == "bearer" and token and hmac.compare_digest(value.strip().encode(), token.encode()):
            return True
        return self.user_of(header) is not None


def presents_credential(header: str) -> bool:
    """Whether an ``Authorization`` header tries to log in (a Basic or Bearer credential)."""
    return header.partition(" ")[0].lower() in SCHEMES


def _user_password(header: str) -> tuple[str, str] | None:
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "basic":
        try:
            value = base64.b64decode(value.strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            return None
    elif scheme.lower() != "bearer":
        return None
    user, _, password = value.strip().partition(":")
    return user, password
