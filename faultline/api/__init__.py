"""The gRPC API (`health.proto`) and its generated modules (regenerate with `make proto`)."""
