"""The plan of one scheduling step, as the model runner and the scheduler's update read it."""

from __future__ import annotations

from dataclasses import dataclass, field

from zerolayer.common.errors import Unavailable
from zerolayer.scheduler.core.request import Request


@dataclass(frozen=True)
class ScheduledRequest:
    """A request fed tokens ``[num_computed_tokens, num_computed_tokens + num_new_tokens)``."""

    request: Request
    num_computed_tokens: int
    num_new_tokens: int
    samples: bool
    """True when this step reaches the request's last token, so a new token is sampled."""


@dataclass
class SchedulerOutput:
    """The plan of one step."""

    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted_request_ids: list[str] = field(default_factory=list)
    failed: dict[str, Unavailable] = field(default_factory=dict)
    """Requests ended this step because the kvstore stayed unusable, by request_id; they are
    no longer in the scheduler (their blocks are released)."""

    @property
    def num_batched_tokens(self) -> int:
        """Tokens fed to the model this step."""
        return sum(s.num_new_tokens for s in self.scheduled)
