# vllm-triage: the sidecar image.
#   docker build -t vllm-triage .
#   docker run --read-only -p 9468:9468 -v ./triage.yaml:/etc/vllm-triage/triage.yaml:ro vllm-triage
# Each release publishes it, for linux/amd64 and linux/arm64, as
# ghcr.io/vllm-triage/vllm-triage:<version> (.github/workflows/release.yml); the sidecar
# manifests name that. Your own build: push it where your cluster pulls from and name it
# with `vllm-triage render sidecar --image`:
#   docker build -t registry.example.com/ml/vllm-triage:0.1.0 . && docker push registry.example.com/ml/vllm-triage:0.1.0
#
# Two stages: the build stage installs the package into a virtual environment; the final
# stage copies only that environment onto a fresh slim base (no pip cache, no sources).
# It runs as a numeric non-root user and writes nothing to its root filesystem (bytecode
# is compiled at build time, logs go to stderr), so it works with a read-only root
# filesystem; its alert state goes to /var/lib/vllm-triage, a volume.
# vllm-triage handles SIGTERM itself as PID 1: it stops scraping, delivers pending
# notifications for up to shutdown_grace_seconds, and exits 0.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY daemon/ daemon/
COPY rules/ rules/
RUN python -m venv /opt/vllm-triage \
 && /opt/vllm-triage/bin/pip install --no-cache-dir . \
 && /opt/vllm-triage/bin/python -m compileall -q /opt/vllm-triage

FROM python:3.11-slim
LABEL org.opencontainers.image.title="vllm-triage" \
      org.opencontainers.image.description="Tells why a vLLM server is slow, from its /metrics" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/vllm-triage /opt/vllm-triage
COPY deploy/container/triage.yaml /etc/vllm-triage/triage.yaml
# state_dir in triage.yaml: open incidents and undelivered notifications survive a
# restart there. A volume, so it is writable under --read-only; owned by the runtime
# user, which a new named volume inherits.
RUN mkdir -p /var/lib/vllm-triage && chown 65532:65532 /var/lib/vllm-triage
VOLUME ["/var/lib/vllm-triage"]
ENV PATH=/opt/vllm-triage/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
EXPOSE 9468
# /healthz answers while the process lives; it is on the default listen port (9468).
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
  CMD ["python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:9468/healthz', timeout=3)"]
ENTRYPOINT ["vllm-triage"]
CMD ["run", "--config", "/etc/vllm-triage/triage.yaml"]
