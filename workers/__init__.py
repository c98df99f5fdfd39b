"""faultline's workers (ARCHITECTURE §7): quarantine, drainer, remediation, janitor. Each is a
level-triggered loop that takes work by claims on the MongoDB store and acts on the Kubernetes API; they
never call each other."""
