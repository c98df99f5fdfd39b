# faultline developer entry points. The README names three of them: `make replay`, `make test` and
# `make demo`.
SHELL := /bin/bash
# The first interpreter on PATH that runs and is 3.11 or 3.12 (a pyenv shim may exist but not run).
PYTHON ?= $(shell for p in python3.12 python3.11 python3; do \
	  $$p -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 12))' 2>/dev/null \
	  && { command -v $$p; break; }; done)
VENV := .venv
BIN := $(VENV)/bin
SAMPLE := benchmarks/corpus/sample

.PHONY: setup system-deps tools test-tools replay check test redteam demo bench bench-agent bench-quarantine bench-fleet bench-drain chaos sample cluster proto proto-check
.PHONY: docs docs-gen
.PHONY: image image-store image-analyzer lock image-tools sbom push verify-image registry release

# A virtual environment at the repository root with faultline (editable) and its dev tools.
$(VENV)/.installed: pyproject.toml
	@test -n "$(PYTHON)" || { echo "error: Python 3.11 or 3.12 is required (bytewax 0.21 has no 3.13 build)"; exit 1; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $@

setup: $(VENV)/.installed

# The main job on its embedded default: replay the committed sample corpus through every built-in pack.
# The sample's RFC 3164 lines carry no year and its kmsg file counts from boot: pin both.
replay: setup
	$(BIN)/faultline replay $(SAMPLE) --year 2026 --boot-time 2026-11-30T00:00:00

# Lint, format, types and the architecture contracts.
check: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(MAKE) --no-print-directory proto-check
	$(MAKE) --no-print-directory docs

# The gRPC modules generated from each proto are committed (faultline/api/health.proto, the ingest API;
# faultline/api/nvsentinel.proto, NVSentinel's platform-connector service the agent also serves;
# sources/kubelet/podresources.proto, the part of the kubelet's pod-resources API the agent reads);
# `proto` rewrites them and `proto-check` fails when they are out of date (pinned grpcio-tools and
# mypy-protobuf: deterministic).
PROTOC := PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m grpc_tools.protoc -I.
PROTOS := faultline/api/health.proto faultline/api/nvsentinel.proto sources/kubelet/podresources.proto
proto: setup
	$(PROTOC) --python_out=. --grpc_python_out=. --mypy_out=. --mypy_grpc_out=. $(PROTOS)

proto-check: setup
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	$(PROTOC) --python_out=$$tmp --grpc_python_out=$$tmp --mypy_out=$$tmp --mypy_grpc_out=$$tmp \
	  $(PROTOS) && \
	for proto in $(PROTOS); do \
	  for suffix in _pb2.py _pb2.pyi _pb2_grpc.py _pb2_grpc.pyi; do \
	    f=$${proto%.proto}$$suffix; \
	    cmp -s $$tmp/$$f $$f || { echo "error: $$f is out of date with $$proto: run make proto"; exit 1; }; \
	  done; \
	done

# The documentation site (mkdocs.yml, docs/): the generated pages (the chart's values reference, the XID
# catalogue) checked current, then a strict build into .cache/site, where a broken link or anchor fails.
# Not --quiet: MkDocs 1.6 then drops the warnings strict mode counts (mkdocs/mkdocs#4126); INFO lines are
# filtered instead. `docs-gen` rewrites the generated pages.
docs: setup
	@$(BIN)/python -m devtools.valuesref --check
	@$(BIN)/python -m devtools.xidref --check
	@set -o pipefail; NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict 2>&1 | { grep -v '^INFO ' || true; }

docs-gen: setup
	$(BIN)/python -m devtools.valuesref
	$(BIN)/python -m devtools.xidref

# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, helm and FerretDB, built from the
# Go module proxy into .cache/bin (skipped when current; see tools/build.sh).
tools:
	bash tools/build.sh

# The one OCI image for every component (image/build.sh): from HEAD and requirements/image.lock, a Debian 12
# root filesystem from Debian's packages (mmdebstrap; needs root), reproducible, for linux/amd64 and
# linux/arm64 (the foreign one under QEMU user emulation in the build's own user namespace); written as one
# image index to .cache/image/faultline.oci.tar with the index's digest in .cache/image/digest (each
# architecture's image in .cache/image/<arch>/). IMAGE_ARCHES=amd64 builds one.
image: setup system-deps
	bash image/build.sh

# The analyzer image (image/analyzer.sh): the image above (built first when missing or of another commit)
# plus one layer with the anomaly extra from requirements/analyzer.lock, for the cluster analyzer's anomaly
# scores (chart: analyzer.anomaly.enabled with analyzer.image); .cache/image/analyzer/, digest in its digest.
image-analyzer: setup system-deps
	bash image/analyzer.sh

# The embedded store's images for the chart (image/store.sh), built the same way: ferretdb (the static
# FerretDB binary of tools/ferretdb on an empty base) and postgres (Debian 12's postgresql-15; needs root).
# Written to .cache/image/store/{ferretdb,postgres}.oci.tar with their digests beside them.
image-store: setup system-deps
	bash image/store.sh

# requirements/image.lock: pyproject's runtime dependencies and the nvml extra, pinned with every
# artifact's hash for CPython 3.11 on x86_64 Linux (the image's Python). Existing pins are kept where
# they still fit; `make lock LOCK_UPGRADE=--upgrade` moves everything to the newest. A unit test
# (tests/unit/test_image_lock.py) fails when pyproject asks for something the lock does not satisfy.
# requirements/analyzer.lock the same for the anomaly extra (the analyzer image's layer), what the image
# lock already holds left to it.
LOCK_UPGRADE ?=
LOCK_ARGS := pyproject.toml --extra nvml --generate-hashes --python-version 3.11 \
	--python-platform x86_64-manylinux_2_36 --custom-compile-command 'make lock'
UV_VERSION := 0.13.9
lock: setup
	@$(BIN)/uv --version 2>/dev/null | grep -qF ' $(UV_VERSION) ' || $(BIN)/python -m pip install --quiet uv==$(UV_VERSION)
	$(BIN)/uv pip compile $(LOCK_ARGS) --quiet $(LOCK_UPGRADE) -o requirements/image.lock
	$(BIN)/python -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["anomaly"], sep="\n")' \
	  | $(BIN)/uv pip compile - --constraint requirements/image.lock $(filter-out pyproject.toml --extra nvml,$(LOCK_ARGS)) \
	    --quiet $(LOCK_UPGRADE) -o requirements/analyzer.lock

