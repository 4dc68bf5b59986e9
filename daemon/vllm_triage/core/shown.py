"""A peer's text as a person reads it: shown, never obeyed.

Model names, engine labels and cache settings are a peer's strings (anyone's
``--served-model-name``, any tenant's pod in fleet mode), and they reach Slack, the
Alertmanager annotations, a terminal and the logs. Each place obeys its own markup, so
each gets its own escaping here:

- ``one_line``: for a reader whose markup is unknown (Alertmanager's annotations go on to
  receivers of any kind, a terminal obeys escape sequences): control characters (a
  newline would start a line of the name's choosing; ESC drives a terminal) shown as
  their escapes (``\\n``, ``\\x1b``), the text cut to a length;
- ``slack``: Slack's mrkdwn (and Mattermost's, Rocket.Chat's): ``&``, ``<`` and ``>``
  as entities (``<!channel>`` pings everyone, ``<http://x|text>`` is a link with any
  text), the code-span delimiter replaced (a backtick would end the span around a
  name), ``@`` kept from forming a mention, and on one line.

Markup of one's own (the message's bold headline, its link) is added after escaping.
"""

from __future__ import annotations

import re

#: C0 and C1 control characters and Unicode's line and paragraph separators: what ends a
#: line or drives a terminal.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
#: A backtick ends a Slack code span; the modifier letter grave accent looks the same.
_BACKTICK = "\u02cb"
#: Between "@" and a name, a word joiner keeps Mattermost and Rocket.Chat from reading a
#: mention (``@channel``, ``@all``); it shows as nothing.
_AT = "@\u2060"
_SLACK = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "`": _BACKTICK, "@": _AT})


def _escape(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


def one_line(text: str, limit: int | None = None) -> str:
    """``text`` on one line, each control character shown as its escape, and cut to
    ``limit`` characters (the last one an ellipsis) when it is longer."""
    shown = _CONTROL.sub(_escape, text)
    if limit is not None and len(shown) > limit:
        return shown[: limit - 1] + "…"
    return shown


def slack(text: str) -> str:
    """``text`` as Slack's mrkdwn shows it and never obeys it (the module's note)."""
    return one_line(text).translate(_SLACK)


def slack_code(text: str) -> str:
    """``text`` in a Slack code span it cannot leave."""
    return f"`{slack(text)}`"
