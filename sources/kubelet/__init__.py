"""The kubelet's pod-resources API, the part the agent reads (`podresources.proto`), and its generated
modules (regenerate with `make proto`; `make proto-check` fails when they are out of date)."""