# syft, cosign, crane and helm for the supply chain (tools/build.sh).
image-tools:
	bash tools/build.sh syft cosign crane helm

# CycloneDX SBOM of each architecture's image: .cache/image/<arch>/sbom.cdx.json.
sbom: image-tools
	bash image/supply-chain.sh sbom

# Push the image by digest (REGISTRY/images/faultline), sign it, attest its SBOM; push and sign the chart
# (oci://REGISTRY/faultline). REGISTRY=host:port, e.g. the one `make registry` serves.
REGISTRY ?=
REGISTRY_PORT ?= 5000
push: image-tools
	@test -n "$(REGISTRY)" || { echo "error: REGISTRY=host:port is required (make registry serves one)"; exit 1; }
	bash image/supply-chain.sh push $(REGISTRY)

# Verify the image's signature and SBOM attestation and the chart's signature (COSIGN_KEY: a public key;
# default the local one). Without REGISTRY: push to a registry on a free loopback port, verify, stop it.
COSIGN_KEY ?=
verify-image: image-tools
	@if [ -n "$(REGISTRY)" ]; then bash image/supply-chain.sh verify $(REGISTRY) $(COSIGN_KEY); \
	else bash image/supply-chain.sh selftest; fi

# A release: `make release REGISTRY=host:port VERSION=1.2.0` builds what is not built from HEAD (the image
# indexes of faultline and the store, amd64 and arm64; needs root), pushes them by digest, signed, with each
# image's SBOM attested, and the chart as VERSION naming them by digest (so `helm install faultline
# oci://REGISTRY/faultline --version VERSION` needs no value), signed; then verifies all of it.
# REGISTRY_TLS=1: the registry speaks HTTPS (trusted by the system's CAs or SSL_CERT_FILE).
VERSION ?=
release: image-tools
	@test -n "$(REGISTRY)" -a -n "$(VERSION)" || { echo "error: make release REGISTRY=host:port VERSION=X.Y.Z"; exit 1; }
	@[ -s .cache/image/digest ] && [ "$$(cat .cache/image/revision 2>/dev/null)" = "$$(git rev-parse HEAD)" ] \
	  || $(MAKE) --no-print-directory image
	@[ -s .cache/image/store/ferretdb.digest ] && [ -s .cache/image/store/postgres.digest ] \
	  || $(MAKE) --no-print-directory image-store
	bash image/supply-chain.sh release $(REGISTRY) $(VERSION)

