#!/usr/bin/env bash
# Builds the local infrastructure for tests and the demo into .cache/bin from the Go module proxy:
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet, kube-proxy (the real nodes'
# Service routing), etcd, helm and ferretdb; the supply-chain tools the image build uses (syft, cosign,
# crane), built only when named (make image / make verify-image do); and the real nodes' runtime
# (containerd with its shim and ctr, runc with seccomp through cgo and Debian's libseccomp-dev, the static
# pause program), built only when named (the real-node fixture and `faultline dev cluster up --real-nodes`
# do).
# Each tool is stamped with a hash of its module files and the Go version; a current tool is skipped,
# and the Go build cache makes a rebuild after a small change quick.
#
#   tools/build.sh [TOOL...]     # TOOL: kubernetes etcd helm ferretdb syft cosign crane containerd runc pause prometheus
#                                # (default: the first four, what the tests and the demo need)
set -euo pipefail
shopt -s nullglob

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${FAULTLINE_TOOLS_BIN:-$root/.cache/bin}
mkdir -p "$bin"
command -v go >/dev/null || { echo "error: the Go toolchain (1.26 or newer) is needed to build the local tools" >&2; exit 1; }
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOTOOLCHAIN=local
gover=$(go env GOVERSION)

k8s_version=v1.37.2
helm_version=v4.3.1
etcd_version=v3.6.16
ferretdb_version=v1.24.2
syft_version=v1.57.2      # the versions the tool modules under tools/<name>/ pin
cosign_version=v3.1.3
crane_version=v0.22.1
containerd_version=v2.4.2
runc_version=v1.5.3
prometheus_version=v0.316.0  # Prometheus 3.16.0 (its Go module numbers releases 0.<major><minor>.<patch>)

stamp_of() {  # the hash of what a tool's build depends on
  local files=("$root/tools/$1"/go.mod "$root/tools/$1"/go.sum "$root/tools/$1"/*.go "$root/tools/build.sh")
  { cat "${files[@]}"; echo "$gover"; } | sha256sum | cut -c1-16
}

build() {  # build TOOL "ldflags" output-names... -- packages...  (env: tags=..., cgo=1 to override)
  local tool=$1 ldflags=$2; shift 2
  local outputs=() pkgs=()
  while [ "$1" != "--" ]; do outputs+=("$1"); shift; done
  shift; pkgs=("$@")
  local stamp; stamp=$(stamp_of "$tool")
  local stampfile="$bin/.stamp-$tool" current=1
  for o in "${outputs[@]}"; do [ -x "$bin/$o" ] || current=0; done
  if [ "$current" = 1 ] && [ "$(cat "$stampfile" 2>/dev/null)" = "$stamp" ]; then
    echo "tools: $tool is current (${outputs[*]})"
    return
  fi
  echo "tools: building $tool (${outputs[*]}) with $gover ..."
  local started=$SECONDS
  local out="$bin/"  # several packages: each binary named after its directory
  [ ${#pkgs[@]} -eq 1 ] && out="$bin/${outputs[0]}"  # one: named as asked (etcd's main package is server/v3)
  (cd "$root/tools/$tool" && { [ "${download:-1}" = 0 ] || go mod download; } && CGO_ENABLED=${cgo:-0} go build -trimpath \
    -tags "${tags-selinux,notest,grpcnotrace}" -ldflags "-s -w $ldflags" -o "$out" "${pkgs[@]}")
  echo "$stamp" > "$stampfile"
  echo "tools: built $tool in $((SECONDS - started)) s"
}

kube_ldflags() {
  local v=$k8s_version minor=${k8s_version#v1.}; minor=${minor%%.*}
  local date; date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  local out=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    out+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    out+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
  done
  echo "$out"
}

tools=("$@")
[ ${#tools[@]} -gt 0 ] || tools=(etcd ferretdb kubernetes helm)
for tool in "${tools[@]}"; do
  case $tool in
    kubernetes)
      build kubernetes "$(kube_ldflags)" kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet \
        kube-proxy -- k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
        k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl k8s.io/kubernetes/cmd/kubelet \
        k8s.io/kubernetes/cmd/kube-proxy ;;
    etcd)
      build etcd "" etcd -- go.etcd.io/etcd/server/v3 ;;
    helm)
      build helm "-X helm.sh/helm/v4/internal/version.version=$helm_version" helm -- helm.sh/helm/v4/cmd/helm ;;
    ferretdb)
      build ferretdb "" ferretdb -- . ;;  # tools/ferretdb/main.go runs FerretDB's embeddable package
    syft)
      build syft "-X main.version=$syft_version" syft -- github.com/anchore/syft/cmd/syft ;;
    cosign)
      build cosign "-X sigs.k8s.io/release-utils/version.gitVersion=$cosign_version" cosign -- \
        github.com/sigstore/cosign/v3/cmd/cosign ;;
    crane)
      build crane "-X github.com/google/go-containerregistry/cmd/crane/cmd.Version=$crane_version" crane -- \
        github.com/google/go-containerregistry/cmd/crane ;;
    containerd)
      tags=no_btrfs,no_devmapper,no_zfs build containerd \
        "-X github.com/containerd/containerd/v2/version.Version=$containerd_version" \
        containerd containerd-shim-runc-v2 ctr -- github.com/containerd/containerd/v2/cmd/containerd \
        github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/ctr ;;
    runc)  # runc embeds its version; cgo for its nsenter and seccomp (libseccomp-dev)
      command -v gcc >/dev/null && pkg-config --exists libseccomp ||
        { echo "error: runc needs gcc and libseccomp-dev: make system-deps" >&2; exit 1; }
      cgo=1 tags=seccomp build runc "" runc -- github.com/opencontainers/runc ;;
    prometheus)  # the alert rules' tests (promtool) and the scrape test; no service discovery but static
      # (remove_all_sd), and only the modules the build needs are downloaded (the rest are cloud SDKs)
      download=0 tags=remove_all_sd,netgo build prometheus \
        "-X github.com/prometheus/common/version.Version=3.16.0" prometheus promtool -- \
        github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool ;;
    pause)
      tags="" build pause "" pause -- . ;;  # tools/pause/main.go, static (no cgo)
    *) echo "error: unknown tool $tool (kubernetes, etcd, helm, ferretdb, syft, cosign, crane, containerd, runc," \
         "pause, prometheus)" >&2; exit 2 ;;
  esac
done
echo "tools: ready in $bin (etcd $etcd_version, FerretDB $ferretdb_version, Kubernetes $k8s_version, helm $helm_version)"
