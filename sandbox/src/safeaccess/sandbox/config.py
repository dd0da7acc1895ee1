"""The sandbox section of the server configuration: which backend, its limits, Docker's options.

`SandboxConfig` is the `sandbox` section of the server configuration. The environment variable
`SAFEACCESS_SANDBOX_BACKEND` (process | docker) overrides the configured backend, so the demo and
tests can switch with one line.
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from safeaccess.sandbox.backend import Limits, SandboxUnavailable

BackendName = Literal["process", "docker"]
ENV_BACKEND = "SAFEACCESS_SANDBOX_BACKEND"


class DockerOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str | None = Field(
        default=None,
        description="Engine address, e.g. unix:///var/run/docker.sock; default: DOCKER_HOST, "
        "else the standard local socket.",
    )
    image: str | None = Field(
        default=None, description="Sandbox image id or digest (never a floating tag)."
    )
    pool_size: int | None = Field(
        default=None,
        ge=0,
        le=64,
        description="Warm containers kept waiting per dataset; default: the server's "
        "max_concurrent_jobs (every job that may run at once finds one ready).",
    )


class SandboxConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: BackendName = "process"
    limits: Limits = Field(default_factory=Limits)
    docker: DockerOptions = Field(default_factory=DockerOptions)


def resolve_backend_name(config: SandboxConfig) -> BackendName:
    """The backend to use: the environment override if set, else the configuration."""
    override = os.environ.get(ENV_BACKEND, "").strip()
    if not override:
        return config.backend
    if override not in ("process", "docker"):
        raise SandboxUnavailable(
            f"{ENV_BACKEND}={override!r} is not a sandbox backend; use 'process' or 'docker'"
        )
    return override  # type: ignore[return-value]
