"""PromQL label matchers (``{namespace="llm", pod=~"llama-.*"}``), parsed and applied to
one server's labels, with Prometheus' semantics: ``=``, ``!=``, ``=~`` and ``!~``; a
regular expression must match the whole value; a label the server lacks reads as "".

Fleet mode's ``prometheus.servers`` rules use them to give servers their hardware and
model; ``prometheus.selector`` and ``prometheus.dcgm.selector`` are checked with them
before they are put into a query.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

Op = Literal["=", "!=", "=~", "!~"]
LABEL_NAME = r"[a-zA-Z_][a-zA-Z0-9_]*"
_MATCHER = re.compile(rf'\s*({LABEL_NAME})\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
_ESCAPES = re.compile(r"\\(.)")
_ESCAPED = {"n": "\n", "\\": "\\", '"': '"', "t": "\t"}
_OPS: dict[str, Op] = {"=": "=", "!=": "!=", "=~": "=~", "!~": "!~"}


@dataclass(frozen=True, slots=True)
class Matcher:
    label: str
    op: Op
    value: str
    regex: re.Pattern[str] | None = None

    def matches(self, labels: Mapping[str, str]) -> bool:
        got = labels.get(self.label, "")
        if self.op == "=":
            return got == self.value
        if self.op == "!=":
            return got != self.value
        assert self.regex is not None
        found = self.regex.fullmatch(got) is not None
        return found if self.op == "=~" else not found


def parse_matchers(text: str) -> tuple[Matcher, ...]:
    """``{a="x", b=~"y.*"}`` (braces optional, may be empty) as matchers; ``ValueError``
    saying what is wrong otherwise."""
    inner = text.strip()
    if inner.startswith("{"):
        if not inner.endswith("}"):
            raise ValueError(f"unclosed label matchers: {text!r}")
        inner = inner[1:-1]
    out: list[Matcher] = []
    pos = 0
    inner = inner.strip()
    while pos < len(inner):
        m = _MATCHER.match(inner, pos)
        if m is None:
            raise ValueError(
                f'expected label matchers like {{namespace="llm", pod=~"llama-.*"}}, got {text!r}'
            )
        label, op, raw = m.group(1), _OPS[m.group(2)], m.group(3)
        value = _ESCAPES.sub(lambda e: _ESCAPED.get(e.group(1), e.group(1)), raw)
        regex = None
        if op in ("=~", "!~"):
            try:
                regex = re.compile(value)
            except re.error as exc:
                raise ValueError(f"{label}{op}{value!r}: not a regular expression: {exc}") from None
        out.append(Matcher(label=label, op=op, value=value, regex=regex))
        pos = m.end()
    return tuple(out)


def matches_all(matchers: tuple[Matcher, ...], labels: Mapping[str, str]) -> bool:
    return all(m.matches(labels) for m in matchers)
