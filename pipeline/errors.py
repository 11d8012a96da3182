"""The error taxonomy. Classified by audience, so the UI layer knows what it may show.

- ``InvalidRequest``: the user's mistake; the message is shown verbatim (it names the field).
- ``RetryLater``: the server's state, not the user's fault: shutting down, or (Ray backend) the
  replicas' line is full, or one user already has ``--max-waiting-per-user`` requests in line,
  or has had ``--quota-images-per-hour`` images in the last hour (``QuotaExceeded``).
  (The local app's full queue is answered by Gradio's queue itself.)
- ``Cancelled``: the caller asked to stop; not an error to report to anyone else.
- ``GenerationFailed``: an internal fault in one job; the user sees a generic message with the id.
- ``OutOfMemory``: a recoverable GPU/CPU memory fault; the user is told to shrink the request.
- ``ReplicaDead``: (Ray backend) the replica running the job died; the others carry on.
- ``ModelProcessDied``: the model process died during the job; the app restarts it, the others wait.
- ``DeviceFailed``: the GPU failed in a way that poisons the process (``engine.device_faults``);
  the model process ends itself and is restarted.
- ``EngineDead``: the model side is gone for good; every waiting job fails at once.
"""

from __future__ import annotations

import time


class ServingError(Exception):
    """Base class: every error this package raises to its callers."""

    #: Whether ``str(error)`` is safe and useful to show to the end user as is.
    user_visible = True


class InvalidRequest(ServingError):
    """A field failed validation. The message names the field and the allowed range."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class RetryLater(ServingError):
    """The request was fine but the server cannot take it now (queue full, shutting down)."""


class ShuttingDown(RetryLater):
    pass


class QueueFull(RetryLater):
    """Admission is bounded: the line for the model is full (Ray Serve's ``max_queued_requests``)."""

    def __init__(self, limit: int | None = None) -> None:
        size = f" ({limit} requests are already waiting)" if limit else ""
        super().__init__(f"The queue is full{size}; please retry in a moment.")


class StorageFull(RetryLater):
    """The disk for the outputs is full: nothing was written (no partial file is left)."""

    def __init__(self) -> None:
        super().__init__("The server's storage is full; please retry later.")


class TooManyWaiting(RetryLater):
    """A per-user cap (``--max-waiting-per-user``): this user already has that many requests in line."""

    def __init__(self, waiting: int) -> None:
        self.waiting = waiting
        requests = "request" if waiting == 1 else "requests"
        super().__init__(f"You already have {waiting} {requests} waiting; please wait for them to finish.")


class QuotaExceeded(RetryLater):
    """A per-identity budget of images per hour (``--quota-images-per-hour``) would be passed."""

    def __init__(self, per_hour: int, used: int, images: int, retry_after: float) -> None:
        self.retry_after = retry_after
        minutes = max(1, round(retry_after / 60))
        at = time.strftime("%H:%M UTC", time.gmtime(time.time() + retry_after))
        asked = f"{images} more image{'s' if images != 1 else ''}"
        super().__init__(
            f"Quota: you have had {used} of your {per_hour} images in the last hour; {asked} fit in "
            f"{minutes} min (at {at})."
        )


class TooManyPictures(RetryLater):
    """The upload route's rate (``web.door.upload_route.UPLOADS_PER_MINUTE``), for pictures sent inline
    to the HTTP APIs (base64, multipart): counted before any of them is decoded."""

    def __init__(self, message: str, retry_after: float) -> None:
        self.retry_after = retry_after
        super().__init__(message)


class Cancelled(ServingError):
    """The job was cancelled by its caller. ``steps_done`` counts the denoising steps it ran."""

    def __init__(self, message: str = "cancelled", steps_done: int = 0) -> None:
        super().__init__(message)
        self.steps_done = steps_done


class GenerationFailed(ServingError):
    """An internal fault during one job. The message is generic and carries the request id."""

    def __init__(self, request_id: str, message: str | None = None) -> None:
        super().__init__(
            message
            or f"Generation failed because of an internal error (request id {request_id}). "
            "Please try again; if it keeps failing, report the request id."
        )
        self.request_id = request_id


class OutOfMemory(GenerationFailed):
    def __init__(self, request_id: str) -> None:
        super().__init__(
            request_id,
            f"Out of memory while generating (request id {request_id}). "
            "Try a smaller width and height, or fewer images.",
        )


class JobTimedOut(GenerationFailed):
    def __init__(self, request_id: str, limit: float) -> None:
        super().__init__(
            request_id,
            f"The job ran past the {limit:g} s time limit and was stopped (request id {request_id}). "
            "Try fewer steps, a smaller size or fewer images.",
        )


class ReplicaDead(GenerationFailed):
    """The replica running (or about to run) the job died; the other replicas carry on."""

    def __init__(self, request_id: str) -> None:
        super().__init__(
            request_id,
            f"The server process running your job stopped (request id {request_id}). "
            "Please try again; another replica will take it.",
        )


class ModelProcessDied(GenerationFailed):
    """The model process died during the job (killed, crashed); the app is starting a new one."""

    def __init__(self, request_id: str) -> None:
        super().__init__(
            request_id,
            f"The model process stopped while running your job (request id {request_id}); "
            "the server is restarting it. Please try again in a minute.",
        )


class DeviceFailed(GenerationFailed):
    """The GPU failed during the job in a way that poisons its process; the model side is being restarted."""

    def __init__(self, request_id: str) -> None:
        super().__init__(
            request_id,
            f"The GPU failed while running your job (request id {request_id}); the model is being "
            "restarted on a fresh process. Please try again in a minute.",
        )


class EngineDead(ServingError):
    """The model thread has stopped; nothing more can run until the app restarts."""


class ModelRefused(ServingError):
    """``--model`` names something this app cannot serve as text-to-image; refused at start, with why."""
