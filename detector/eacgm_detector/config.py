"""The detector's one typed configuration object.

Loading follows the convention of otel_eacgm.settings, shared with the agent: flag >
environment (OTEL_EACGM_DETECTOR_<KEY>, e.g. OTEL_EACGM_DETECTOR_BEARER_TOKEN for the secret) >
config file > default; unknown keys and bad values raise ConfigError (a ValueError) naming the
key, the value and what was expected. ``validate()`` checks types too, for an object built
directly: a string where a number belongs must be an error that names the key, not a
``TypeError`` deep in the service.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import ClassVar

from eacgm_detector.context import DEFAULT_CONTEXT_WINDOWS, check_windows
from eacgm_detector.features import DEFAULT_EXCLUDED_METRICS
from eacgm_detector.model import COVARIANCE_TYPES, MAX_FIT_WINDOWS, THRESHOLD_METHODS
from otel_eacgm import environment_variables as env_vars
from otel_eacgm.settings import SECRET, ConfigError, Settings

__all__ = ["BEARER_TOKEN_ENV", "ConfigError", "DetectorConfig", "loopback"]

BEARER_TOKEN_ENV = env_vars.OTEL_EACGM_DETECTOR_BEARER_TOKEN
"""Environment variable that sets ``bearer_token`` (kept out of config files and command lines)."""


@dataclass
class DetectorConfig(Settings):
    """Detector settings; each field is a YAML key of the same name."""

    ENV_PREFIX: ClassVar[str] = env_vars.OTEL_EACGM_DETECTOR_PREFIX

    listen: str = "127.0.0.1:4319"
    """host:port the OTLP gRPC receiver binds, exclusively (a second detector on it fails to
    start); localhost unless set otherwise. Off loopback it needs TLS or bearer_token, or
    insecure_listen."""
    insecure_listen: bool = False
    """Let ``serve`` bind a non-loopback listen address in plaintext without bearer_token
    (anyone who reaches the port can feed it); it warns. Without it such a bind is refused."""
    tls_cert_file: str | None = None
    """PEM server certificate; with tls_key_file (both or neither: TLS off)."""
    tls_key_file: str | None = None
    """PEM private key of tls_cert_file."""
    bearer_token: str | None = field(default=None, metadata=SECRET)
    """When set, every RPC must carry ``authorization: Bearer <token>``, else UNAUTHENTICATED.
    Prefer the environment variable OTEL_EACGM_DETECTOR_BEARER_TOKEN; use with TLS off loopback."""
    export_endpoint: str | None = None
    """OTLP gRPC endpoint (host:port) for anomaly logs, score gauges and annotated spans;
    None sends nothing (``serve`` falls back to OTEL_EXPORTER_OTLP_ENDPOINT)."""
    export_insecure: bool = True
    """Send to export_endpoint in plaintext; false uses TLS."""
    export_ca_file: str | None = None
    """PEM CA bundle to verify the export endpoint when export_insecure is false."""
    instance_id: str | None = None
    """Names this replica on its anomaly logs and score gauges (resource attribute
    ``service.instance.id``), so a backend shows which replica of a scale-out scored an entity;
    None leaves it off."""
    reexport_spans: bool = True
    """Re-export received spans, annotated with eacgm.anomaly[.score], to export_endpoint."""
    max_request_bytes: int = 4 * 1024 * 1024
    """Requests larger than this get RESOURCE_EXHAUSTED; gRPC itself refuses messages over
    twice this (compressed ones by their decompressed size) before reading them whole."""
    queue_size: int = 64
    """Decoded requests waiting for the scoring thread; beyond it callers get UNAVAILABLE
    (OTLP's retryable back-pressure signal) instead of memory growing."""
    max_queued_bytes: int = 32 * 1024 * 1024
    """Estimated memory of the decoded requests waiting for the scoring thread (512 bytes a
    span or point, plus the spans kept for re-export); a request that would pass it gets
    RESOURCE_EXHAUSTED with a 1 s RetryInfo (OTLP's throttling answer, which exporters retry),
    counted in ``<signal>.refused_memory``. One request is always let in when none waits.

    Memory bound: what ``serve`` holds of received data is about max_queued_bytes +
    max_window_bytes, plus the requests being read (4 at a time, each at most 2 x
    max_request_bytes) and the one being decoded (up to ~15x its size for small spans), plus
    what the allocator keeps: 400 MB above its idle RSS with the defaults. Measured: a client
    keeping 8 requests of 3 MB in flight for 20 s (spans of 24 entities, counter points of a
    new series each) took serve from 152 MB to at most 409 MB RSS in four runs
    (tests/reliability/test_detector_memory.py); without these bounds it passed 950 MB within
    seconds and kept growing (3.1 GB with spans of one entity)."""
    window_s: float = 10.0
    """Window length, seconds (at most 86400)."""
    grace_s: float = 5.0
    """Late data is accepted this long after a window's end, seconds."""
    entity_attributes: list[str] = field(
        default_factory=lambda: ["host.name", "process.pid", "eacgm.rank", "hw.id"])
    """Resource attributes that make up an entity, in order; absent ones are skipped."""
    warmup_windows: int = 60
    """Windows an entity collects before its first fit (>= 10)."""
    refit_every: int = 100
    """Refit after this many more unflagged windows."""
    history_windows: int = 1000
    """Unflagged windows kept per entity as training data."""
    max_entities: int = 1024
    """Entities tracked. A new one takes the place of the least recently seen entity if that
    one sent nothing for window_s + grace_s (it is evicted as after entity_idle_s); else its
    data is dropped, counted in ``<kind>.dropped_entities`` and logged once a minute."""
    entity_idle_s: float = 600.0
    """An entity that sent nothing for this long (seconds) is evicted: its open windows are
    scored and reported, its model is dropped (``entities.evicted``); if it comes back, it
    starts over as a new entity. Processes exit, and their process id makes every restart a
    new entity."""
    max_entity_window_bytes: int = 32 * 1024 * 1024
    """Estimated memory of one entity's open windows and counter series. Beyond it all its
    open windows are closed and scored early and its counter series start over from a new
    baseline (``windows.shed_memory``, ``entities.shed_memory``, a warning once a minute). An
    entity using every function and metric slot to the full, with max_span_refs spans kept,
    takes at most about 25 MiB in 2 open windows (the usual number, grace_s < window_s); a
    typical one a few MiB."""
    max_window_bytes: int = 256 * 1024 * 1024
    """Estimated memory of the open windows of all entities together; beyond it the largest
    entities' windows are closed early as beyond max_entity_window_bytes."""
    max_functions: int = 32
    """Functions per layer with features of their own; the rest share an ``other`` bucket."""
    max_metrics: int = 64
    """Metrics with features of their own; the rest share an ``other`` bucket."""
    exclude_metrics: list[str] = field(default_factory=lambda: list(DEFAULT_EXCLUDED_METRICS))
    """Metric name prefixes that are no features: per-process constants and the agent's
    self-telemetry (features.DEFAULT_EXCLUDED_METRICS says why); [] keeps every metric."""
    max_span_refs: int = 10000
    """Spans kept per window for the annotated re-export."""
    top_features: int = 3
    """Features named per anomaly."""
    max_components: int = 8
    """The BIC search fits 1 to this many mixture components."""
    max_fit_windows: int = MAX_FIT_WINDOWS
    """Most windows one mixture is fitted on; a longer history is sampled at random, and
    every window is still scored out of fold for the threshold (GMMDetector says why)."""
    covariance_type: str = "full"
    """Covariance of the mixture components: full, tied, diag or spherical."""
    reg_covar: float = 1e-2
    """Variance floor in standardized units (at least d/n for a fit on n windows of d features)."""
    spike_floor: float = 0.0
    """Least variance of every component on a spiky feature (at one value in at least half of
    the training windows), as a multiple of its training variance; 0 turns it off."""
    context_windows: list[int] = field(default_factory=lambda: list(DEFAULT_CONTEXT_WINDOWS))
    """Spans k (in windows) of the context features: each feature's deviation from its mean
    over the entity's previous k windows joins the window's features; [] turns them off."""
    threshold_method: str = "pot"
    """How the anomaly threshold is set from training scores: pot or quantile."""
    alarms_per_hour: float = 0.5
    """Target false alarms per entity-hour: the threshold is set so that this share of
    out-of-fold (held-out) normal windows lies below it, threshold risk =
    alarms_per_hour * window_s / 3600 (capped at 0.5). A budget per hour, not per window,
    because what a person can answer is alarms per hour whatever the window length: 2 s
    windows get a risk of 2.8e-4, 5-minute windows 4.2e-2 (docs/detector.md, "Operating
    point", says how 0.5 was chosen)."""
    threshold_risk: float | None = None
    """Target share of normal windows below the threshold; set, it replaces the one
    alarms_per_hour gives."""
    drift_windows: int = 100
    """The threshold follows normal drift downward: it is lowered by as much as the median
    score of the entity's last drift_windows windows not flagged lies below the median
    held-out score (from 30 such windows on, never raised); 0 keeps it where the fit put it
    (docs/detector.md, "Operating point", says how 100 was chosen)."""
    confirm_windows: int = 1
    """Consecutive windows of an entity below the threshold that make an anomaly (the last
    of them is reported, and each further one), unless one is far below it (the model's
    single_threshold_); 1 (default) reports every window below the threshold: the
    threshold already holds the alarm budget."""
    random_state: int = 0
    """Seed of the fits (results are reproducible)."""
    model_path: str | None = None
    """A model file (from `detector fit`) used for every entity instead of warm-up."""

    @property
    def risk(self) -> float:
        """The threshold's share of normal windows: ``threshold_risk`` if set, else the
        ``alarms_per_hour`` budget over windows of ``window_s``, at most 0.5."""
        if self.threshold_risk is not None:
            return self.threshold_risk
        return min(self.alarms_per_hour * self.window_s / 3600.0, 0.5)

    def validate(self) -> DetectorConfig:
        """Raise ConfigError naming the first invalid key; return self."""
        super().validate()
        positive = ("max_request_bytes", "queue_size", "max_queued_bytes", "window_s", "warmup_windows",
                    "refit_every", "history_windows", "max_entities", "entity_idle_s",
                    "max_entity_window_bytes", "max_window_bytes", "max_functions", "max_metrics",
                    "max_span_refs", "top_features", "max_components", "reg_covar", "confirm_windows",
                    "max_fit_windows")
        for key in positive:
            if not getattr(self, key) > 0:
                raise ConfigError(f"{key}: {getattr(self, key)!r} must be > 0")
        if self.max_fit_windows < 2:  # a mixture needs two windows at least
            raise ConfigError(f"max_fit_windows: {self.max_fit_windows!r} must be >= 2")
        if self.window_s > 86400:
            raise ConfigError(f"window_s: {self.window_s!r} must be <= 86400 (a day)")
        if not self.spike_floor >= 0:
            raise ConfigError(f"spike_floor: {self.spike_floor!r} must be >= 0 (0 turns it off)")
        if self.drift_windows < 0:
            raise ConfigError(f"drift_windows: {self.drift_windows!r} must be >= 0 (0 turns it off)")
        if self.grace_s < 0:
            raise ConfigError(f"grace_s: {self.grace_s!r} must be >= 0")
        if self.warmup_windows < 10:
            raise ConfigError(f"warmup_windows: {self.warmup_windows!r} must be >= 10 to fit a model")
        if self.history_windows < self.warmup_windows:
            raise ConfigError(f"history_windows: {self.history_windows!r} must be >= "
                              f"warmup_windows ({self.warmup_windows})")
        if self.covariance_type not in COVARIANCE_TYPES:
            raise ConfigError(f"covariance_type: {self.covariance_type!r}, expected one of {COVARIANCE_TYPES}")
        if self.threshold_method not in THRESHOLD_METHODS:
            raise ConfigError(f"threshold_method: {self.threshold_method!r}, expected one of {THRESHOLD_METHODS}")
        if self.threshold_risk is not None and not 0 < self.threshold_risk < 1:
            raise ConfigError(f"threshold_risk: {self.threshold_risk!r} must be in (0, 1)")
        if not self.alarms_per_hour > 0:
            raise ConfigError(f"alarms_per_hour: {self.alarms_per_hour!r} must be > 0")
        try:
            check_windows(self.context_windows)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ConfigError("tls_cert_file / tls_key_file: set both or neither")
        if ":" not in self.listen:
            raise ConfigError(f"listen: {self.listen!r}, expected host:port")
        if not self.entity_attributes or not all(isinstance(a, str) for a in self.entity_attributes):
            raise ConfigError(f"entity_attributes: {self.entity_attributes!r}, expected a list of names")
        if self.bearer_token is not None and (not self.bearer_token.strip() or not self.bearer_token.isprintable()):
            raise ConfigError("bearer_token: must be non-empty printable text (it travels in a gRPC header)")
        if self.bearer_token is not None and self.bearer_token != self.bearer_token.strip():
            # A client's header is read with its blanks stripped, so such a token never matches.
            raise ConfigError("bearer_token: has blanks at its start or end, which no client can send; remove them")
        return self

    def check_listen(self) -> bool:
        """Raise ConfigError when ``listen`` is reachable from other hosts in plaintext without
        bearer_token, unless insecure_listen says so; return whether it is (``serve`` warns)."""
        if loopback(self.listen) or self.tls_cert_file or self.bearer_token:
            return False
        if not self.insecure_listen:
            raise ConfigError(
                f"listen: {self.listen!r} is not a loopback address and has neither TLS (tls_cert_file, "
                "tls_key_file) nor bearer_token: anyone who reaches it could feed the detector; set them, "
                "or set insecure_listen: true (--insecure-listen) to serve it in plaintext anyway")
        return True


def loopback(listen: str) -> bool:
    """Whether the host of ``listen`` (host:port) is a loopback name or address."""
    host = listen.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False  # a host name: whatever it resolves to, it is no promise of loopback
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)
