"""Writing kubeconfig files for the local cluster (file paths for certificates, never embedded keys)."""

from __future__ import annotations

from pathlib import Path


def write(path: Path, server: str, ca: Path, user: str, credentials: dict[str, str]) -> Path:
    """A one-context kubeconfig; `credentials` are the user fields (client certificate and key, or token)."""
    fields = "".join(f"    {k}: {v}\n" for k, v in credentials.items())
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: local\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\n"
        f"users:\n- name: {user}\n  user:\n{fields}"
        f"contexts:\n- name: local\n  context:\n    cluster: local\n    user: {user}\n"
        "current-context: local\n"
    )
    path.chmod(0o600)
    return path
