"""Typed domain errors: what went wrong, in words that name the offending field.

Domain code raises these and knows nothing of gRPC; the server edge
(:mod:`zerolayer.common.status`) maps each class to its status code in one table.
"""

from __future__ import annotations


class ZerolayerError(Exception):
    """Base class of the errors a layer answers on purpose (INTERNAL unless a subclass says)."""

    reason: str = ""
    """A machine-readable reason a caller can act on (e.g. ``owner-lease-expired``), sent beside
    the status as trailing metadata ``zerolayer-reason``; empty: none (the status says it all)."""


class InvalidArgument(ZerolayerError):
    """A request field is invalid. The message starts with the field name."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field


class NotFound(ZerolayerError):
    """A named thing (model, request) does not exist."""


class ResourceExhausted(ZerolayerError):
    """Not enough of a resource (KV blocks, queue slots) right now."""


class Unavailable(ZerolayerError):
    """A layer this request needs is down or not serving."""


class Unauthenticated(ZerolayerError):
    """The caller is not identified where it must be (no or an unknown credential); the message
    says what is missing and never quotes the credential."""


class FailedPrecondition(ZerolayerError):
    """The system is not in a state where the call can run (e.g. arena geometry mismatch)."""


class SchedulerLost(Unavailable):
    """The scheduler carrying a request could not be reached or went away mid-call (it did not
    answer the error itself): the frontend may continue the request on another scheduler."""

    def __init__(self, message: str, carrying: bool) -> None:
        super().__init__(message)
        self.carrying = carrying
        """True when the scheduler may have had the request (the call was sent on a connected
        channel, or answered): it died while carrying it. False: the request never reached it."""
