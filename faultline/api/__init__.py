"""The gRPC API (`health.proto`), NVSentinel's platform-connector contract (`nvsentinel.proto`, served for
migration) and their generated modules (regenerate with `make proto`)."""
