"""The Docker sandbox backend: hardened per-job containers, a warm pool, and the image builder.

`DockerBackend(options=DockerOptions, limits=Limits)` is what `safeaccess.sandbox.factory.make_backend`
builds; `build_image(client)` makes the sandbox image from the local Python installation.
"""

from safeaccess.sandbox.docker.backend import DockerBackend, connect, engine_address
from safeaccess.sandbox.docker.image import BuiltImage, ImageBuildError, build_image

__all__ = [
    "BuiltImage",
    "DockerBackend",
    "ImageBuildError",
    "build_image",
    "connect",
    "engine_address",
]
