"""The Docker sandbox backend: hardened per-job containers, a warm pool, and the image builder.

`DockerBackend(options=DockerOptions, limits=Limits)` is what `safeaccess.sandbox.factory.make_backend`
builds; `build_image(client)` makes the sandbox image from the local Python installation.

The names are imported on first use (PEP 562): the container's own entry point lives in this
package, and inside the image importing the package must not import the Docker SDK, which the
image leaves out.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from safeaccess.sandbox.docker.backend import DockerBackend, connect, engine_address
    from safeaccess.sandbox.docker.image import BuiltImage, ImageBuildError, build_image

_HOME = {
    "BuiltImage": "safeaccess.sandbox.docker.image",
    "DockerBackend": "safeaccess.sandbox.docker.backend",
    "ImageBuildError": "safeaccess.sandbox.docker.image",
    "build_image": "safeaccess.sandbox.docker.image",
    "connect": "safeaccess.sandbox.docker.backend",
    "engine_address": "safeaccess.sandbox.docker.backend",
}

__all__ = [
    "BuiltImage",
    "DockerBackend",
    "ImageBuildError",
    "build_image",
    "connect",
    "engine_address",
]


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
