"""The settings' schema: what each key may hold (pydantic models, validated and frozen).

Unknown keys are refused, so a typo never silently falls back to a default. Where the
values come from, and how an error is explained, is ``config.load``. Only the assembly
(``vllm_triage.assemble``) and the commands that load settings read the root
``Settings``; every other part of the daemon is handed the section it needs.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from vllm_triage.ceiling.gpus import find_gpu
from vllm_triage.ceiling.sizing import bytes_per_param
from vllm_triage.config.matchers import parse_matchers
from vllm_triage.core.alerts import RESERVED_LABELS
from vllm_triage.core.parse import (
    DEFAULT_MAX_LABEL_VALUE_LENGTH,
    DEFAULT_MAX_LINE_LENGTH,
    DEFAULT_MAX_LINES,
    DEFAULT_MAX_MODELS,
)
from vllm_triage.errors import ConfigError
from vllm_triage.net.redact import safe_url
from vllm_triage.rules import runtime_table

#: Every section: frozen, unknown keys refused, and no number that is not finite
#: (``inf`` or ``nan`` would pass a ``gt=0`` and break the arithmetic or the scheduler).
_FROZEN = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
#: A duration a person sets (an interval, a window, a timeout, a retry step): at least
#: 50 ms (1e-9 s would make the scheduler spin) and at most a week.
Duration = Annotated[float, Field(ge=0.05, le=7 * 86400)]
#: A latency objective: above zero (an ITL SLO is a few milliseconds), at most an hour.
Latency = Annotated[float, Field(gt=0, le=3600)]


class SloSettings(BaseModel):
    model_config = _FROZEN
    ttft_p99_seconds: Latency
    itl_p99_seconds: Latency
    waiting_requests: float = Field(gt=0)


class IncidentRules(BaseModel):
    model_config = _FROZEN
    open_after: int = Field(ge=1)
    resolve_after: int = Field(ge=1)
    #: Consecutive evaluations another cause must lead, while the open incident's own is
    #: still present, before the incident changes cause (``docs/physics.md``).
    change_cause_after: int = Field(ge=1)
    #: An incident that opens with the cause the last one resolved with, within this
    #: many evaluations of that resolve, is the same condition flapping: it resolves
    #: only after this many clear evaluations in a row (0: off).
    reopen_within: int = Field(ge=0)

    @model_validator(mode="after")
    def _change_not_before_open(self) -> IncidentRules:
        if self.change_cause_after < self.open_after:
            raise ValueError(
                f"change_cause_after ({self.change_cause_after}) cannot be shorter than "
                f"open_after ({self.open_after}): a cause would change faster than an "
                "incident opens"
            )
        return self


class ThresholdSettings(BaseModel):
    model_config = _FROZEN
    min_observations: int = Field(ge=1)
    kv_headroom_requests: float = Field(gt=0)
    kv_usage_full: float = Field(gt=0, le=1)
    queue_share_of_ttft: float = Field(gt=0, lt=1)
    prefill_dominant_share: float = Field(gt=0, lt=1)
    itl_spike_ratio: float = Field(gt=1)
    near_ceiling_ratio: float = Field(gt=0, le=1)
    roofline_impossible_ratio: float = Field(gt=1)
    stall_after_seconds: Duration
    dram_active_busy: float = Field(gt=0, le=1)


class HardwareSettings(BaseModel):
    model_config = _FROZEN
    gpu: str | None = None
    memory_bandwidth_gb_s: float | None = Field(default=None, gt=0)
    tensor_parallel_size: int = Field(default=1, ge=1)
    achievable_fraction: float = Field(default=1.0, gt=0, le=1)
    compute_tflops: float | None = Field(default=None, gt=0)

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, name: str | None) -> str | None:
        # Checked here, so an unknown card is one more line of the same error list.
        if name is not None:
            try:
                find_gpu(name)
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        return name


class ModelSettings(BaseModel):
    model_config = _FROZEN
    parameters_billion: float | None = Field(default=None, gt=0)
    dtype: str = "float16"
    config_json: Path | None = None
    kv_cache_dtype: str | None = None
    kv_bytes_per_token: float | None = Field(default=None, gt=0)
    active_parameters_billion: float | None = Field(default=None, gt=0)
    draft_parameters_billion: float | None = Field(default=None, ge=0)
    draft_dtype: str | None = None
    draft_kv_bytes_per_token: float | None = Field(default=None, ge=0)

    @field_validator("dtype", "kv_cache_dtype")
    @classmethod
    def _known_dtype(cls, name: str | None) -> str | None:
        if name is not None and name.strip().lower() != "auto":
            try:
                bytes_per_param(name)
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        return name

    @model_validator(mode="after")
    def _one_size(self) -> ModelSettings:
        if self.parameters_billion is not None and self.config_json is not None:
            raise ValueError("give parameters_billion or config_json, not both")
        if (
            self.parameters_billion is not None
            and self.active_parameters_billion is not None
            and self.active_parameters_billion > self.parameters_billion
        ):
            raise ValueError("active_parameters_billion exceeds parameters_billion")
        return self


def _not_a_bare_port(value: Any) -> Any:
    """``listen: 9468`` in YAML is a number: say what an address looks like."""
    if isinstance(value, int) and not isinstance(value, bool):
        raise ValueError(
            f"expected host:port, e.g. 0.0.0.0:{value} (a port alone is not an address)"
        )
    return value


def _host_port(text: str) -> str:
    _, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected host:port, e.g. 0.0.0.0:9468, got {text!r}")
    return text


def _http_url(text: str) -> str:
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 (raises for a port that is not a number)
    except ValueError:
        parts = urlsplit("")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected an http:// or https:// URL, got {safe_url(text)!r}")
    return text


def _secret_http_url(secret: SecretStr) -> SecretStr:
    try:
        parts = urlsplit(secret.get_secret_value())
        parts.port  # noqa: B018 (raises for a port that is not a number)
    except ValueError:
        parts = urlsplit("")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("expected an http:// or https:// URL (not shown: it may hold a token)")
    return secret


HttpUrl = Annotated[str, AfterValidator(_http_url)]
#: A receiver's URL is a secret: a Slack incoming-webhook URL is its own credential.
SecretHttpUrl = Annotated[SecretStr, AfterValidator(_secret_http_url)]
ListenAddress = Annotated[str, BeforeValidator(_not_a_bare_port), AfterValidator(_host_port)]
#: Target and receiver names become label values and log fields: keep them plain.
Name = Annotated[
    str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:/@-]*$")
]


class BasicAuth(BaseModel):
    model_config = _FROZEN
    username: str = Field(min_length=1)
    password: SecretStr


class HttpAuth(BaseModel):
    """How the daemon authenticates to something it calls (a target, a receiver)."""

    model_config = _FROZEN
    bearer_token: SecretStr | None = None
    basic_auth: BasicAuth | None = None
    #: Extra request headers; values are secret (API keys travel this way).
    headers: dict[str, SecretStr] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_auth(self) -> HttpAuth:
        if self.bearer_token is not None and self.basic_auth is not None:
            raise ValueError("give bearer_token or basic_auth, not both")
        return self


class ProbeSettings(BaseModel):
    """The active probe of one target (``daemon/vllm_triage/scrape/probe.py``), off unless
    ``enabled``.

    Every ``interval_seconds`` a one-token completion goes to the server's OpenAI API
    (``url``, default: the target's address with the path ``/v1/completions``), one at a
    time, for ``model`` (default: the ``model_name`` its /metrics shows), marked with
    ``user`` and an ``X-Request-Id`` of ``<user>-<n>``. It gives up after
    ``timeout_seconds``. A probe left unanswered while the engine makes no progress is
    evidence of a stall, including the one metrics cannot show: a hung engine whose
    gauges say it is idle. The target's credentials are sent with it.
    """

    model_config = _FROZEN
    enabled: bool = False
    interval_seconds: Duration = 30.0
    timeout_seconds: Duration = 30.0
    url: HttpUrl | None = None
    model: str | None = Field(default=None, min_length=1)
    user: str = Field(default="vllm-triage-probe", min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")


def with_metrics_path(url: str, path: str) -> str:
    """``url`` with ``path`` when it has none (``http://host:8000`` -> ``.../metrics``): a
    named engine's metrics path is the default."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if parts.path not in ("", "/"):
        return url
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, parts.fragment))


