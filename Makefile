# Every workflow of Gregor. `make run` and `make test` work on a fresh machine: both depend on
# `install`, which creates .venv and installs the project with its test dependencies.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# The unit and integration tiers run on two pytest-xdist workers, each taking whole files (so a
# module's broker fixtures start once); TEST_WORKERS=0 runs them in one process. Tests marked
# `serial` measure latency and run alone afterwards. A run whose selection holds no serial test
# (pytest's exit status 5) is not a failure.
TEST_WORKERS ?= 2
PYTEST_PARALLEL = $(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile
PYTEST_SERIAL = $(BIN)/pytest
BENCH_ARGS ?=

.PHONY: install kcat helm spark-connector host-packages kafka-dist run test test-unit test-integration test-e2e lint format clean \
	bench-storage bench-broker bench-replicated bench-responsiveness bench-flood bench-partitions bench-audit cluster cluster-down cluster-env cluster-build images crds

install: $(STAMP) kcat helm spark-connector

# Debian's kcat (librdkafka 2.0.x), a client the integration tests drive; apt needs root.
kcat:
	@command -v kcat >/dev/null 2>&1 || { \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kcat >/dev/null; }

# The helm CLI (the operator's chart), built once from its Go module into ~/.cache/gregor
# (PyPI ships no helm); `make cluster` puts it on PATH when the machine has none. Without Go
# it is skipped, so that `make run` still works on a bare machine.
helm: $(STAMP)
	@if command -v go >/dev/null 2>&1; then $(BIN)/python -m localkube.build helm >/dev/null; \
	else echo "helm: not built (it needs Go; make cluster builds it)"; fi

# Spark's Kafka connector (the retention audit's reader) and its jars, resolved once from Maven
# Central into ~/.cache/gregor/spark. Without Java, or without a route to Maven Central, it says
# why and goes on: `make run` needs neither, and the audit resolves it again when it runs.
spark-connector: $(STAMP)
	@if command -v java >/dev/null 2>&1; then $(BIN)/python -m gregor_audit.connector >/dev/null \
		|| echo "spark-connector: not resolved (see above); the audit retries when it runs"; \
	else echo "spark-connector: not resolved (Spark needs Java 17 or 21)"; fi

# Every Debian package the suite uses (iptables, docker.io, debootstrap, containerd, ...), each
# installed with apt only when missing: a fresh machine has none of them. Needs root.
host-packages: install
	$(BIN)/python -m localkube packages

# Apache Kafka's broker and tools from Maven Central, cached outside the repository
# (~/.cache/gregor/kafka/<version>, or under $GREGOR_CACHE); tests fetch it on first use too.
kafka-dist: install
	$(BIN)/python -m tests.support.kafka_dist

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: install
	$(BIN)/gregor local up --data-dir var/local --port 9092

# The whole suite: lint, unit and integration (tests/), then the e2e tier (e2e/) on the local
# cluster, which it brings up (or reuses) and leaves running for the next run.
test: install host-packages lint
	$(PYTEST_PARALLEL) -m "not serial" $(PYTEST_ARGS)
	$(PYTEST_SERIAL) -m serial $(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(MAKE) --no-print-directory test-e2e

test-unit: install
	$(PYTEST_PARALLEL) -m "unit and not serial" $(PYTEST_ARGS)
	$(PYTEST_SERIAL) -m "unit and serial" $(PYTEST_ARGS) || [ $$? -eq 5 ]

test-integration: install host-packages
	$(PYTEST_PARALLEL) -m "integration and not serial" $(PYTEST_ARGS)
	$(PYTEST_SERIAL) -m "integration and serial" $(PYTEST_ARGS) || [ $$? -eq 5 ]

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench-storage: install
	$(BIN)/python -m bench.storage $(BENCH_ARGS)

bench-broker: kafka-dist
	$(BIN)/python -m bench.broker $(BENCH_ARGS)

bench-replicated: kafka-dist
	$(BIN)/python -m bench.replicated $(BENCH_ARGS)

bench-responsiveness: kafka-dist
	$(BIN)/python -m bench.responsiveness $(BENCH_ARGS)

bench-flood: kafka-dist
	$(BIN)/python -m bench.flood $(BENCH_ARGS)

bench-partitions: kafka-dist
	$(BIN)/python -m bench.partitions $(BENCH_ARGS)

bench-audit: kafka-dist spark-connector
	$(BIN)/python -m bench.audit $(BENCH_ARGS)

# The CRDs in crds/, generated from the operator's models (a unit test fails when they are stale).
crds: install
	$(BIN)/python -m gregor_operator.crds

# A real Kubernetes on this machine, built from the pinned release's Go modules (needs root;
# builds cached in ~/.cache/gregor): a kind cluster on our own node image, a control plane and
# NODES workers in zones zone-a, zone-b, zone-c in turn (default 3; NODES=1: the control plane
# alone, running workloads too; docs/adr/0027-kind-nodes.md). LOCALKUBE_MODE=host makes the
# single-node cluster of host processes instead (docs/adr/0005-local-cluster.md).
CLUSTER_FLAGS = $(if $(NODES),--nodes $(NODES))

cluster: install
	$(BIN)/python -m localkube up $(CLUSTER_FLAGS)

cluster-down: install
	$(BIN)/python -m localkube down $(CLUSTER_FLAGS)

cluster-env: install
	@$(BIN)/python -m localkube env $(CLUSTER_FLAGS)

# Only the slow, cacheable part of `make cluster`: compile the binaries (CI's warm-up step).
cluster-build: install host-packages
	$(BIN)/python -m localkube.build

# gregor-broker, gregor-operator and gregor-spark (:dev), loaded into the cluster if one runs
# (into every node of the kind cluster).
images: install
	$(BIN)/python -m localkube images

test-e2e: cluster images
	$(BIN)/pytest e2e $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache .hypothesis
