"""structlog set-up: JSON lines when stderr is not a terminal (containers, CI), readable
columns when it is. Logs go to stderr so that stdout stays clean for command output
(``replay --format json`` pipes into ``jq``)."""

from __future__ import annotations

import logging
import sys

import structlog


def configure(level: str = "info", *, json: bool | None = None) -> None:
    use_json = not sys.stderr.isatty() if json is None else json
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
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
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    # APScheduler warns through the standard library when a scrape tick is skipped; the
    # daemon counts and logs those itself (scrape_skipped), so only its errors are shown.
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
