"""structlog set-up: JSON lines when stderr is not a terminal (containers, CI), readable
columns when it is. Logs go to stderr so that stdout stays clean for command output
(``replay --format json`` pipes into ``jq``).

On the console an incident reads as people read one: a headline (FIRING or RESOLVED, the
cause, the target and model, the one-line summary), then its numbers as ``key=value``
lines, wrapped. JSON lines carry the same fields as always. Colour only on a terminal,
and never when ``NO_COLOR`` is set (https://no-color.org).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import textwrap
import time
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any, TextIO

import structlog

#: The events ``watcher`` logs for incident transitions.
INCIDENT_EVENTS = frozenset({"incident_firing", "incident_resolved"})
WIDTH = 100
RED, GREEN, BOLD, RESET = "\x1b[31m", "\x1b[32m", "\x1b[1m", "\x1b[0m"


def use_color(stream: TextIO) -> bool:
    """Colour for a terminal, unless the user said NO_COLOR (any non-empty value)."""
    return stream.isatty() and not os.environ.get("NO_COLOR")


def _value(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def key_values(fields: Mapping[str, Any], *, indent: str = "    ") -> list[str]:
    """``key=value`` pairs, wrapped to lines of at most ``WIDTH`` characters."""
    pairs = " ".join(f"{k}={_value(v)}" for k, v in fields.items() if v is not None)
    if not pairs:
        return []
    return textwrap.wrap(
        pairs,
        width=WIDTH,
        initial_indent=indent,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )


#: What a terminal obeys: control characters (ESC starts its escape sequences, a newline
#: a line of the text's choosing) and Unicode's line and paragraph separators.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _shown(value: Any) -> Any:
    """A field's value as a terminal shows it and never obeys it: control characters in
    its strings (a peer's model or engine name) as their escapes (``\\x1b``)."""
    if isinstance(value, str):
        return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), value)
    if isinstance(value, Mapping):
        return {k: _shown(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_shown(v) for v in value]
    return value


class ConsoleWithIncidents:
    """structlog's console renderer, except for incident transitions (see the module).
    Every string a field holds is shown with its control characters escaped."""

    def __init__(self, *, colors: bool) -> None:
        self.colors = colors
        self.inner = structlog.dev.ConsoleRenderer(colors=colors)

    def _paint(self, text: str, color: str) -> str:
        return f"{BOLD}{color}{text}{RESET}" if self.colors else text

    def __call__(self, logger: Any, name: str, event_dict: MutableMapping[str, Any]) -> str:
        event_dict = {k: v if k == "exception" else _shown(v) for k, v in event_dict.items()}
        if event_dict.get("event") not in INCIDENT_EVENTS:
            return str(self.inner(logger, name, event_dict))
        fields = dict(event_dict)
        firing = fields.pop("event") == "incident_firing"
        word = self._paint("FIRING  ", RED) if firing else self._paint("RESOLVED", GREEN)
        when = fields.pop("timestamp", "")
        level = fields.pop("level", "info")
        cause = fields.pop("diagnosis", "?")
        target = fields.pop("target", "?")
        model = fields.pop("model_name", "") or "(no model_name)"
        summary = fields.pop("summary", "") or ""
        evidence = fields.pop("evidence", None) or {}
        if not firing:  # a resolved incident's confidence is that of a clear evaluation
            fields.pop("confidence", None)
        head = f"{when} [{level:<7}] {word} {cause} on {target} ({model})"
        lines = [f"{head}: {summary}" if firing and summary else head]
        lines.extend(key_values(fields))
        lines.extend(key_values(evidence))
        return "\n".join(lines)


def configure(
    level: str = "info", *, json: bool | None = None, stream: TextIO | None = None
) -> None:
    out = stream or sys.stderr
    use_json = not out.isatty() if json is None else json
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if use_json
        else ConsoleWithIncidents(colors=use_color(out))
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
        ),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    # APScheduler warns through the standard library when a scrape tick is skipped; the
    # daemon counts and logs those itself (scrape_skipped), so only its errors are shown.
    logging.getLogger("apscheduler").setLevel(logging.ERROR)


class Chorus:
    """What many parts would each log in one pass (a fleet's servers in one tick), said
    together: it takes their lines as a logger would (``warning``, ``info``, ``error``)
    and ``say`` writes one line per event with how many said it and the first few, so
    2,000 servers failing alike, or discovered at once, make one line, not 2,000."""

    #: The parts a line names in full; the rest are counted.
    FIRST = 5

    def __init__(self) -> None:
        self._lines: dict[tuple[str, str], list[dict[str, Any]]] = {}

    def _keep(self, level: str, event: str, fields: dict[str, Any]) -> None:
        self._lines.setdefault((level, event), []).append(fields)

    def info(self, event: str, **fields: Any) -> None:
        self._keep("info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._keep("warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._keep("error", event, fields)

    def say(self, logger: Any) -> int:
        """Write what was kept, one line per (level, event), and forget it; the lines."""
        for (level, event), said in self._lines.items():
            if len(said) == 1:
                getattr(logger, level)(event, **said[0])
            else:
                getattr(logger, level)(event, parts=len(said), first=said[: self.FIRST])
        written = len(self._lines)
        self._lines.clear()
        return written


#: A condition that repeats (a dead target, an unanswered probe, a series that is always
#: NaN) logs its first occurrence at once, then one line per this many seconds.
REPEAT_LOG_EVERY_S = 60.0


class Throttle:
    """Rate-limits the log lines of one repeating condition, counting what it held back.

    ``due(reason)`` says whether to log now: the first time, whenever ``reason`` changes
    (a timeout, then a redirect: new news), and once every ``every_s`` seconds; otherwise
    it counts one held back. ``held`` is how many were held back since the last line.
    ``clear()`` ends the condition: it returns ``held`` if a line was logged since it
    began (so the caller can log that it recovered), else None.
    """

    def __init__(
        self,
        every_s: float = REPEAT_LOG_EVERY_S,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every_s = every_s
        self.held = 0
        self._clock = clock
        self._logged_at: float | None = None
        self._reason = ""

    def due(self, reason: str = "") -> bool:
        now = self._clock()
        changed = reason != self._reason
        self._reason = reason
        if self._logged_at is None or changed or now - self._logged_at >= self.every_s:
            return True
        self.held += 1
        return False

    def logged(self) -> None:
        """The line ``due`` allowed was written: the held-back count starts again."""
        self._logged_at, self.held = self._clock(), 0

    def clear(self) -> int | None:
        held = self.held if self._logged_at is not None else None
        self._logged_at, self.held, self._reason = None, 0, ""
        return held

    def warn(
        self,
        logger: Any,
        event: str,
        *,
        key: str = "",
        count: str | None = "failures_since_last_log",
        **fields: Any,
    ) -> None:
        """One occurrence: a warning line with ``fields`` when one is ``due(key)``, with
        how many occurrences it stands for under ``count`` (this one and those held back;
        None: no count), else one more held back."""
        if not self.due(key):
            return
        if count is not None:
            fields[count] = self.held + 1
        logger.warning(event, **fields)
        self.logged()

    def recovered(self, logger: Any, event: str, **fields: Any) -> None:
        """The condition is over: an info line with how many lines were held back since
        the last one (``suppressed``), if it was ever logged; nothing otherwise."""
        held = self.clear()
        if held is not None:
            logger.info(event, **fields, suppressed=held)
