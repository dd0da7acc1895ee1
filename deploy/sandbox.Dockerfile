# syntax=docker/dockerfile:1
# The production sandbox image: Python, the analysis runner and the pinned analysis libraries.
# Nothing else: no server code, no data, no keys, no tests, no package installer.
#
#   docker build -f deploy/sandbox.Dockerfile -t safeaccess-sandbox:0.1.0 .
#   docker image inspect --format '{{.Id}}' safeaccess-sandbox:0.1.0
#
# Configure the printed id (sha256:...) as sandbox.docker.image: the server refers to the image by
# id or digest, never by a tag. Pin PYTHON_IMAGE to a digest (python:3.11.7-slim-bookworm@sha256:...)
# in your own build pipeline. Where no registry is reachable, `safeaccess-server sandbox build-image`
# builds an equivalent image from the local Python installation instead.

ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm

# -- build stage: wheels of our three sandbox-side distributions ------------------------------
FROM ${PYTHON_IMAGE} AS wheels
WORKDIR /src
COPY client/pyproject.toml client/
COPY client/src client/src
COPY rules/pyproject.toml rules/
COPY rules/src rules/src
COPY sandbox/pyproject.toml sandbox/
COPY sandbox/src sandbox/src
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels ./client ./rules ./sandbox

# -- the sandbox image -------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp \
    LANG=C.UTF-8
COPY deploy/requirements-sandbox.txt /tmp/requirements.txt
COPY --from=wheels /wheels /tmp/wheels
# Our packages without their declared dependencies: the docker SDK and bubblewrap are host-side
# tools that have no business inside a sandbox. Then remove the installer itself.
RUN pip install --no-cache-dir -r /tmp/requirements.txt \
 && pip install --no-cache-dir --no-deps /tmp/wheels/*.whl \
 && python -c "import safeaccess.sandbox.runner, safeaccess.sandbox.docker.entry" \
 && python -m compileall -q "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
 && rm -rf /tmp/requirements.txt /tmp/wheels \
 && pip uninstall -y pip setuptools wheel \
 && groupadd --gid 10001 sandbox \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin sandbox \
 && mkdir -p /data
LABEL org.safeaccess.sandbox.image="sandbox"
USER 10001:10001
WORKDIR /tmp
# Started by the Docker backend with stdin open: preloads, says it is ready, serves one request.
CMD ["python3", "-I", "-B", "-m", "safeaccess.sandbox.docker.entry"]
