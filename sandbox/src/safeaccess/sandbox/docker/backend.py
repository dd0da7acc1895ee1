"""The Docker sandbox backend: each job in its own hardened container, optionally pre-started."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import threading
import time
import uuid
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import docker
import docker.errors
from docker.models.containers import Container

from safeaccess.sandbox.backend import (
    DATASET_PATH,
    STOPPING,
    Job,
    Limits,
    RunnerRequest,
    RunResult,
    SandboxError,
    SandboxUnavailable,
    expected_output,
    side_arrays,
)
from safeaccess.sandbox.config import DockerOptions
from safeaccess.sandbox.docker.container import (
    LABEL_OWNER,
    LABEL_ROLE,
    DatasetKey,
    JobContainer,
    container_kwargs,
    owner_label,
)
from safeaccess.sandbox.docker.image import LABEL_KIND
from safeaccess.sandbox.docker.pool import WarmPool
from safeaccess.sandbox.supervise import limit_exceeded

log = logging.getLogger(__name__)

DEFAULT_HOST = "unix:///var/run/docker.sock"
ROLE = "job"
_IMAGE_ID = re.compile(r"^sha256:[0-9a-f]{64}$")
_IMAGE_DIGEST = re.compile(r"^[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64}$")

PoolKey = tuple[DatasetKey, Limits]
# Time a pooled container may take to start and preload the analysis libraries.
POOL_READY_SECONDS = 120.0


def engine_address(options: DockerOptions) -> str:
    """The engine to use: the configured host, else DOCKER_HOST, else the local socket."""
    return options.host or os.environ.get("DOCKER_HOST") or DEFAULT_HOST


def connect(host: str) -> docker.DockerClient:
    """A client for exactly `host` (CLI contexts are ignored); TLS settings come from DOCKER_*."""
    kwargs = docker.utils.kwargs_from_env()
    kwargs["base_url"] = host
    return docker.DockerClient(timeout=60, **kwargs)


class DockerBackend:
    """Runs each job in a fresh container on a Docker Engine; see docs/docker.md."""

    name = "docker"

    def __init__(
        self,
        options: DockerOptions | None = None,
        limits: Limits | None = None,
        *,
        cpus: float = 1.0,
        pool_datasets: int = 4,
    ):
        self.options = options or DockerOptions()
        self.limits = limits or Limits()
        self.cpus = cpus
        self.host = engine_address(self.options)
        self._client: docker.DockerClient | None = None
        self._client_lock = threading.Lock()
        self._owner = owner_label()
        self._pool: WarmPool[PoolKey, JobContainer] | None = None
        pool_size = self.options.pool_size or 0  # unset: make_backend sizes it from concurrency
        if pool_size > 0:
            self._pool = WarmPool(
                start=lambda key: self._start_container(key, POOL_READY_SECONDS),
                stop=self._discard_later,  # evictions must not delay the job that caused them
                alive=self._alive,
                size=pool_size,
                max_keys=pool_datasets,
            )
        # Removing a finished container takes tens of ms; do it off the job's critical path.
        self._reaper = ThreadPoolExecutor(max_workers=2, thread_name_prefix="sandbox-reaper")
        self._closed = False
        # Set by `abandon`; the containers running a job now, which it stops.
        self._abandoned = False
        self._running: set[JobContainer] = set()
        self._running_lock = threading.Lock()
        # Warm containers must not outlive the process, even if nobody calls close().
        self._release = weakref.finalize(self, _release, self._pool, self._reaper)

    # -- engine and image ---------------------------------------------------------------------

    @property
    def client(self) -> docker.DockerClient:
        with self._client_lock:
            if self._client is None:
                try:
                    self._client = connect(self.host)
                except docker.errors.DockerException as exc:
                    raise SandboxUnavailable(
                        f"cannot reach the Docker Engine at {self.host}: {exc}"
                    ) from exc
            return self._client

    @property
    def image(self) -> str:
        image = self.options.image
        if not image:
            raise SandboxUnavailable(
                "no sandbox image is configured (sandbox.docker.image); build one with "
                "'safeaccess-server sandbox build-image --config CONFIG' and it is written there"
            )
        if not (_IMAGE_ID.match(image) or _IMAGE_DIGEST.match(image)):
            raise SandboxUnavailable(
                f"sandbox image {image!r} is not an image id (sha256:...) or digest "
                "(name@sha256:...); a floating tag could change under a running service"
            )
        return image

    def check_available(self) -> None:
        """Raise SandboxUnavailable unless the engine answers and the sandbox image is present."""
        image = self.image
        try:
            self.client.ping()
        except docker.errors.DockerException as exc:
            raise SandboxUnavailable(
                f"the Docker Engine at {self.host} does not answer: {exc}"
            ) from exc
        except Exception as exc:  # connection refused/reset surface as requests errors
            raise SandboxUnavailable(
                f"the Docker Engine at {self.host} does not answer: {exc}"
            ) from exc
        try:
            found = self.client.images.get(image)
        except docker.errors.ImageNotFound:
            raise SandboxUnavailable(
                f"sandbox image {image} is not on the Docker Engine at {self.host}; build it with "
                "'safeaccess-server sandbox build-image'"
            ) from None
        except docker.errors.APIError as exc:
            raise SandboxUnavailable(f"cannot inspect sandbox image {image}: {exc}") from exc
        labels = (found.attrs.get("Config") or {}).get("Labels") or {}
        if labels.get(LABEL_KIND) != "sandbox" and not _IMAGE_DIGEST.match(image):
            raise SandboxUnavailable(
                f"image {image} is not a safeaccess sandbox image (label {LABEL_KIND} missing)"
            )
        self.reap_orphans()

    def reap_orphans(self) -> int:
        """Remove job containers left behind by a crashed process of this host; return how many."""
        host = socket.gethostname()
        removed = 0
        try:
            found = self.client.containers.list(all=True, filters={"label": f"{LABEL_ROLE}={ROLE}"})
        except docker.errors.APIError:
            return 0
        for container in found:
            owner = (container.labels or {}).get(LABEL_OWNER, "")
            owner_host, pid, _token = (
                owner.rsplit("/", 2) if owner.count("/") >= 2 else ("", "", "")
            )
            if owner_host != host or not pid.isdigit():
                continue
            if _pid_alive(int(pid)):
                continue
            self._remove_now(container)
            removed += 1
        return removed

    # -- containers ---------------------------------------------------------------------------

    def _start_container(
        self, key: PoolKey, ready_timeout: float, *, preload: bool = True
    ) -> JobContainer:
        """Create and start a job container, attach to it and wait until it is ready."""
        dataset, limits = key
        kwargs = container_kwargs(
            image=self.image,
            dataset=dataset,
            limits=limits,
            cpus=self.cpus,
            labels={LABEL_ROLE: ROLE, LABEL_OWNER: self._owner},
            name=f"safeaccess-job-{uuid.uuid4().hex[:16]}",
            preload=preload,
        )
        try:
            container = self.client.containers.create(**kwargs)
        except docker.errors.ImageNotFound as exc:
            raise SandboxUnavailable(f"sandbox image {self.image} is gone from the engine") from exc
        except docker.errors.APIError as exc:
            raise SandboxError(
                f"the Docker Engine refused to create a sandbox container: {exc}"
            ) from exc
        job = JobContainer(container, self.client.api)
        try:
            job.start(ready_timeout)
        except docker.errors.APIError as exc:
            self._discard(job)
            raise SandboxError(
                f"the Docker Engine could not start a sandbox container: {exc}"
            ) from exc
        except BaseException:
            self._discard(job)
            raise
        return job

    def _alive(self, job: JobContainer) -> bool:
        try:
            job.container.reload()
        except docker.errors.APIError:
            return False
        return bool(job.container.status == "running")

    def _remove_now(self, container: Container) -> None:
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            log.warning("could not remove sandbox container %s: %s", container.short_id, exc)

    def _discard(self, job: JobContainer) -> None:
        job.close()
        self._remove_now(job.container)

    def _discard_later(self, job: JobContainer) -> None:
        if self._closed:
            self._discard(job)
            return
        try:
            self._reaper.submit(self._discard, job)
        except RuntimeError:  # the executor is shut down (interpreter exit): remove it here
            self._discard(job)

    # -- jobs ---------------------------------------------------------------------------------

    def prewarm(self, dataset: Path, limits: Limits | None = None) -> None:
        """Start filling the warm pool for a dataset (e.g. when a sequence on it opens)."""
        if self._pool is not None:
            self._pool.want((DatasetKey.of(dataset), limits or self.limits))

    def wait_warm(self, dataset: Path, limits: Limits | None = None, timeout: float = 60.0) -> bool:
        """Block until the pool holds its full size for this dataset (benchmarks, tests)."""
        if self._pool is None:
            return False
        key = (DatasetKey.of(dataset), limits or self.limits)
        self._pool.want(key)
        return self._pool.wait_ready(key, self._pool.size, timeout)

    def run(self, job: Job) -> RunResult:
        """Run one job in its own container; raise a SandboxError subclass on any failure."""
        try:
            return self._run(job)
        except SandboxError as exc:
            if self._abandoned:  # stopped by `abandon`: not the analysis's doing
                raise SandboxUnavailable(STOPPING) from exc
            raise

    def _run(self, job: Job) -> RunResult:
        if self._abandoned:
            raise SandboxUnavailable(STOPPING)
        if self._closed:
            raise SandboxUnavailable("this Docker backend has been closed")
        started = time.monotonic()
        key: PoolKey = (DatasetKey.of(job.dataset), job.limits)
        request = (
            RunnerRequest(analysis=job.analysis, metadata=job.metadata, dataset_path=DATASET_PATH)
            .model_dump_json()
            .encode("utf-8")
        )
        job_container = self._pool.take(key) if self._pool is not None else None
        if job_container is None:
            remaining = started + job.limits.wall_seconds - time.monotonic()
            try:
                job_container = self._start_container(key, remaining, preload=False)
            except SandboxError:
                if time.monotonic() >= started + job.limits.wall_seconds:
                    raise limit_exceeded("wall", job.limits) from None
                raise
            except Exception as exc:  # the engine connection failed (requests/urllib3 errors)
                raise SandboxError(f"the Docker Engine failed to start the job: {exc}") from exc
        with self._running_lock:
            self._running.add(job_container)
        try:
            if self._abandoned:  # abandoned while the container was taken: it never starts
                raise SandboxUnavailable(STOPPING)
            response = job_container.run(request, job.limits, started)
        except SandboxError:
            raise
        except Exception as exc:  # the engine connection failed mid-job
            raise SandboxError(f"the Docker Engine failed during the job: {exc}") from exc
        finally:
            with self._running_lock:
                self._running.discard(job_container)
            self._discard_later(job_container)
            if self._pool is not None:
                self._pool.want(key)  # refill now that this job no longer needs the CPU
        if self._abandoned:  # the run ended as `abandon` stopped it: the job is handed back
            raise SandboxUnavailable(STOPPING)
        output = expected_output(job, response.output)
        return RunResult(
            output=output,
            wall_seconds=time.monotonic() - started,
            backend=self.name,
            query_sets=side_arrays(output),
        )

    def abandon(self) -> None:
        """Stop the containers running a job now and serve no more (a stopping worker hands
        its jobs back to the queue): each run cut short raises SandboxUnavailable."""
        self._abandoned = True
        with self._running_lock:
            running = list(self._running)
        for job_container in running:
            with contextlib.suppress(Exception):  # the engine away: the container's own limits
                job_container.interrupt()
        self.close()

    def close(self) -> None:
        """Remove the warm containers and wait for finished ones to be removed."""
        if self._closed:
            return
        self._closed = True
        self._release()
        if self._client is not None:
            self._client.close()


def _release(pool: WarmPool[PoolKey, JobContainer] | None, reaper: ThreadPoolExecutor) -> None:
    if pool is not None:
        pool.close()
    reaper.shutdown(wait=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
