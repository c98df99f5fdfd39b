#!/usr/bin/env bash
# The image's supply chain, on what `make image` wrote to .cache/image (tools from tools/build.sh):
#
#   image/supply-chain.sh sbom [analyzer]    CycloneDX SBOM of each architecture's image (syft, offline),
#                                            .cache/image/<arch>/sbom.cdx.json; analyzer: of the analyzer
#                                            image's (make image-analyzer)
#   image/supply-chain.sh keys               a cosign key pair for local signing (.cache/image/keys; never
#                                            committed; empty password)
#   image/supply-chain.sh push REGISTRY      push the image index by digest to REGISTRY/images/faultline,
#                                            sign it and each architecture's image (cosign --recursive),
#                                            attest each one's SBOM; package the chart, push it to
#                                            oci://REGISTRY/faultline and sign it; then push-store, and
#                                            push-analyzer when the analyzer image is built on this image
#   image/supply-chain.sh push-analyzer REGISTRY
#                                            the analyzer image (.cache/image/analyzer) the same way, by
#                                            digest to REGISTRY/images/faultline-analyzer
#   image/supply-chain.sh chart              package the chart of the image's commit (.cache/image/revision)
#                                            into .cache/image/chart, what push pushes
#   image/supply-chain.sh push-store REGISTRY
#                                            the embedded store's images, those `make image-store` built
#                                            (.cache/image/store): by digest to REGISTRY/images/ferretdb
#                                            and REGISTRY/images/postgres (tagged with their versions, the
#                                            chart's default tags), signed
#   image/supply-chain.sh verify REGISTRY [PUBLIC_KEY]
#                                            verify the index's and each image's signature and each
#                                            image's SBOM attestation, the
#                                            chart's signature, the built store images' signatures and
#                                            the analyzer image's as push pushed it (default key: the
#                                            local one); fails on a wrong key
#   image/supply-chain.sh release REGISTRY VERSION
#                                            push, with the chart as release VERSION (Chart.yaml's version
#                                            and appVersion) whose values name the images just pushed by
#                                            digest (devtools/release.py), the images tagged VERSION; then
#                                            verify all of it (what `make release` runs)
#   image/supply-chain.sh registry ADDRESS   a registry in the foreground (crane registry serve)
#   image/supply-chain.sh selftest           a registry on a free loopback port for the time of a push
#                                            and a verify, then stopped (what `make verify-image` runs)
#
# No transparency log or certificate authority is reachable here: signing uses a key and skips the log
# (--tlog-upload=false); verification says so (--insecure-ignore-tlog). docs/development/image.md has
# the keyless command for releases.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${FAULTLINE_TOOLS_BIN:-$root/.cache/bin}
out=${FAULTLINE_IMAGE_DIR:-$root/.cache/image}
keys="$out/keys"
export COSIGN_PASSWORD=${COSIGN_PASSWORD-} SYFT_FILE_METADATA_SELECTION=none SYFT_CHECK_FOR_APP_UPDATE=false
export COSIGN_YES=true COSIGN_EXPERIMENTAL=0
registry_flags=(--allow-http-registry --allow-insecure-registry)
sign_flags=(--tlog-upload=false --use-signing-config=false "${registry_flags[@]}")
verify_flags=(--insecure-ignore-tlog=true "${registry_flags[@]}")

quiet() {  # run a command; show what it printed only when it fails
  local log rc=0; log=$(mktemp)
  "$@" >"$log" 2>&1 || rc=$?
  [ $rc = 0 ] || cat "$log" >&2
  rm -f "$log"
  return $rc
}
need() { [ -s "$out/digest" ] || { echo "error: no image: run make image" >&2; exit 1; }; }
log() { echo "supply-chain: $*"; }

# The images: faultline (make image, in $out) and faultline-analyzer (make image-analyzer: the same image
# and the anomaly extra, in $out/analyzer), each with its OCI layout, archive, digest, version and SBOM.
image_dir() { if [ "$1" = faultline-analyzer ]; then echo "$out/analyzer"; else echo "$out"; fi; }
analyzer_built() {  # on the image that is built (a stale one would push an older commit's code)
  [ -s "$out/analyzer/digest" ] && [ "$(cat "$out/analyzer/revision" 2>/dev/null)" = "$(cat "$out/revision")" ]
}

arches_of() {  # the architectures of the image in DIR, one per line
  if [ -s "$1/arches" ]; then tr ' ' '\n' < "$1/arches"; else echo amd64; fi
}

