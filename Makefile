# dtq: `make demo` runs the system, `make test` runs the suite. Both build .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install go-worker demo test proto proto-check lint bench bench-scale bench-cluster clean

install: $(STAMP) go-worker

NODE_WORKER := examples/node-worker
GO_CLIENT := clients/go
GO_PACKAGES := golang-go golang-google-grpc-dev golang-goprotobuf-dev protoc-gen-go-grpc \
  protobuf-compiler

$(STAMP): pyproject.toml $(NODE_WORKER)/package-lock.json
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,demo,embedded]'
	@# the Node worker (demo and conformance suite); skipped where npm is missing
	if command -v npm >/dev/null 2>&1; then \
	  cd $(NODE_WORKER) && npm ci --no-audit --no-fund --loglevel=error; fi
	@# promtool and prometheus (alert rule tests, Debian's prometheus package): installed
	@# where apt works as root; elsewhere the tests that need them skip and say so
	if ! command -v promtool >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 \
	    && [ "$$(id -u)" = 0 ]; then \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends prometheus >/dev/null) \
	    || echo "prometheus package not installed: promtool tests will skip"; fi
	@# the Go client (clients/go) builds offline from Debian's Go toolchain and gRPC
	@# packages, installed the same way; elsewhere the Go tests skip and say so
	if { ! command -v go >/dev/null 2>&1 || ! command -v protoc-gen-go-grpc >/dev/null 2>&1 \
	    || [ ! -d /usr/share/gocode/src/google.golang.org/grpc ]; } \
	    && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends $(GO_PACKAGES) >/dev/null) \
	    || echo "Go packages not installed: the Go worker tests will skip"; fi
	touch $(STAMP)

# the Go conformance/demo worker and bench worker (incremental: rebuilt when clients/go changed)
go-worker: $(STAMP)
	@if command -v go >/dev/null 2>&1 && [ -d /usr/share/gocode/src/google.golang.org/grpc ]; then \
	  $(PY) scripts/go_vendor.py && cd $(GO_CLIENT) && GOFLAGS=-mod=vendor \
	    go build -o bin/ ./cmd/...; \
	else echo "Go or its Debian gRPC packages missing: Go worker not built, its tests skip"; fi

proto: install
	$(PY) scripts/gen_proto.py

proto-check: install
	$(PY) scripts/gen_proto.py --check
	$(VENV)/bin/buf lint
	$(VENV)/bin/buf format --diff --exit-code
	@# wire compatibility with the proto of the local main branch (read from git, offline)
	@if git rev-parse --verify -q main >/dev/null 2>&1; then \
	  $(VENV)/bin/buf breaking --against '.git#branch=main' && echo "buf breaking: compatible with main"; \
	else echo "buf breaking: no local main branch, skipped"; fi
	$(PY) scripts/gen_config_doc.py --check

lint: proto-check
	$(VENV)/bin/ruff check dtq_gateway dtq_pyworker dtq_cli tests examples bench
	$(VENV)/bin/mypy  # the packages and strictness of [tool.mypy] in pyproject.toml

test: install proto-check
	$(VENV)/bin/pytest -q -n 2 --dist loadscope

demo: install
	$(PY) -m examples.demo

bench: install
	$(PY) -m bench

# cost per task on one Redis, G gateways x W workers (bench/README.md); plots with matplotlib
bench-scale: install
	$(PY) -c 'import matplotlib' 2>/dev/null || $(PY) -m pip install -q -e '.[bench]'
	$(PY) -m bench.scale

# the same drain on one Redis and on a private 3-primary Redis Cluster (bench/README.md)
bench-cluster: install
	$(PY) -m bench.cluster_scale

clean:
	rm -rf $(VENV) .dtq $(NODE_WORKER)/node_modules $(GO_CLIENT)/vendor $(GO_CLIENT)/bin
