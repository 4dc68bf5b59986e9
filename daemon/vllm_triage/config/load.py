"""Loading the settings: ``rules/defaults.yaml``, then the user's ``--config`` file, then
the environment, then command-line flags; and explaining what is wrong when they are.

Later sources win key by key (a nested key overrides only itself):
``VLLM_TRIAGE_SLO__TTFT_P99_SECONDS=1.5`` changes one SLO and keeps the rest of the
file's. Each source is read here, per call, and merged before validation, so the schema
(``config.schema``) sees one mapping and every error names the key (and the file) that is
wrong.
"""

from __future__ import annotations

import difflib
import os
import re
import reprlib
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_settings import EnvSettingsSource, SettingsError

from vllm_triage.config.schema import Settings
from vllm_triage.errors import ConfigError
from vllm_triage.net.redact import quoted, safe_url
from vllm_triage.rules import read_bundled, read_file


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` on top of ``base``, recursing into mappings present in both."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


#: Keys whose values never appear in an error message.
_SECRET_KEYS = frozenset({"bearer_token", "password", "hmac_secret", "headers"})


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The settings model an annotation holds (``X``, ``X | None``, ``list[X]``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, types.UnionType, list, Annotated):
        for arg in get_args(annotation):
            found = _model_of(arg)
            if found is not None:
                return found
    return None


def _keys_at(loc: tuple[int | str, ...]) -> list[str]:
    """The keys the settings model at ``loc`` accepts (list indices skipped)."""
    model: type[BaseModel] | None = Settings
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        field = model.model_fields.get(part)
        model = _model_of(field.annotation) if field is not None else None
    return list(model.model_fields) if model is not None else []


def _did_you_mean(word: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


#: An invalid value is shown this briefly (a list built from YAML aliases can be huge).
_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxtuple, _SHOWN.maxdict = 2, 4, 4, 4
_SHOWN.maxstring = _SHOWN.maxother = 80
#: Errors listed at most; the rest are counted.
_MAX_ERRORS = 20


def _shown(key: tuple[int | str, ...], got: Any) -> str:
    if isinstance(got, str) and key and key[-1] == "url":
        return repr(safe_url(got))  # a target's URL may hold user:password or ?token=
    return _SHOWN.repr(got)


def _without(data: Any, loc: tuple[int | str, ...]) -> Any:
    """``data`` with the key at ``loc`` taken out (a copy; the rest shared)."""
    if not loc:
        return data
    head, rest = loc[0], loc[1:]
    if isinstance(data, Mapping) and head in data:
        if not rest:
            return {k: v for k, v in data.items() if k != head}
        return {**data, head: _without(data[head], rest)}
    if isinstance(data, list) and isinstance(head, int) and 0 <= head < len(data):
        return [_without(v, rest) if i == head else v for i, v in enumerate(data)]
    return data


def _all_errors(data: Mapping[str, Any], exc: ValidationError) -> list[Any]:
    """Every error, in one pass. Pydantic runs a model's own checks (a window shorter
    than the interval, repeated names) only once its fields are valid, so a misspelt key
    would hide them until it is fixed: the settings are validated again without the
    unknown keys, and what that finds is added."""
    errors = list(exc.errors())
    unknown = [tuple(e["loc"]) for e in errors if e["type"] == "extra_forbidden"]
    if not unknown:
        return errors
    cleaned: Any = dict(data)
    for loc in unknown:
        cleaned = _without(cleaned, loc)
    try:
        Settings(**cleaned)
    except ValidationError as again:
        seen = {(tuple(e["loc"]), e["msg"]) for e in errors}
        errors += [e for e in again.errors() if (tuple(e["loc"]), e["msg"]) not in seen]
    return errors


def _describe(
    exc: ValidationError, source: str, data: Mapping[str, Any], unknown_env: list[str]
) -> str:
    lines = [f"invalid settings ({source}):", *unknown_env]
    errors = _all_errors(data, exc)
    if len(errors) > _MAX_ERRORS:
        lines.append(f"  ({len(errors)} errors; the first {_MAX_ERRORS}:)")
    for err in errors[:_MAX_ERRORS]:
        key = quoted(".".join(str(p) for p in err["loc"]), 120) or "(top level)"
        got = err.get("input")
        secret = _SECRET_KEYS.intersection(str(p) for p in err["loc"]) or (
            err["loc"][:1] == ("receivers",) and "url" in err["loc"]
        )
        # An unknown key may be a misspelt secret ("bearer-token"): never echo its value.
        hidden = isinstance(got, dict) or got is None or secret or err["type"] == "extra_forbidden"
        msg = quoted(err["msg"].removeprefix("Value error, "))
        if err["type"] == "extra_forbidden":
            *where, last = err["loc"]
            msg = "unknown key" + _did_you_mean(str(last), _keys_at(tuple(where)))
        # A message that already quotes the value does not repeat it (only short scalars
        # are looked for: a value built from YAML aliases can be huge).
        repeated = isinstance(got, str | int | float) and str(got)[:200] in msg
        shown = "" if hidden or repeated else f" (got {_shown(err['loc'], got)})"
        lines.append(f"  {key}: {msg}{shown}")
    return "\n".join(lines)


def _env_names(model: type[BaseModel], prefix: str) -> tuple[set[str], set[str]]:
    """The ``VLLM_TRIAGE_*`` names ``model`` reads (nested sections with ``__``), and the
    prefixes under which any name is read (a mapping's keys, e.g. ``headers``)."""
    names: set[str] = set()
    open_prefixes: set[str] = set()
    for field_name, field in model.model_fields.items():
        name = f"{prefix}{field_name.upper()}"
        names.add(name)
        nested = _model_of(field.annotation)
        if nested is not None and get_origin(field.annotation) is not list:
            inner, opened = _env_names(nested, f"{name}__")
            names |= inner
            open_prefixes |= opened
        elif get_origin(field.annotation) is dict:
            open_prefixes.add(f"{name}__")
    return names, open_prefixes


#: The variables Kubernetes puts in every container of a pod for each Service of its
#: namespace (``enableServiceLinks``, on by default): ``{SVC}_SERVICE_HOST``,
#: ``{SVC}_SERVICE_PORT[_{PORT NAME}]``, ``{SVC}_PORT`` and ``{SVC}_PORT_{N}_{PROTO}[_...]``.
_SERVICE_LINK = re.compile(
    r"^(?:SERVICE_HOST|SERVICE_PORT(?:_[A-Z0-9_]+)?"
    r"|PORT(?:_\d+_(?:TCP|UDP|SCTP)(?:_(?:PROTO|PORT|ADDR))?)?)$"
)


def service_links(environ: Mapping[str, str]) -> set[str]:
    """The variables of ``environ`` that Kubernetes set for a Service: a Service named
    ``vllm-triage-...`` in the namespace (the fleet's, an example's) gives every pod
    ``VLLM_TRIAGE_..._SERVICE_HOST`` and its kin, which are not settings and must not stop
    a sidecar from starting. Only the kin of a ``{SVC}_SERVICE_HOST`` that is set count,
    so a misspelt setting ending in ``_PORT`` is still refused."""
    hosts = [v.removesuffix("_SERVICE_HOST") for v in environ if v.endswith("_SERVICE_HOST")]
    return {
        var
        for var in environ
        for host in hosts
        if var.startswith(f"{host}_") and _SERVICE_LINK.match(var[len(host) + 1 :])
    }


def unknown_environment() -> list[str]:
    """One line per ``VLLM_TRIAGE_*`` variable no setting reads, with a did-you-mean:
    refused, because a misspelt variable would silently change nothing."""
    prefix = "VLLM_TRIAGE_"
    names, open_prefixes = _env_names(Settings, prefix)
    out = []
    links = service_links(os.environ)
    for var in sorted(os.environ):
        upper = var.upper()
        if not upper.startswith(prefix) or upper in names:
            continue
        if any(upper.startswith(p) for p in open_prefixes) or var in links:
            continue
        out.append(f"  {var}: unknown variable" + _did_you_mean(upper, sorted(names)))
    return out


def _resolve_config_json(section: Mapping[str, Any], folder: Path) -> dict[str, Any]:
    """``section`` with a relative ``model.config_json`` made relative to ``folder``."""
    model = section.get("model")
    cfg_json = model.get("config_json") if isinstance(model, Mapping) else None
    if isinstance(cfg_json, str) and not Path(cfg_json).is_absolute():
        return deep_merge(section, {"model": {"config_json": str(folder / cfg_json)}})
    return dict(section)


def _beside(section: Mapping[str, Any], keys: tuple[str, ...], folder: Path) -> dict[str, Any]:
    """``section`` with each of ``keys`` that is a relative path made relative to ``folder``."""
    out = dict(section)
    for key in keys:
        value = out.get(key)
        if isinstance(value, str) and value and not Path(value).is_absolute():
            out[key] = str(folder / value)
    return out


def _resolve_fleet_config_json(user: Mapping[str, Any], folder: Path) -> dict[str, Any]:
    """``user`` with the relative ``config_json`` of fleet mode's rules and model table,
    and its token and TLS files, made relative to ``folder``, as the top-level one is."""
    prom = user.get("prometheus")
    if not isinstance(prom, Mapping):
        return dict(user)
    prom = _beside(prom, ("bearer_token_file",), folder)
    tls = prom.get("tls")
    if isinstance(tls, Mapping):
        prom["tls"] = _beside(tls, ("ca_file", "cert_file", "key_file"), folder)
    rules = prom.get("servers")
    if isinstance(rules, list):
        prom["servers"] = [
            _resolve_config_json(r, folder) if isinstance(r, Mapping) else r for r in rules
        ]
    table = prom.get("models")
    if isinstance(table, Mapping):
        prom["models"] = {
            name: (
                _resolve_config_json({"model": m}, folder)["model"] if isinstance(m, Mapping) else m
            )
            for name, m in table.items()
        }
    return {**user, "prometheus": prom}


def load_settings(
    config: str | Path | None = None,
    flags: Mapping[str, Any] | None = None,
    *,
    base: Mapping[str, Any] | None = None,
) -> Settings:
    """Defaults from ``rules/``, the user's YAML file on top, then ``VLLM_TRIAGE_*``,
    then ``flags`` (top-level keys from the command line).

    ``base`` replaces defaults under everything the user gives (the demo's scenarios
    bring their own SLOs this way). A relative ``model.config_json`` is resolved against
    the config file's folder.
    """
    merged: dict[str, Any] = deep_merge(read_bundled("defaults.yaml"), base or {})
    source = "rules/defaults.yaml and VLLM_TRIAGE_* variables"
    if config is not None:
        user = read_file(config)
        if user is None:
            user = {}
        if not isinstance(user, Mapping):
            raise ConfigError(f"{config}: expected a mapping of settings at the top level")
        user = _resolve_config_json(user, Path(config).parent)
        user = _resolve_fleet_config_json(user, Path(config).parent)
        targets = user.get("targets")
        if isinstance(targets, list):
            user = {
                **user,
                "targets": [
                    _resolve_config_json(t, Path(config).parent) if isinstance(t, Mapping) else t
                    for t in targets
                ],
            }
        merged = deep_merge(merged, user)
        source = f"{config} over rules/defaults.yaml, and VLLM_TRIAGE_* variables"
    if flags:
        source += ", and command-line flags"
    unknown = unknown_environment()
    try:
        # The environment beats the files and the flags beat both, key by key.
        merged = deep_merge(merged, EnvSettingsSource(Settings)())
        merged = deep_merge(merged, dict(flags or {}))
        settings = Settings(**merged)
    except ValidationError as exc:
        # Unknown variables, unknown keys and bad values are told together, in one pass.
        raise ConfigError(_describe(exc, source, merged, unknown)) from None
    except SettingsError as exc:
        # A VLLM_TRIAGE_* variable that is not valid JSON for a list or mapping; the
        # message names the field, not the value.
        raise ConfigError(f"invalid settings ({source}): {quoted(str(exc))}") from None
    if unknown:
        raise ConfigError(
            "unknown VLLM_TRIAGE_* environment variables (no setting reads them):\n"
            + "\n".join(unknown)
        )
    return settings
