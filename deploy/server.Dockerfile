# syntax=docker/dockerfile:1
# The safeaccess controller service: API, store, pipeline, admin CLI.
#
#   docker build -f deploy/server.Dockerfile -t safeaccess-server:0.1.0 .
#
# Runs as the unprivileged user `safeaccess` (uid/gid 10000). State lives in the data directory,
# /var/lib/safeaccess, which must be a bind mount at the SAME path on the host when the Docker
# sandbox backend is used: the engine resolves a job's dataset bind mount on the host, so the
# path the server passes must mean the same file there (see deploy/compose.yaml, docs/docker.md).
# Pin PYTHON_IMAGE to a digest in your own build pipeline.

ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm

FROM ${PYTHON_IMAGE} AS wheels
WORKDIR /src
COPY client/pyproject.toml client/
COPY client/src client/src
COPY rules/pyproject.toml rules/
COPY rules/src rules/src
COPY sandbox/pyproject.toml sandbox/
COPY sandbox/src sandbox/src
COPY server/pyproject.toml server/
COPY server/src server/src
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels ./client ./rules ./sandbox ./server

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    SAFEACCESS_DATA=/var/lib/safeaccess
COPY --from=wheels /wheels /tmp/wheels
# bubblewrap serves the process backend; the Docker backend needs only the engine's socket.
RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap \
 && rm -rf /var/lib/apt/lists/* \
 && server_wheel="$(ls /tmp/wheels/safeaccess_server-*.whl)" \
 && pip install --no-cache-dir /tmp/wheels/safeaccess_client-*.whl /tmp/wheels/safeaccess_rules-*.whl \
      /tmp/wheels/safeaccess_sandbox-*.whl "${server_wheel}[postgresql]" \
 && rm -rf /tmp/wheels \
 && groupadd --gid 10000 safeaccess \
 && useradd --uid 10000 --gid 10000 --no-create-home --home-dir /var/lib/safeaccess --shell /usr/sbin/nologin safeaccess \
 && install -d -o 10000 -g 10000 -m 0700 /var/lib/safeaccess
USER 10000:10000
WORKDIR /var/lib/safeaccess
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s \
  CMD python -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:8000/v1/health', timeout=4)" || exit 1
# `safeaccess-server serve` refuses to start when the configured sandbox cannot isolate jobs.
CMD ["safeaccess-server", "serve", "--data-dir", "/var/lib/safeaccess", "--host", "0.0.0.0", "--port", "8000"]