# A registry on loopback in the foreground (crane), for push and for the local cluster to pull from.
registry: image-tools
	bash image/supply-chain.sh registry 127.0.0.1:$(REGISTRY_PORT)

# The Debian packages the tests need (systemd-journal-remote, PostgreSQL), installed when missing.
system-deps:
	bash tools/system-deps.sh

# Every tool the suite uses, built before the tests (not inside a test's time limit): the control plane,
# FerretDB and helm, the supply-chain tools (image tests) and the real node's runtime (real-node tests).
test-tools:
	bash tools/build.sh etcd ferretdb kubernetes helm crane syft cosign containerd runc pause prometheus

test: system-deps check test-tools
	$(BIN)/pytest

# The red-team tests alone: each attack on faultline's trust or blast radius that is refused today.
redteam: setup test-tools
	$(BIN)/pytest -m redteam

# The whole chart on a local cluster of simulated GPU nodes, four scripted faults shown live, a timeline
# (the README's third command). DEMO_ARGS=--keep leaves it running.
DEMO_ARGS ?=
demo: setup tools
	$(BIN)/faultline demo $(DEMO_ARGS)

# A local control plane with 4 simulated GPU nodes and FerretDB, in the foreground until Ctrl-C;
# REAL_NODES=1 (root) adds a real kubelet node running real pods (undone on exit or `faultline dev cluster down`).
REAL_NODES ?= 0
cluster: setup tools
	$(BIN)/faultline dev cluster up --nodes 4 --real-nodes $(REAL_NODES)

bench: setup
	$(BIN)/python benchmarks/replay.py --memory --startup --processes

# The node agent's RSS, CPU and XID -> MongoDB latency under load (needs the tools and systemd-journal-remote).
bench-agent: setup tools
	$(BIN)/python benchmarks/agent.py

# Quarantine: fault -> cordon latency and 500 nodes faulted at once, on the local cluster and FerretDB.
bench-quarantine: setup tools
	$(BIN)/python benchmarks/quarantine.py

# Fleet: 1,000, 5,000 and 10,000 simulated nodes' agents on one store and one API server, per-node costs
# side by side, fault -> cordon and a storm of 5 % of the fleet (about 25 minutes; FLEET_ARGS="--sizes 1000").
FLEET_ARGS ?=
bench-fleet: setup tools
	$(BIN)/python benchmarks/fleet.py $(FLEET_ARGS)

# Drain: 2,000 pods evicted across 200 simulated GPU nodes (evictions/s).
bench-drain: setup tools
	$(BIN)/python benchmarks/drain.py

# Chaos: 52 simulated GPU nodes with real agents and the four workers under a steady load of faults while
# agents, workers, FerretDB (SQLite, then PostgreSQL), the API server and etcd are killed or restarted, the
# store is cut off for 10 minutes and slowed down; one table of events lost, duplicate actions and time to
# converge (benchmarks/chaos.py; JSON in benchmarks/out/chaos.json). About 80 min; CHAOS_ARGS="--outage 20"
# for a quicker run, --backend/--scenario to pick.
CHAOS_ARGS ?=
chaos: setup tools system-deps
	$(BIN)/python -m benchmarks.chaos $(CHAOS_ARGS)

# Rewrite the committed sample corpus (deterministic).
sample: setup
	rm -rf $(SAMPLE) && $(BIN)/python benchmarks/gen_corpus.py sample $(SAMPLE)
