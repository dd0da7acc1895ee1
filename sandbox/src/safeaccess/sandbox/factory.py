"""Building the configured sandbox backend (`make_backend`). CONTRACT used by the server and the demo.

The configuration itself (`SandboxConfig`, `DockerOptions`, the environment override) is in
`safeaccess.sandbox.config`, which the backends may import without importing this module.
"""

from __future__ import annotations

from safeaccess.sandbox.backend import Backend
from safeaccess.sandbox.config import SandboxConfig, resolve_backend_name


def make_backend(config: SandboxConfig, *, concurrency: int = 1) -> Backend:
    """Build the configured backend and check that it can isolate jobs here (else raise).

    `concurrency` is how many jobs the server runs at once: the Docker warm pool's default size.
    """
    name = resolve_backend_name(config)
    backend: Backend
    if name == "process":
        from safeaccess.sandbox.process import ProcessBackend

        backend = ProcessBackend(limits=config.limits)
    else:
        from safeaccess.sandbox.docker import DockerBackend

        options = config.docker
        if options.pool_size is None:
            options = options.model_copy(update={"pool_size": concurrency})
        backend = DockerBackend(options=options, limits=config.limits)
    backend.check_available()
    return backend
