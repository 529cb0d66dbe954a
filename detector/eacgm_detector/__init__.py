"""otel-eacgm detector: OTLP gRPC service scoring telemetry windows with a Gaussian Mixture Model."""
