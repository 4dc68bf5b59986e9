"""The project's exceptions, in one small tree.

    TriageError                 base of everything vllm-triage raises on purpose
    ├── ParseError              the target sent something that is not readable vLLM /metrics
    │   ├── TooCostlyError      ... or something that would cost too much to read
    │   └── UnjudgeableError    ... or read, but judging it raised (a bug its data found)
    ├── ConfigError             a settings or rules file is wrong (names the file and key)
    ├── RecordingError          a recording directory cannot be replayed
    └── ScrapeError             a target could not be fetched (dead, slow, non-2xx)

Whose fault it is decides the handling: a ``ParseError`` or ``ScrapeError`` is the
target's (log it with the target's name, count it, carry on); a ``ConfigError`` is the
user's (refuse to start, say which key); anything else is a bug of ours and is not caught,
except where one target's data is judged (``core.drive.Driver.feed``,
``target.Target``): there a bug that target's data found is that target's failure
(``UnjudgeableError``, reason ``evaluate``: counted, logged once, its place in the
traceback kept), and the other targets are judged as if it were not there.
"""

from __future__ import annotations

import traceback

#: A message from an exception carries at most this much of its text.
_MESSAGE_CHARS = 300


class TriageError(Exception):
    """Base class for every error vllm-triage raises on purpose."""


class ParseError(TriageError):
    """The exposition text cannot be read as vLLM metrics.

    ``line`` is the 1-based line number where reading stopped, when one applies.
    """

    def __init__(self, message: str, *, line: int | None = None) -> None:
        self.line = line
        super().__init__(f"line {line}: {message}" if line is not None else message)


class TooCostlyError(ParseError):
    """The body would cost more to read than one scrape may (too many lines, a line or
    a label value too long): refused whole, counted under its own reason."""


class UnjudgeableError(ParseError):
    """A body (or a fleet server's signals) that was read but could not be judged: the
    core raised on its data. ``where`` is the innermost frame, for the bug report."""

    def __init__(self, message: str, *, where: str = "") -> None:
        self.where = where
        super().__init__(message)

    @classmethod
    def of(cls, exc: BaseException) -> UnjudgeableError:
        """``exc`` (raised while judging) as the target's failure: its type, the start of
        its text and the innermost frame, never the whole traceback."""
        frames = traceback.extract_tb(exc.__traceback__)
        where = f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else ""
        text = str(exc)[:_MESSAGE_CHARS]
        return cls(
            f"judging it failed: {type(exc).__name__}: {text}"
            + (f" (at {where})" if where else ""),
            where=where,
        )


class ConfigError(TriageError):
    """A settings or rules file is wrong; the message names the file and the key."""


class RecordingError(TriageError):
    """A recording directory is missing, empty or unreadable."""


class ScrapeError(TriageError):
    """A target could not be fetched: refused, timed out, or answered non-2xx.

    ``reason`` is a short, fixed word for metrics labels: ``timeout``, ``connect``,
    ``http_status``, ``too_large``, ``encoding`` (a compression refused), ``redirect`` (to
    another origin, or too many) or ``http_error``.
    """

    def __init__(
        self, message: str, *, reason: str = "http_error", status: int | None = None
    ) -> None:
        self.reason = reason
        #: The HTTP status, for ``http_status``.
        self.status = status
        super().__init__(message)