sbom() {
  local name=${1:-faultline} dir arch t=$SECONDS
  need; dir=$(image_dir "$name")
  [ -s "$dir/digest" ] || { echo "error: no $name image: run make image-analyzer" >&2; exit 1; }
  for arch in $(arches_of "$dir"); do
    "$bin/syft" scan --quiet --source-name "$name" "oci-archive:$dir/$arch/$name.oci.tar" \
      -o "cyclonedx-json=$dir/$arch/sbom.cdx.json"
    log "SBOM $dir/$arch/sbom.cdx.json: $("$root/.venv/bin/python" -c '
import collections, json, sys
purls = [c.get("purl", "") for c in json.load(open(sys.argv[1]))["components"]]
kinds = collections.Counter(p.split("/")[0].removeprefix("pkg:") for p in purls if p)
print(", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))' "$dir/$arch/sbom.cdx.json") ($((SECONDS - t)) s)"
  done
}

sbom_subject() {  # the image digest the SBOM in $1 describes (syft records it as the component's version)
  [ -s "$1/sbom.cdx.json" ] || return 0
  "$root/.venv/bin/python" -c '
import json, sys
print(json.load(open(sys.argv[1]))["metadata"]["component"]["version"])' "$1/sbom.cdx.json"
}

sboms_current() {  # DIR: each architecture's SBOM describes its image as built now
  local arch
  for arch in $(arches_of "$1"); do
    [ "$(sbom_subject "$1/$arch")" = "$(cat "$1/$arch/digest")" ] || return 1
  done
}

keypair() {
  [ -s "$keys/cosign.key" ] && return
  mkdir -p "$keys" && chmod 700 "$keys"
  (cd "$keys" && quiet "$bin/cosign" generate-key-pair)
  log "new local key pair in $keys (cosign.pub is the public key)"
}

push_image() {  # REGISTRY NAME: the index by digest to REGISTRY/images/NAME, tagged with its version (a
  # release's); the index and each architecture's image signed, each image's SBOM attested
  local reg=$1 name=$2 dir digest version arch
  need; keypair; dir=$(image_dir "$name")
  sboms_current "$dir" || sbom "$name"  # of these images, not earlier ones
  digest=$(cat "$dir/digest"); version=${release_version:-$(cat "$dir/version")}
  local image="$reg/images/$name"
  quiet "$bin/crane" push --insecure "$dir/oci" "$image@$digest"
  quiet "$bin/crane" tag --insecure "$image@$digest" "$version"
  log "pushed $image@$digest (tag $version; $(arches_of "$dir" | paste -sd' '))"
  quiet "$bin/cosign" sign --recursive --key "$keys/cosign.key" "${sign_flags[@]}" "$image@$digest"
  for arch in $(arches_of "$dir"); do
    quiet "$bin/cosign" attest --key "$keys/cosign.key" --type cyclonedx \
      --predicate "$dir/$arch/sbom.cdx.json" "${sign_flags[@]}" "$image@$(cat "$dir/$arch/digest")"
  done
  log "signed the index and each image, attested each image's SBOM"
}

push_analyzer() {
  analyzer_built || { echo "error: no analyzer image of this image: run make image-analyzer" >&2; exit 1; }
  push_image "$1" faultline-analyzer
}

push() {
  local reg=$1 chart_digest
  push_image "$reg" faultline
  chart
  local tgz; tgz=$(ls "$out"/chart/faultline-*.tgz)
  local pushed
  # a registry on plain HTTP (the loopback one) unless REGISTRY_TLS=1 (HTTPS, trusted by the system's CAs
  # or SSL_CERT_FILE)
  local plain=(--plain-http); [ "${REGISTRY_TLS:-}" != 1 ] || plain=()
  pushed=$("$bin/helm" push "$tgz" "oci://$reg" "${plain[@]}" 2>&1) || { echo "$pushed" >&2; exit 1; }
  chart_digest=$(sed -n 's/^Digest: //p' <<<"$pushed")
  [ -n "$chart_digest" ] || { echo "error: helm push gave no digest" >&2; exit 1; }
  quiet "$bin/cosign" sign --key "$keys/cosign.key" "${sign_flags[@]}" "$reg/faultline@$chart_digest"
  echo "$chart_digest" > "$out/chart/digest"
  local chart_version=${tgz##*/faultline-}; chart_version=${chart_version%.tgz}
  log "pushed and signed the chart: helm install faultline oci://$reg/faultline --version $chart_version"
  push_store "$reg"
  if analyzer_built; then push_analyzer "$reg"; fi
}

# The chart from the image's commit, as the image is, packaged into $out/chart. Its symbolic links (the CRD
# in faultline/kube, the built-in object rules in patterns/objects) are archived with what they point to,
# so helm packages them as files: an archive of charts/ alone leaves them dangling and helm refuses it.
chart() {
  local rev link linked=()
  rev=$(cat "$out/revision")
  while IFS= read -r link; do
    linked+=("$(realpath -ms --relative-to="$root" "$root/$(dirname "$link")/$(git -C "$root" cat-file -p "$rev:$link")")")
  done < <(git -C "$root" ls-tree -r "$rev" charts | awk '$1 == "120000" {print $4}')
  rm -rf "$out/chart" && mkdir -p "$out/chart/src"
  git -C "$root" archive "$rev" charts "${linked[@]}" | tar -x -C "$out/chart/src"
  if [ -n "${release_version:-}" ]; then  # make release: its version and the images just pushed, by digest
    "$root/.venv/bin/python" -m devtools.release "$out/chart/src/charts/faultline" --version "$release_version" \
      --registry "$release_registry" --image "$(cat "$out/digest")" \
      --ferretdb "$(cat "$out/store/ferretdb.digest")" --postgres "$(cat "$out/store/postgres.digest")"
  fi
  quiet "$bin/helm" package "$out/chart/src/charts/faultline" --destination "$out/chart"
  rm -rf "$out/chart/src"
}

store_images() {  # the store images make image-store built: NAME per line
  local name
  for name in ferretdb postgres; do
    [ -s "$out/store/$name.digest" ] && [ -d "$out/store/$name" ] && echo "$name"
  done
  return 0
}

push_store() {
  local reg=$1 name digest tag
  keypair
  for name in $(store_images); do
    digest=$(cat "$out/store/$name.digest")
    tag=$(sed -n 's/.*"org.opencontainers.image.ref.name":"\([^"]*\)".*/\1/p' "$out/store/$name/index.json")
    quiet "$bin/crane" push --insecure "$out/store/$name" "$reg/images/$name@$digest"
    [ -z "$tag" ] || quiet "$bin/crane" tag --insecure "$reg/images/$name@$digest" "$tag"
    quiet "$bin/cosign" sign --recursive --key "$keys/cosign.key" "${sign_flags[@]}" "$reg/images/$name@$digest"
    log "pushed and signed (the index and each image) $reg/images/$name@$digest (tag ${tag:-none})"
  done
}

verify_image() {  # REGISTRY KEY NAME: the index's signature, each image's signature and SBOM attestation
  local dir arch image
  dir=$(image_dir "$3")
  image="$1/images/$3@$(cat "$dir/digest")"
  quiet "$bin/cosign" verify --key "$2" "${verify_flags[@]}" "$image"
  log "signature verified: $image"
  for arch in $(arches_of "$dir"); do
    image="$1/images/$3@$(cat "$dir/$arch/digest")"
    quiet "$bin/cosign" verify --key "$2" "${verify_flags[@]}" "$image"
    quiet "$bin/cosign" verify-attestation --key "$2" --type cyclonedx "${verify_flags[@]}" "$image"
    log "signature and SBOM attestation verified: $image ($arch)"
  done
}

verify() {
  local reg=$1 key=${2:-$keys/cosign.pub} image
  need
  verify_image "$reg" "$key" faultline
  if analyzer_built; then verify_image "$reg" "$key" faultline-analyzer; fi
  if [ -s "$out/chart/digest" ]; then
    quiet "$bin/cosign" verify --key "$key" "${verify_flags[@]}" "$reg/faultline@$(cat "$out/chart/digest")"
    log "chart signature verified: $reg/faultline@$(cat "$out/chart/digest")"
  fi
  local name
  for name in $(store_images); do
    image="$reg/images/$name@$(cat "$out/store/$name.digest")"
    quiet "$bin/cosign" verify --key "$key" "${verify_flags[@]}" "$image"
    log "signature verified: $image"
  done
}

free_port() {
  "$root/.venv/bin/python" -c '
import socket
s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

registry_pid=
stop_registry() {
  [ -n "$registry_pid" ] || return 0
  kill "$registry_pid" 2>/dev/null || true
  wait "$registry_pid" 2>/dev/null || true
}

selftest() {
  local port; port=$(free_port)
  "$bin/crane" registry serve --address "127.0.0.1:$port" >"$out/registry.log" 2>&1 &
  registry_pid=$!
  trap stop_registry EXIT
  local pid=$registry_pid
  local deadline=$((SECONDS + 30))
  until "$bin/crane" catalog --insecure "127.0.0.1:$port" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || { echo "error: the registry did not start" >&2; exit 1; }
    kill -0 "$pid" || { cat "$out/registry.log" >&2; exit 1; }
    sleep 0.2
  done
  push "127.0.0.1:$port"
  verify "127.0.0.1:$port"
}

release() {  # REGISTRY VERSION: everything push pushes, the chart as release VERSION naming these images
  release_registry=$1 release_version=$2
  need
  for name in ferretdb postgres; do
    [ -s "$out/store/$name.digest" ] || { echo "error: no $name image: run make image-store" >&2; exit 1; }
  done
  push "$release_registry"
  verify "$release_registry"
  log "released $release_version: verify, then install:"
  log "  cosign verify --key cosign.pub --insecure-ignore-tlog=true $release_registry/faultline:$release_version"
  log "  helm install faultline oci://$release_registry/faultline --version $release_version -n faultline --create-namespace"
}

case ${1:-} in
  sbom) case ${2:-} in "") sbom ;; analyzer) sbom faultline-analyzer ;; *) sed -n '4,5p' "$0" >&2; exit 2 ;; esac ;;
  keys) keypair ;;
  push) push "${2:?REGISTRY}" ;;
  push-store) push_store "${2:?REGISTRY}" ;;
  push-analyzer) push_analyzer "${2:?REGISTRY}" ;;
  chart) chart ;;
  verify) verify "${2:?REGISTRY}" "${3:-}" ;;
  registry) exec "$bin/crane" registry serve --address "${2:?ADDRESS}" ;;
  selftest) selftest ;;
  release) release "${2:?REGISTRY}" "${3:?VERSION}" ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2; exit 2 ;;
esac
