#!/usr/bin/env bash
# The image's supply chain, on what `make image` wrote to .cache/image (tools from tools/build.sh):
#
#   image/supply-chain.sh sbom               CycloneDX SBOM of the OCI archive (syft, offline)
#   image/supply-chain.sh keys               a cosign key pair for local signing (.cache/image/keys; never
#                                            committed; empty password)
#   image/supply-chain.sh push REGISTRY      push the image by digest to REGISTRY/images/faultline, sign it,
#                                            attest the SBOM; package the chart, push it to
#                                            oci://REGISTRY/faultline and sign it
#   image/supply-chain.sh verify REGISTRY [PUBLIC_KEY]
#                                            verify the image's signature and SBOM attestation and the
#                                            chart's signature (default key: the local one); fails on
#                                            a wrong key
#   image/supply-chain.sh registry ADDRESS   a registry in the foreground (crane registry serve)
#   image/supply-chain.sh selftest           a registry on a free loopback port for the time of a push
#                                            and a verify, then stopped (what `make verify-image` runs)
#
# No transparency log or certificate authority is reachable here: signing uses a key and skips the log
# (--tlog-upload=false); verification says so (--insecure-ignore-tlog). The README's Delivery section has
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

need() { [ -s "$out/digest" ] || { echo "error: no image: run make image" >&2; exit 1; }; }
log() { echo "supply-chain: $*"; }

sbom() {
  need
  local t=$SECONDS
  "$bin/syft" scan --quiet "oci-archive:$out/faultline.oci.tar" -o "cyclonedx-json=$out/sbom.cdx.json"
  log "SBOM $out/sbom.cdx.json: $("$root/.venv/bin/python" -c '
import collections, json, sys
purls = [c.get("purl", "") for c in json.load(open(sys.argv[1]))["components"]]
kinds = collections.Counter(p.split("/")[0].removeprefix("pkg:") for p in purls if p)
print(", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))' "$out/sbom.cdx.json") ($((SECONDS - t)) s)"
}

keypair() {
  [ -s "$keys/cosign.key" ] && return
  mkdir -p "$keys" && chmod 700 "$keys"
  (cd "$keys" && "$bin/cosign" generate-key-pair >/dev/null 2>&1)
  log "new local key pair in $keys (cosign.pub is the public key)"
}

push() {
  local reg=$1 digest version chart_digest
  need; keypair
  [ -s "$out/sbom.cdx.json" ] || sbom
  digest=$(cat "$out/digest"); version=$(cat "$out/version")
  local image="$reg/images/faultline"
  "$bin/crane" push --insecure "$out/oci" "$image@$digest" >/dev/null
  "$bin/crane" tag --insecure "$image@$digest" "$version"
  log "pushed $image@$digest (tag $version)"
  "$bin/cosign" sign --key "$keys/cosign.key" "${sign_flags[@]}" "$image@$digest" 2>/dev/null
  "$bin/cosign" attest --key "$keys/cosign.key" --type cyclonedx --predicate "$out/sbom.cdx.json" \
    "${sign_flags[@]}" "$image@$digest" 2>/dev/null
  log "signed and attested the SBOM"
  rm -rf "$out/chart" && mkdir -p "$out/chart"
  "$bin/helm" package "$root/charts/faultline" --destination "$out/chart" >/dev/null
  local tgz; tgz=$(ls "$out"/chart/faultline-*.tgz)
  chart_digest=$("$bin/helm" push "$tgz" "oci://$reg" --plain-http 2>&1 | sed -n 's/^Digest: //p')
  [ -n "$chart_digest" ] || { echo "error: helm push gave no digest" >&2; exit 1; }
  "$bin/cosign" sign --key "$keys/cosign.key" "${sign_flags[@]}" "$reg/faultline@$chart_digest" 2>/dev/null
  echo "$chart_digest" > "$out/chart/digest"
  log "pushed and signed the chart: helm install faultline oci://$reg/faultline --version ${tgz##*/faultline-} (strip .tgz)"
}

verify() {
  local reg=$1 key=${2:-$keys/cosign.pub} digest
  need
  digest=$(cat "$out/digest")
  local image="$reg/images/faultline@$digest"
  "$bin/cosign" verify --key "$key" "${verify_flags[@]}" "$image" >/dev/null
  log "signature verified: $image"
  "$bin/cosign" verify-attestation --key "$key" --type cyclonedx "${verify_flags[@]}" "$image" >/dev/null
  log "SBOM attestation verified"
  if [ -s "$out/chart/digest" ]; then
    "$bin/cosign" verify --key "$key" "${verify_flags[@]}" "$reg/faultline@$(cat "$out/chart/digest")" >/dev/null
    log "chart signature verified: $reg/faultline@$(cat "$out/chart/digest")"
  fi
}

free_port() { "$root/.venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

selftest() {
  local port; port=$(free_port)
  "$bin/crane" registry serve --address "127.0.0.1:$port" >"$out/registry.log" 2>&1 &
  local pid=$!
  trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true' EXIT
  local deadline=$((SECONDS + 30))
  until "$bin/crane" catalog --insecure "127.0.0.1:$port" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || { echo "error: the registry did not start" >&2; exit 1; }
    kill -0 "$pid" || { cat "$out/registry.log" >&2; exit 1; }
    sleep 0.2
  done
  push "127.0.0.1:$port"
  verify "127.0.0.1:$port"
}

case ${1:-} in
  sbom) sbom ;;
  keys) keypair ;;
  push) push "${2:?REGISTRY}" ;;
  verify) verify "${2:?REGISTRY}" "${3:-}" ;;
  registry) exec "$bin/crane" registry serve --address "${2:?ADDRESS}" ;;
  selftest) selftest ;;
  *) sed -n '2,20p' "$0" >&2; exit 2 ;;
esac
