"""The detector's one typed configuration object.

Defaults are the field defaults below; a YAML file (keys = field names) overrides them, the
environment overrides the file for secrets (``OTEL_EACGM_DETECTOR_BEARER_TOKEN``), and
command-line flags override both. ``validate()`` names the offending key and value, for wrong
types too: a config file is input, and a string where a number belongs must be an error that
names the key, not a ``TypeError`` deep in the service.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from eacgm_detector.context import DEFAULT_CONTEXT_WINDOWS, check_windows
from eacgm_detector.features import DEFAULT_EXCLUDED_METRICS
from eacgm_detector.model import COVARIANCE_TYPES, THRESHOLD_METHODS

#: Environment variable that sets ``bearer_token`` (kept out of config files and command lines).
BEARER_TOKEN_ENV = "OTEL_EACGM_DETECTOR_BEARER_TOKEN"


@dataclass
class DetectorConfig:
    """Detector settings; each field is a YAML key of the same name."""

    #: host:port the OTLP gRPC receiver binds; localhost unless set otherwise.
    listen: str = "127.0.0.1:4319"
    #: PEM server certificate and key; both or neither (TLS off).
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    #: When set, every RPC must carry ``authorization: Bearer <token>``, else UNAUTHENTICATED.
    #: Prefer the environment variable OTEL_EACGM_DETECTOR_BEARER_TOKEN; use with TLS off loopback.
    bearer_token: str | None = None
    #: OTLP gRPC endpoint (host:port) for anomaly logs, score gauges and annotated spans;
    #: None sends nothing (the CLI falls back to OTEL_EXPORTER_OTLP_ENDPOINT).
    export_endpoint: str | None = None
    export_insecure: bool = True
    #: PEM CA bundle to verify the export endpoint when export_insecure is false.
    export_ca_file: str | None = None
    #: Re-export received spans, annotated with eacgm.anomaly[.score], to export_endpoint.
    reexport_spans: bool = True
    #: Requests larger than this get RESOURCE_EXHAUSTED.
    max_request_bytes: int = 4 * 1024 * 1024
    #: Decoded requests waiting for the scoring thread; beyond it callers get UNAVAILABLE
    #: (OTLP's retryable back-pressure signal) instead of memory growing.
    queue_size: int = 64
    window_s: float = 10.0
    grace_s: float = 5.0
    #: Resource attributes that make up an entity, in order; absent ones are skipped.
    entity_attributes: list[str] = field(
        default_factory=lambda: ["host.name", "process.pid", "eacgm.rank", "hw.id"])
    #: Windows an entity collects before its first fit.
    warmup_windows: int = 60
    #: Refit after this many more unflagged windows.
    refit_every: int = 100
    #: Unflagged windows kept per entity as training data.
    history_windows: int = 1000
    max_entities: int = 1024
    max_functions: int = 32
    max_metrics: int = 64
    #: Metric name prefixes that are no features: per-process constants and the agent's
    #: self-telemetry (features.DEFAULT_EXCLUDED_METRICS says why); [] keeps every metric.
    exclude_metrics: list[str] = field(default_factory=lambda: list(DEFAULT_EXCLUDED_METRICS))
    max_span_refs: int = 10000
    top_features: int = 3
    max_components: int = 8
    covariance_type: str = "full"
    reg_covar: float = 1e-2
    #: Spans k (in windows) of the context features: each feature's deviation from its mean
    #: over the entity's previous k windows joins the window's features; [] turns them off.
    context_windows: list[int] = field(default_factory=lambda: list(DEFAULT_CONTEXT_WINDOWS))
    threshold_method: str = "pot"
    threshold_risk: float = 1e-3
    #: Consecutive windows of an entity below the threshold that make an anomaly (the last
    #: of them is reported, and each further one), unless one is far below it (the model's
    #: single_threshold_); 1 reports every window below the threshold.
    confirm_windows: int = 2
    random_state: int = 0
    #: A model file (from `detector fit`) used for every entity instead of warm-up.
    model_path: str | None = None

    def validate(self) -> "DetectorConfig":
        """Raise ``ValueError`` naming the first invalid key; return self."""
        for f in fields(self):
            _check_type(f.name, getattr(self, f.name), str(f.type))
        positive = ("max_request_bytes", "queue_size", "window_s", "warmup_windows", "refit_every",
                    "history_windows", "max_entities", "max_functions", "max_metrics",
                    "max_span_refs", "top_features", "max_components", "reg_covar", "confirm_windows")
        for key in positive:
            if not getattr(self, key) > 0:
                raise ValueError(f"{key}: {getattr(self, key)!r} must be > 0")
        if self.window_s > 86400:
            raise ValueError(f"window_s: {self.window_s!r} must be <= 86400 (a day)")
        if self.grace_s < 0:
            raise ValueError(f"grace_s: {self.grace_s!r} must be >= 0")
        if self.warmup_windows < 10:
            raise ValueError(f"warmup_windows: {self.warmup_windows!r} must be >= 10 to fit a model")
        if self.history_windows < self.warmup_windows:
            raise ValueError(f"history_windows: {self.history_windows!r} must be >= "
                             f"warmup_windows ({self.warmup_windows})")
        if self.covariance_type not in COVARIANCE_TYPES:
            raise ValueError(f"covariance_type: {self.covariance_type!r}, expected one of {COVARIANCE_TYPES}")
        if self.threshold_method not in THRESHOLD_METHODS:
            raise ValueError(f"threshold_method: {self.threshold_method!r}, expected one of {THRESHOLD_METHODS}")
        if not 0 < self.threshold_risk < 1:
            raise ValueError(f"threshold_risk: {self.threshold_risk!r} must be in (0, 1)")
        check_windows(self.context_windows)
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("tls_cert_file / tls_key_file: set both or neither")
        if ":" not in self.listen:
            raise ValueError(f"listen: {self.listen!r}, expected host:port")
        if not self.entity_attributes or not all(isinstance(a, str) for a in self.entity_attributes):
            raise ValueError(f"entity_attributes: {self.entity_attributes!r}, expected a list of names")
        if self.bearer_token is not None and (not self.bearer_token.strip() or not self.bearer_token.isprintable()):
            raise ValueError("bearer_token: must be non-empty printable text (it travels in a gRPC header)")
        return self

    def apply_environment(self, environ: Mapping[str, str] | None = None) -> "DetectorConfig":
        """Take ``bearer_token`` from OTEL_EACGM_DETECTOR_BEARER_TOKEN when set; return self."""
        env = os.environ if environ is None else environ
        if env.get(BEARER_TOKEN_ENV):
            self.bearer_token = env[BEARER_TOKEN_ENV]
        return self

    @classmethod
    def from_mapping(cls, data: dict) -> "DetectorConfig":
        """Build from a dict (parsed YAML); unknown keys are an error, not ignored."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(k) for k in set(data) - known)
        if unknown:
            raise ValueError(f"unknown detector config key(s) {unknown}; known: {sorted(known)}")
        return cls(**data).validate()

    @classmethod
    def load(cls, path: str | Path) -> "DetectorConfig":
        """Read a YAML file whose top level is a mapping of field names."""
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping of detector config keys, got {type(data).__name__}")
        return cls.from_mapping(data)


def _check_type(key: str, value, type_text: str) -> None:
    """Raise ``ValueError`` unless ``value`` fits the field's annotation (finite for floats)."""
    if value is None and "None" in type_text:
        return
    base = type_text.split(" |")[0]
    if base == "list[str]":
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    elif base == "list[int]":
        ok = isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    elif base == "float":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    elif base == "int":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif base == "bool":
        ok = isinstance(value, bool)
    else:
        ok = isinstance(value, str)
    if not ok:
        raise ValueError(f"{key}: {value!r} is not a valid {type_text}" +
                         (" (finite)" if base == "float" else ""))
