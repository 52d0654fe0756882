# syntax=docker/dockerfile:1
# One image for the three hami-accounting daemons; the command picks the daemon:
#   docker run hami-accounting serve usage|admission|scheduler
# Build: docker build -t hami-accounting .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- builder: builds the wheel and installs it, with its dependencies, into /opt/venv -------------
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/venv
# The build context is an allow-list (.dockerignore): the package sources, gen/ and metadata only.
# LICENSE is pyproject's license-files: without it the wheel, and so the image, ships no licence
# (the installed package's dist-info/licenses/LICENSE).
COPY pyproject.toml README.md LICENSE ./
COPY accounting/ accounting/
COPY whatif/ whatif/
COPY services/ services/
COPY gen/ gen/
# A real (non-editable) wheel, so the final image needs neither /src nor the build backend.
RUN /opt/venv/bin/pip wheel --no-deps --wheel-dir /tmp/wheels . \
 && /opt/venv/bin/pip install /tmp/wheels/*.whl \
 && /opt/venv/bin/pip uninstall -y pip setuptools \
 && /opt/venv/bin/hami-accounting --help >/dev/null

# --- final: the interpreter, the venv and an unprivileged user; no compilers, no pip ------------
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="hami-accounting" \
      org.opencontainers.image.description="GPU resource accounting for pods with init containers and native sidecars, for HAMi" \
      org.opencontainers.image.licenses="Apache-2.0"
# 65532 is the conventional "nonroot" UID; Kubernetes manifests pin runAsUser to it.
RUN groupadd --system --gid 65532 hami \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin hami \
 && install -d -o 65532 -g 65532 -m 0750 /var/lib/hami-accounting \
 && python -m pip uninstall -y pip setuptools wheel
COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HAMI_ACCOUNTING_DATA_DIR=/var/lib/hami-accounting
# A named volume mounted here starts with this directory's owner (65532), so it is writable.
WORKDIR /var/lib/hami-accounting
USER 65532:65532
# gRPC: admission 50051, scheduler 50052, usage 50053; AdmissionReview webhook 8443;
# Prometheus metrics: admission 9101, scheduler 9102, usage 9103.
EXPOSE 50051 50052 50053 8443 9101 9102 9103
# Standard gRPC health checking against the daemon's own port, taken from LISTEN_ADDR
# (containers set 0.0.0.0:<port>); without it, the default daemon's port (usage, 50053).
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
  CMD ["/bin/sh", "-c", "addr=\"${HAMI_ACCOUNTING_LISTEN_ADDR:-127.0.0.1:50053}\"; exec hami-accounting health \"127.0.0.1:${addr##*:}\""]
ENTRYPOINT ["hami-accounting"]
CMD ["serve", "usage"]
