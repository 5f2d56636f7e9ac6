# syntax=docker/dockerfile:1
# dtq images: the gateway (the default target: small, non-root, with a gRPC health
# check) and `worker`, the reference Python worker running the demo's handlers.
#
# Redis is NOT part of the image: point DTQ_REDIS_URL at your Redis (>= 6.2). Without
# it the gateway would try to start an embedded redis-server, which the image does not
# ship, and exits with a one-line error saying so.
#
#   docker build -t dtq .                       # the gateway (last stage)
#   docker run --rm -p 50051:50051 -p 9464:9464 \
#       -e DTQ_REDIS_URL=redis://redis-host:6379/0 dtq
#   docker build --target worker -t dtq-worker .  # a worker with the demo handlers
#
# compose.yaml runs both (two gateways, Redis with AOF, a worker); docs/deploy.md.
#
# Every DTQ_* variable (docs/configuration.md) works as an environment variable or as
# a flag after the image name, e.g. `docker run ... dtq --log-level DEBUG`.

ARG PYTHON_IMAGE=python:3.11-slim

# ---- build: install the project (no dev extras) into a self-contained venv ----
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/dtq
WORKDIR /src
COPY pyproject.toml README.md ./
COPY dtq_proto ./dtq_proto
COPY dtq_gateway ./dtq_gateway
COPY dtq_pyworker ./dtq_pyworker
RUN /opt/dtq/bin/pip install --upgrade pip \
 && /opt/dtq/bin/pip install . \
 && find /opt/dtq -name '__pycache__' -prune -exec rm -rf {} +

# ---- runtime: the venv and a non-root user; the two images below build on it ----
FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 10001 dtq \
 && useradd --system --uid 10001 --gid dtq --home-dir /home/dtq --create-home \
            --shell /usr/sbin/nologin dtq
COPY --from=build /opt/dtq /opt/dtq
ENV PATH=/opt/dtq/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# numeric ids: a runtime that cannot read /etc/passwd still runs as non-root
USER 10001:10001
WORKDIR /home/dtq

# ---- worker (`--target worker`): dtq-pyworker running the demo's handlers ----
# compose.yaml runs it; replace examples/demo by your own handler module and CMD.
# dtq-pyworker imports its module:attr from the working directory.
FROM runtime AS worker
LABEL org.opencontainers.image.title="dtq-demo-worker" \
      org.opencontainers.image.description="dtq reference Python worker with the demo handlers" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY examples/__init__.py ./examples/
COPY examples/demo ./examples/demo
ENV DTQ_GATEWAY=gateway:50051 \
    DTQ_QUEUES=demo
# The worker drains on SIGTERM (stops taking tasks, hands back buffered ones,
# finishes running ones within DTQ_DRAIN_GRACE_MS); give `docker stop` that long.
STOPSIGNAL SIGTERM
ENTRYPOINT ["dtq-pyworker"]
CMD ["examples.demo.handlers:worker"]

# ---- gateway (the default target): dtq-gateway with a gRPC health check ----
FROM runtime AS gateway
LABEL org.opencontainers.image.title="dtq-gateway" \
      org.opencontainers.image.description="dtq gateway: gRPC front of a Redis Streams task queue" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV DTQ_LISTEN=0.0.0.0:50051 \
    DTQ_METRICS_PORT=9464 \
    DTQ_LOG_FORMAT=json
EXPOSE 50051 9464
# Asks grpc.health.v1.Health on the port of DTQ_LISTEN over plaintext; with TLS on
# (DTQ_TLS_CERT) replace it by a check that uses your certificates.
HEALTHCHECK --interval=10s --timeout=5s --start-period=15s --retries=3 \
  CMD ["python", "-c", "import os, sys, grpc; from grpc_health.v1 import health_pb2 as h, health_pb2_grpc as g; port = os.environ.get('DTQ_LISTEN', '0.0.0.0:50051').rpartition(':')[2]; ch = grpc.insecure_channel('127.0.0.1:' + port); r = g.HealthStub(ch).Check(h.HealthCheckRequest(service=''), timeout=3); sys.exit(0 if r.status == h.HealthCheckResponse.SERVING else 1)"]
# The gateway drains on SIGTERM (health NOT_SERVING, lease streams end, unary calls
# finish within DTQ_SHUTDOWN_GRACE_S); give `docker stop` at least that long.
STOPSIGNAL SIGTERM
ENTRYPOINT ["dtq-gateway"]
