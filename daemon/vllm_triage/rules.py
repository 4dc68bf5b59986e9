"""Reading the data files in ``rules/`` (shipped in the package as ``vllm_triage.bundled_rules``).

The GPU table, thresholds, default SLOs and remediation texts are data, not constants in
code, so that users can read and override them (see ``settings``).

Users' files (``--config``, scenario files, a model's ``config.json``) are read by
``read_small_text``: regular files only (a FIFO would block for ever, ``/dev/zero`` never
ends), at most ``MAX_FILE_BYTES``. YAML is loaded by ``BoundedLoader``: at most
``MAX_ALIASES`` aliases, no recursive ones, and at most ``MAX_NODES`` nodes once every
alias is expanded (a ten-line "billion laughs" file otherwise expands into gigabytes in
whatever walks it next: validation, merging, error messages). A syntax error is reported
by line and column, never by quoting the line (it may hold a token).
"""

from __future__ import annotations

import os
import re
import stat
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from vllm_triage.errors import ConfigError

if TYPE_CHECKING:
    from vllm_triage.core.runtime import RuntimeTable

PACKAGE = "vllm_triage.bundled_rules"


def bundled_path(name: str) -> str:
    """A human-readable location of a bundled rules file, for error messages."""
    return f"rules/{name}"


#: A settings, scenario or config.json file larger than this is refused.
MAX_FILE_BYTES = 256 * 1024
MAX_ALIASES = 100
MAX_NODES = 100_000
try:
    from yaml import CSafeLoader as _FastLoader
except ImportError:  # PyYAML built without libyaml
    from yaml import SafeLoader as _FastLoader  # type: ignore[assignment]

#: A quoted name in a YAML error ('...') longer than this is not shown.
_QUOTED_NAME = re.compile(r"'[^']{4,}'")


class BoundedLoader(_FastLoader):  # pyright: ignore[reportGeneralTypeIssues]
    """A safe YAML loader (libyaml's, when PyYAML has it: a megabyte of YAML takes the
    pure-Python loader most of a minute) that refuses alias bombs and recursive aliases
    before anything is built from the document."""

    def get_single_node(self) -> yaml.Node | None:
        node = super().get_single_node()
        if node is not None:
            _check_expansion(node)
        return node


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_expansion(root: yaml.Node) -> None:
    """Count the nodes of the document with every alias expanded (a shared node counted
    once per use) without expanding anything; refuse more than ``MAX_ALIASES`` uses of
    shared nodes, more than ``MAX_NODES`` in all, or a node that contains itself."""
    size: dict[int, int] = {}
    open_: set[int] = set()
    aliases = 0
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            open_.discard(key)
            total = 1 + sum(size[id(c)] for c in _children(node))
            if total > MAX_NODES:
                raise ConfigError(
                    f"more than {MAX_NODES} values once its aliases are expanded; refused"
                )
            size[key] = total
            continue
        if key in open_:
            raise ConfigError("a YAML alias refers to the node that holds it; refused")
        if key in size:
            aliases += 1
            if aliases > MAX_ALIASES:
                raise ConfigError(f"more than {MAX_ALIASES} YAML aliases (*name); refused")
            continue
        open_.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node))


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """What is wrong and where, without the text of the line (it may hold a secret): the
    line and column of the problem and, when PyYAML gives one, of what it was inside."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return type(exc).__name__
    mark, start = exc.problem_mark, exc.context_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    what = str(exc.problem or "syntax error")
    if exc.context:
        inside = f" at line {start.line + 1}, column {start.column + 1}" if start else ""
        what += f" ({exc.context}{inside})"
    return where + _QUOTED_NAME.sub("'...'", what)[:200]


def read_yaml_text(text: str, *, source: str) -> Any:
    """Parse YAML text; a syntax error becomes a ``ConfigError`` naming ``source`` and the
    line (PyYAML would say ``<unicode string>``: it was handed the text, not the file)."""
    try:
        return yaml.load(text, Loader=BoundedLoader)  # a SafeLoader, bounded
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {_yaml_problem(exc)}") from None
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply; refused") from None


def read_small_text(path: str | Path, *, max_bytes: int = MAX_FILE_BYTES) -> str:
    """A user's text file, read only if it is a regular file of at most ``max_bytes``;
    anything else is a ``ConfigError`` naming the path."""
    p = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer before it can be refused.
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{p}: not a regular file; refused")
        if info.st_size > max_bytes:
            raise ConfigError(f"{p}: {info.st_size} bytes, more than {max_bytes}; refused")
        chunks, size = [], 0
        while size <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            raise ConfigError(f"{p}: more than {max_bytes} bytes; refused")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not UTF-8 text (byte {exc.start})") from None


def _source_tree_rules() -> Path:
    """``rules/`` beside ``daemon/`` in a source checkout that was never installed."""
    return Path(__file__).resolve().parents[2] / "rules"


def _locate(name: str) -> Traversable:
    """A file or folder of the bundled ``rules/``.

    Installed, the files are the package ``vllm_triage.bundled_rules``; run from a source
    checkout that was never installed (``python -m pytest`` in the repository), they
    are the checkout's ``rules/`` folder.
    """
    try:
        return resources.files(PACKAGE).joinpath(name)
    except ModuleNotFoundError:
        return _source_tree_rules() / name


def _missing(name: str, exc: OSError) -> ConfigError:
    return ConfigError(f"{bundled_path(name)}: missing ({exc}); reinstall vllm-triage")


def read_bundled(name: str) -> Any:
    """Load one YAML file from the bundled ``rules/``."""
    try:
        text = _locate(name).read_text(encoding="utf-8")
    except OSError as exc:
        raise _missing(name, exc) from exc
    return read_yaml_text(text, source=bundled_path(name))


def list_bundled(folder: str, suffix: str = ".yaml") -> tuple[str, ...]:
    """The names (without ``suffix``) of the files in a folder of the bundled ``rules/``."""
    try:
        entries = [(e.name, e.is_file()) for e in _locate(folder).iterdir()]
    except OSError as exc:
        raise _missing(folder, exc) from exc
    return tuple(
        sorted(n.removesuffix(suffix) for n, is_file in entries if is_file and n.endswith(suffix))
    )


def read_file(path: str | Path) -> Any:
    """Load one user YAML file; unreadable files become a ``ConfigError`` naming the path."""
    return read_yaml_text(read_small_text(path), source=str(path))


#: The bundled runtime specs' folder, and the order detection tries them in (vLLM first:
#: the reference, and most targets).
RUNTIMES = "runtimes"
RUNTIME_ORDER = ("vllm", "sglang", "lmdeploy", "trtllm")


@cache
def runtime_documents() -> tuple[tuple[str, Any], ...]:
    """The bundled runtime specs as read (``rules/runtimes/*.yaml``), in detection order:
    ``(where, document)``. The simulator speaks their dialects from these."""
    names = list_bundled(RUNTIMES)
    ordered = [n for n in RUNTIME_ORDER if n in names]
    ordered += [n for n in names if n not in RUNTIME_ORDER]
    files = [f"{RUNTIMES}/{n}.yaml" for n in ordered]
    return tuple((bundled_path(f), read_bundled(f)) for f in files)


@cache
def runtime_table() -> RuntimeTable:
    """The serving engines vllm-triage reads (``rules/runtimes/*.yaml``), as the core's
    shapes: read once, the same table everywhere."""
    from vllm_triage.core.runtime import RuntimeTable  # noqa: PLC0415 (rules/ stays a leaf)

    return RuntimeTable.of(runtime_documents())