def target_name(url: str) -> str:
    """The name a target gets when none is given: its host and port, as ``--target URL``
    names it (never the user:password part of a URL)."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    host = parts.hostname or ""
    return f"{host}:{port}" if port else host


def _not_reserved(labels: dict[str, str]) -> dict[str, str]:
    taken = sorted(set(labels) & RESERVED_LABELS)
    if taken:
        raise ValueError(
            f"{', '.join(taken)}: set by vllm-triage itself; name the server with the labels "
            "Prometheus gives its series (namespace and pod in Kubernetes, or job and instance)"
        )
    return labels


#: A server's identity labels, as Prometheus names the server's series (docs/operations.md,
#: the alert-label contract): added to every alert of the server.
ServerLabels = Annotated[
    dict[
        Annotated[str, Field(pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$")],
        Annotated[str, Field(max_length=1024)],
    ],
    AfterValidator(_not_reserved),
]


class TargetSettings(HttpAuth):
    """One inference server to watch. ``hardware`` and ``model`` replace the top-level
    ones; ``name`` defaults to the URL's host:port.

    ``runtime`` names its serving engine (``vllm``, ``sglang``, ``lmdeploy``, ``trtllm``:
    rules/runtimes/, docs/engines.md); unset, each scrape's families say which it is.
    Named, a scrape of another engine is an error that says so, and a URL without a path
    gets the engine's metrics path (trtllm-serve's is ``/prometheus/metrics``). ``engine``
    is taken for ``runtime`` (in vllm-triage's words an engine is one of vLLM's
    data-parallel ranks, so ``runtime`` is the key written back)."""

    name: Name
    #: Not in repr(): it may hold user:password or a token (shown via ``redact.safe_url``).
    url: HttpUrl = Field(repr=False)
    runtime: str | None = None
    hardware: HardwareSettings | None = None
    model: ModelSettings | None = None
    probe: ProbeSettings = ProbeSettings()
    #: This server's identity labels, over ``alerting.server_labels`` key by key.
    server_labels: ServerLabels = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _default_name(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "name" not in data and isinstance(data.get("url"), str):
            derived = target_name(data["url"])
            if derived:
                return {**data, "name": derived}
        return data

    @model_validator(mode="before")
    @classmethod
    def _runtime_and_its_path(cls, data: Any) -> Any:
        if not isinstance(data, Mapping) or ("engine" not in data and "runtime" not in data):
            return data
        data = dict(data)
        if "engine" in data:
            if "runtime" in data:
                raise ValueError("give runtime (the serving engine), not both runtime and engine")
            data["runtime"] = data.pop("engine")
        name, url = data.get("runtime"), data.get("url")
        if name is None:
            return data
        known = runtime_table()
        if not isinstance(name, str) or known.get(name) is None:
            raise ValueError(
                f"runtime {name!r} is not an engine vllm-triage reads; known: "
                f"{', '.join(known.names)}"
            )
        if isinstance(url, str):
            data["url"] = with_metrics_path(url, known.spec(name).metrics_path)
        return data


LabelName = Annotated[str, Field(pattern=r"^[a-zA-Z_][a-zA-Z0-9_]*$")]
#: PromQL label matchers, ``{namespace="llm", pod=~"llama-.*"}``.
Selector = Annotated[str, Field(default="", pattern=r"^\s*(\{.*\})?\s*$")]


def _matchers(text: str) -> str:
    parse_matchers(text)  # raises ValueError saying what is wrong
    return text


class ShardSettings(BaseModel):
    """This replica's share of the fleet (``docs/deploy.md``, "Shards").

    With ``buckets`` 0 (the default) every replica reads the whole fleet and keeps the
    servers whose stable hash of their name, modulo ``count``, is ``index``. With
    ``buckets`` set, the scrape configuration gives every series a bucket in ``label``
    (Prometheus' ``hashmod`` over the pod, ``vllm-triage render relabel``), and each
    replica asks the query API only for the buckets ``b`` with ``b % count == index``,
    in pieces; series without the label are still divided by the hash of their name.
    Replicas with the same count and the indexes 0 .. count-1 diagnose every server once.
    """

    model_config = _FROZEN
    index: int = Field(default=0, ge=0)
    count: int = Field(default=1, ge=1)
    #: The relabel rule's modulus (0: no server-side sharding). Only ``render relabel``
    #: writes it; which buckets are this replica's is read from the label's values.
    buckets: int = Field(default=0, ge=0, le=65536)
    label: LabelName = "vllm_triage_shard"

    @model_validator(mode="after")
    def _in_range(self) -> ShardSettings:
        if self.index >= self.count:
            raise ValueError(f"index {self.index} must be below count {self.count}")
        if self.buckets and self.count > self.buckets:
            raise ValueError(
                f"count {self.count} is above buckets {self.buckets}: some replicas would "
                "own no bucket (raise buckets, and the relabel rule's modulus with it)"
            )
        return self


class TlsSettings(BaseModel):
    """How the daemon checks the query API's certificate, and the one it shows.

    ``ca_file``: the CAs trusted instead of the system's; ``cert_file`` (and ``key_file``,
    unless the certificate file holds the key): a client certificate, for an API behind
    mutual TLS; ``insecure_skip_verify``: no check at all (a test setup; never in
    production)."""

    model_config = _FROZEN
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    insecure_skip_verify: bool = False

    @model_validator(mode="after")
    def _key_with_cert(self) -> TlsSettings:
        if self.key_file is not None and self.cert_file is None:
            raise ValueError("key_file needs its cert_file (the client certificate)")
        return self


class DcgmSettings(BaseModel):
    """NVIDIA's DCGM exporter series in the same query API: each server's card (its
    ``modelName`` label, looked up in rules/gpus.yaml), its GPU count (as the
    tensor-parallel size) and its memory activity.

    ``join`` maps a label of vLLM's series to the DCGM label holding the same value
    (in Kubernetes, the pod: DCGM's pod mapping labels each GPU with the namespace and
    pod using it; behind a ServiceMonitor without ``honorLabels`` they arrive as
    ``exported_namespace`` and ``exported_pod``).
    """

    model_config = _FROZEN
    enabled: bool = True
    selector: Selector = ""
    join: dict[LabelName, LabelName] = Field(
        default_factory=lambda: {"namespace": "namespace", "pod": "pod"}, min_length=1
    )
    #: A series DCGM exports once per GPU (or MIG instance), always: it lists the GPUs.
    gpu_metric: LabelName = "DCGM_FI_DEV_FB_USED"
    dram_metric: LabelName = "DCGM_FI_PROF_DRAM_ACTIVE"


class ServerRule(BaseModel):
    """Servers whose labels match ``match`` get this hardware and model (first matching
    rule wins; the keys it gives replace what DCGM detected and the defaults)."""

    model_config = _FROZEN
    match: Annotated[str, AfterValidator(_matchers)]
    hardware: HardwareSettings | None = None
    model: ModelSettings | None = None


#: The query APIs fleet mode knows how to read (``docs/deploy.md``, "Backends").
Backend = Literal["auto", "prometheus", "victoriametrics", "thanos", "mimir"]
#: Mimir's (and Cortex's) tenant header.
TENANT_HEADER = "X-Scope-OrgID"


class PrometheusSourceSettings(HttpAuth):
    """Fleet mode: where to read vLLM's series from, instead of scraping each server.

    Any Prometheus-compatible query API (Prometheus, Thanos, Mimir, VictoriaMetrics;
    ``backend`` says which, or ``auto`` asks it). ``selector`` narrows the series (PromQL
    label matchers, e.g. ``{namespace="llm"}``); each distinct combination of
    ``identity_labels`` is one server (a target). Each server's hardware and model: the
    first of ``servers`` whose ``match`` it meets, then what DCGM says (``dcgm``), then
    ``models`` by its ``model_name``, then the top-level ``hardware`` and ``model``.
    """

    url: HttpUrl = Field(repr=False)
    #: ``auto``: asked once (``/api/v1/status/buildinfo``): VictoriaMetrics and Mimir say
    #: who they are; anything else is read as Prometheus (Thanos cannot be told apart:
    #: name it to have its partial answers refused and its replicas deduplicated).
    backend: Backend = "auto"
    #: The tenant, sent as ``X-Scope-OrgID`` (Mimir, Cortex; ``a|b`` federates tenants).
    tenant: str | None = Field(
        default=None, min_length=1, max_length=1024, pattern=r"^[A-Za-z0-9!._*'()|-]+$"
    )
    #: Thanos: the labels that tell an HA pair's replicas apart (sent with ``dedup``).
    replica_labels: list[LabelName] = Field(default_factory=list)
    #: A bearer token read from this file before each tick (a rotated Kubernetes token).
    bearer_token_file: Path | None = None
    tls: TlsSettings = TlsSettings()
    selector: Selector = ""
    identity_labels: list[LabelName] = Field(default=["job", "instance"], min_length=1)
    timeout_seconds: Duration = 10
    shard: ShardSettings = ShardSettings()
    dcgm: DcgmSettings = DcgmSettings()
    servers: list[ServerRule] = Field(default_factory=list)
    models: dict[str, ModelSettings] = Field(default_factory=dict)
    #: Servers judged at most per replica; the rest are counted and logged once. About
    #: 30 KB of memory and 0.65 ms of CPU a tick each (docs/benchmarks.md): 2,000 fit the
    #: StatefulSet's 256 MiB; raise both together.
    max_servers: int = Field(default=2000, ge=1)
    #: Each server's status-page hour keeps one point per this many seconds (the last
    #: evaluation of each step, ``state.History``): 61 points at 60 s, 5 KB a server,
    #: where one per 15 s tick is 17 KB. 0 (or anything up to ``interval_seconds``): a
    #: point per tick.
    history_step_seconds: float = Field(default=60.0, ge=0, le=3600)
    #: A tick whose answers hold fewer rows than this share of the last judged tick's is
    #: read as data missing ("cannot tell": nothing judged) until the lower count has held
    #: ``series_drop_ticks`` ticks in a row; that tick is judged and is the new baseline.
    series_drop_ratio: float = Field(default=0.5, gt=0, lt=1)
    series_drop_ticks: int = Field(default=3, ge=1, le=100)

    @model_validator(mode="after")
    def _one_credential(self) -> PrometheusSourceSettings:
        given = [
            k
            for k, v in (
                ("bearer_token", self.bearer_token),
                ("bearer_token_file", self.bearer_token_file),
                ("basic_auth", self.basic_auth),
            )
            if v is not None
        ]
        if len(given) > 1:
            raise ValueError(f"give one of {', '.join(given)}, not both")
        header = any(k.lower() == TENANT_HEADER.lower() for k in self.headers)
        if self.tenant is not None and header:
            raise ValueError(f"give tenant or a {TENANT_HEADER} header, not both")
        if self.backend == "mimir" and self.tenant is None and not header:
            raise ValueError(
                f"backend mimir needs a tenant on every request: set prometheus.tenant "
                f'(sent as the {TENANT_HEADER} header; Mimir answers 401 "no org id" '
                "without it)"
            )
        if self.replica_labels and self.backend != "thanos":
            raise ValueError(
                f"replica_labels is Thanos' deduplication: set backend: thanos (backend "
                f"{self.backend} does not take it; deduplicate at ingestion there)"
            )
        return self


ReceiverType = Literal["alertmanager_webhook", "alertmanager", "slack"]


class ReceiverSettings(HttpAuth):
    """Where notifications go. ``type`` says the payload:

    - ``alertmanager_webhook``: Alertmanager's webhook payload, version 4;
    - ``alertmanager``: alerts pushed to an Alertmanager's ``/api/v2/alerts`` (give its
      base URL), re-sent every ``resend_seconds`` while they fire;
    - ``slack``: a readable message for a Slack-compatible incoming webhook.
    """

    type: ReceiverType
    url: SecretHttpUrl
    name: Name | None = None
    send_resolved: bool = True
    #: Re-notify an incident that is still firing after this long (Alertmanager's
    #: repeat_interval; its default is 4 h).
    repeat_interval_seconds: Duration = 4 * 3600
    #: ``alertmanager`` only: how often active alerts are re-sent so that Alertmanager
    #: does not expire them (Prometheus re-sends every minute).
    resend_seconds: Duration = 60
    timeout_seconds: Duration = 10
    #: A failed delivery is retried with exponential backoff and jitter for this long,
    #: then counted and logged as failed. Long enough to ride out a receiver restart.
    retry_for_seconds: Duration = 900
    retry_initial_seconds: Duration = 1
    retry_max_seconds: Duration = 60
    #: Notifications waiting for this receiver beyond this many are dropped, oldest
    #: first, each one counted and logged.
    queue_size: int = Field(default=1000, ge=1)
    #: HMAC-SHA256 over the exact body, sent as ``sha256=<hex>`` in ``hmac_header``.
    hmac_secret: SecretStr | None = None
    hmac_header: str = Field(default="X-Vllm-Triage-Signature", min_length=1)


class AlertingSettings(BaseModel):
    model_config = _FROZEN
    #: The ``severity`` label of every alert.
    severity: str = Field(default="warning", min_length=1)
    #: Where people reach this daemon (``externalURL`` and ``generatorURL`` in payloads);
    #: default: http://<listen address>.
    external_url: HttpUrl | None = None
    #: The server's identity labels on every alert, the labels Prometheus gives its series
    #: (the rules' alerts carry them), so that Alertmanager can tell one server's alerts
    #: from another's: the sidecar's namespace and pod (the downward API sets
    #: VLLM_TRIAGE_ALERTING__SERVER_LABELS__NAMESPACE and __POD), or job and instance.
    #: A target's own ``server_labels`` go over these; fleet mode adds each server's
    #: ``identity_labels``.
    server_labels: ServerLabels = Field(default_factory=dict)


#: A recording's bytes per target at most, by default: about a day of one vLLM server with
#: one model scraped every 5 s (vLLM 0.19's /metrics is about 57 KB: 17,280 scrapes a day).
DEFAULT_RECORD_MAX_BYTES = 1024**3


class RecordSettings(BaseModel):
    """``run --record DIR``: the daemon keeps each scrape it takes, in the format
    ``record`` writes, one folder per target (``DIR/<target>/``)."""

    model_config = _FROZEN
    dir: str | None = Field(default=None, min_length=1)
    #: Past this many bytes written (per target), recording stops, logged and counted:
    #: a daemon runs for months and the disk is shared.
    max_bytes: int = Field(default=DEFAULT_RECORD_MAX_BYTES, ge=1024 * 1024)


class Settings(BaseSettings):
    """Everything the core and the daemon need."""

    model_config = SettingsConfigDict(
        env_prefix="VLLM_TRIAGE_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,
    )

    window_seconds: Duration
    slo: SloSettings
    incident: IncidentRules
    thresholds: ThresholdSettings
    hardware: HardwareSettings = HardwareSettings()
    model: ModelSettings = ModelSettings()

    # The daemon (``vllm-triage run``).
    listen: ListenAddress = "0.0.0.0:9468"
    interval_seconds: Duration = 5.0
    #: Default: 80 % of the interval, at most 10 s, so one scrape ends before the next.
    scrape_timeout_seconds: Duration | None = None
    max_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    #: A target exposing more model_name values than this (a misbehaving exporter, a
    #: label used for request ids) keeps its first ones; the rest are counted in
    #: vllm_triage_models_dropped_total and logged, so memory and /metrics stay bounded.
    max_models_per_target: int = Field(default=DEFAULT_MAX_MODELS, ge=1)
    #: What one scrape may cost to read; past any of these the scrape is refused whole and
    #: counted as vllm_triage_scrape_failures_total{reason="too_costly"} (as Prometheus'
    #: sample_limit and label_value_length_limit do), so one target cannot stall the rest.
    max_lines_per_scrape: int = Field(default=DEFAULT_MAX_LINES, ge=100)
    max_line_length: int = Field(default=DEFAULT_MAX_LINE_LENGTH, ge=256)
    max_label_value_length: int = Field(default=DEFAULT_MAX_LABEL_VALUE_LENGTH, ge=64)
    shutdown_grace_seconds: Duration = 10.0
    #: Where open incidents, the notification log and undelivered notifications survive
    #: a restart (one SQLite file; see rules/defaults.yaml). ``auto``: ``vllm-triage run``
    #: keeps them in $XDG_STATE_HOME/vllm-triage, nothing else keeps any; null: none.
    state_dir: str | None = Field(default="auto", min_length=1)
    #: ``scrape``: each of ``targets``; ``prometheus``: every vLLM server that the
    #: ``prometheus`` section's query API knows (fleet mode).
    source: Literal["scrape", "prometheus"] = "scrape"
    prometheus: PrometheusSourceSettings | None = None
    targets: list[TargetSettings] = Field(default_factory=list)
    receivers: list[ReceiverSettings] = Field(default_factory=list)
    alerting: AlertingSettings = AlertingSettings()
    record: RecordSettings = RecordSettings()

    @model_validator(mode="after")
    def _source(self) -> Settings:
        if self.source == "prometheus":
            if self.prometheus is None:
                raise ValueError("source: prometheus needs a `prometheus:` section with its url")
            if self.targets:
                raise ValueError(
                    "source: prometheus discovers its targets; remove `targets` (or use "
                    "source: scrape)"
                )
            if self.record.dir is not None:
                # Fleet mode reads Prometheus' query answers, not /metrics bodies: there
                # would be nothing to keep, and silently keeping nothing is worse.
                raise ValueError(
                    "record.dir (--record) keeps the /metrics bodies the daemon scrapes; "
                    "source: prometheus scrapes none (record each server with "
                    "`vllm-triage record URL --out DIR` instead)"
                )
        return self

    @model_validator(mode="after")
    def _window_holds_scrapes(self) -> Settings:
        if self.window_seconds < self.interval_seconds:
            raise ValueError(
                f"window_seconds ({self.window_seconds:g}) is shorter than interval_seconds "
                f"({self.interval_seconds:g}): the window would hold one scrape, and rates "
                "need two"
            )
        return self

    @model_validator(mode="after")
    def _unique_names(self) -> Settings:
        for kind, names in (
            ("targets", [t.name for t in self.targets]),
            ("receivers", [r.name for r in self.receivers if r.name is not None]),
        ):
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"{kind}: names must be unique, repeated: {', '.join(dupes)}")
        # An unnamed receiver is known by its type and URL: the same one twice would
        # share one queue and log, and hear everything twice.
        unnamed = [
            (r.type, r.url.get_secret_value().rstrip("/")) for r in self.receivers if r.name is None
        ]
        twice = sorted({t for t, u in unnamed if unnamed.count((t, u)) > 1})
        if twice:
            raise ValueError(
                f"receivers: the same {', '.join(twice)} receiver (type and url) is given "
                "twice; remove one, or name each"
            )
        # Two servers under one identity would mute or merge each other's alerts.
        identities = [
            (t.name, tuple(sorted(self.server_labels_of(t).items()))) for t in self.targets
        ]
        for i, (name, labels) in enumerate(identities):
            same = [n for n, other in identities[i + 1 :] if labels and other == labels]
            if same:
                raise ValueError(
                    f"targets {name} and {same[0]} have the same server_labels "
                    f"({', '.join(f'{k}={v}' for k, v in labels)}): give each target its "
                    "own (targets[].server_labels), as Prometheus names each server"
                )
        return self

    def server_labels_of(self, target: TargetSettings) -> dict[str, str]:
        """A target's identity labels: ``alerting.server_labels`` with its own on top."""
        return {**self.alerting.server_labels, **target.server_labels}

    @property
    def scrape_timeout(self) -> float:
        if self.scrape_timeout_seconds is not None:
            return self.scrape_timeout_seconds
        return min(0.8 * self.interval_seconds, 10.0)

    def state_path(self, auto: Path | None) -> Path | None:
        """The state directory in force: ``auto`` is what the caller keeps by default
        (``run``: the XDG state directory; the demo and the tests: nothing)."""
        if self.state_dir is None:
            return None
        if self.state_dir == "auto":
            return auto
        return Path(self.state_dir).expanduser()

    def for_target(self, target: TargetSettings) -> Settings:
        """These settings with the target's own hardware and model, where it gives them."""
        update: dict[str, Any] = {}
        if target.hardware is not None:
            update["hardware"] = target.hardware
        if target.model is not None:
            update["model"] = target.model
        return self.model_copy(update=update) if update else self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Only what the caller hands over: ``config.load`` reads every source itself
        # (defaults, the file, the environment, the flags), merges them in order and
        # passes the result, so no source is read behind its back.
        return (init_settings,)
