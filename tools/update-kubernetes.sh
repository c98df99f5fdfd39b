#!/usr/bin/env bash
# Regenerates tools/kubernetes/go.mod for a Kubernetes version: k8s.io/kubernetes requires its staging
# modules at v0.0.0 and replaces them with local paths, which a dependent module ignores, so each one is
# replaced here by its published v0.<minor>.<patch>, read from that exact go.mod.
set -euo pipefail
version=${1:-v1.37.2}
staging=v0.${version#v1.}
cd "$(dirname "$0")/kubernetes"
mod=$(go mod download -json "k8s.io/kubernetes@${version}" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
goline=$(grep -m1 '^go ' "$mod")
godebug=$(grep -m1 '^godebug ' "$mod" || true)
{
  echo "// Builds the local Kubernetes control plane and the real node's kubelet for tests and the demo (not product code)."
  echo "// Regenerate with tools/update-kubernetes.sh ${version}."
  echo "module faultline.local/tools/kubernetes"
  echo
  echo "$goline"
  [ -n "$godebug" ] && echo "$godebug"
  echo
  echo "tool ("
  for cmd in kube-apiserver kube-controller-manager kube-proxy kube-scheduler kubectl kubelet; do
    echo "	k8s.io/kubernetes/cmd/${cmd}"
  done
  echo ")"
  echo
  echo "require k8s.io/kubernetes ${version}"
  echo
  echo "replace ("
  sed -n 's#^\s*\(k8s\.io/[a-z0-9-]*\) => \./staging/.*#\1#p' "$mod" | sort -u | while read -r m; do
    echo "	${m} => ${m} ${staging}"
  done
  echo ")"
} > go.mod
rm -f go.sum
go mod tidy
