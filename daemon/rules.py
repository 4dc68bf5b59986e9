"""Reading the data files in ``rules/`` (shipped inside the package as ``daemon.bundled_rules``).

The GPU table, thresholds, default SLOs and remediation texts are data, not constants in
code, so that users can read and override them (see ``settings``).
"""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import yaml

from daemon.errors import ConfigError

PACKAGE = "daemon.bundled_rules"


def bundled_path(name: str) -> str:
    """A human-readable location of a bundled rules file, for error messages."""
    return f"rules/{name}"


def read_yaml_text(text: str, *, source: str) -> Any:
    """Parse YAML text; a syntax error becomes a ``ConfigError`` naming ``source`` and the
    line (PyYAML would say ``<unicode string>``: it was handed the text, not the file)."""
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark, start = exc.problem_mark, exc.context_mark
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        what = exc.problem or "a syntax error"
        if exc.context and start is not None:
            what += f" ({exc.context} at line {start.line + 1}, column {start.column + 1})"
        raise ConfigError(f"{source}{where}: not valid YAML: {what}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc


def _source_tree_rules() -> Path:
    """``rules/`` beside ``daemon/`` in a source checkout that was never installed."""
    return Path(__file__).resolve().parent.parent / "rules"


def _locate(name: str) -> Traversable:
    """A file or folder of the bundled ``rules/``.

    Installed, the files are the package ``daemon.bundled_rules``; run from a source
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
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not UTF-8 text: {exc}") from exc
    return read_yaml_text(text, source=str(p))
