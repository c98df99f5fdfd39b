"""Local infrastructure for tests and the demo: a real control plane, FerretDB, simulated GPU nodes."""
