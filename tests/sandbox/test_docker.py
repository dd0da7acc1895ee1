"""Docker backend parts that need no engine: container hardening, stream parsing, the warm pool,
image planning, configuration and the CLI's config update."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path, PurePosixPath

import pytest
import yaml

from safeaccess.sandbox.backend import LimitExceeded, Limits, SandboxError, SandboxUnavailable
from safeaccess.sandbox.config import DockerOptions
from safeaccess.sandbox.docker import DockerBackend, engine_address
from safeaccess.sandbox.docker.container import DatasetKey, _Demux, container_kwargs
from safeaccess.sandbox.docker.image import _closure, plan_rootfs
from safeaccess.sandbox.docker.pool import WarmPool

IMAGE = "sha256:" + "ab" * 32


def _dataset(tmp_path: Path, mode: int = 0o440) -> Path:
    path = tmp_path / "d.parquet"
    path.write_bytes(b"PAR1 not really parquet")
    path.chmod(mode)
    return path


def _kwargs(tmp_path: Path, limits: Limits) -> dict[str, object]:
    return container_kwargs(
        image=IMAGE,
        dataset=DatasetKey.of(_dataset(tmp_path)),
        limits=limits,
        cpus=1.5,
        labels={"a": "b"},
        name="n",
    )


# -- hardening -------------------------------------------------------------------------------


def test_container_is_hardened_as_the_issue_requires(tmp_path: Path) -> None:
    limits = Limits(memory_mb=300, max_processes=20, tmp_mb=32, cpu_seconds=7)
    kw = _kwargs(tmp_path, limits)
    assert kw["network_mode"] == "none"
    assert kw["read_only"] is True
    assert kw["cap_drop"] == ["ALL"]
    assert "cap_add" not in kw
    security_opt = kw["security_opt"]
    assert isinstance(security_opt, list)
    no_new_privileges, seccomp = security_opt
    assert no_new_privileges == "no-new-privileges"
    # Our own allow-list, not the engine's default profile: deny by default, no ptrace/mount/
    # unshare/bpf/keyctl, clone only without namespace flags.
    assert seccomp.startswith("seccomp=")
    profile = json.loads(seccomp.removeprefix("seccomp="))
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"
    allowed = {
        n
        for rule in profile["syscalls"]
        if rule["action"] == "SCMP_ACT_ALLOW" and "args" not in rule
        for n in rule["names"]
    }
    assert not allowed & {"ptrace", "mount", "unshare", "setns", "bpf", "keyctl", "socket"}
    assert {"read", "write", "mmap", "execve"} <= allowed
    assert kw["privileged"] is False
    assert kw["user"] == "10001:10001"
    assert kw["init"] is True
    assert kw["ipc_mode"] == "none"
    assert kw["pids_limit"] == 21  # 20 for the job + the init process
    assert kw["mem_limit"] == "300m" and kw["memswap_limit"] == "300m"
    assert kw["nano_cpus"] == 1_500_000_000
    tmpfs = kw["tmpfs"]
    assert isinstance(tmpfs, dict)
    opts = tmpfs["/tmp"].split(",")
    assert {"noexec", "nosuid", "nodev", "size=32m"} <= set(opts)
    ulimits = {u["Name"]: (u["Soft"], u["Hard"]) for u in kw["ulimits"]}  # type: ignore[attr-defined]
    assert ulimits["cpu"] == (7, 8)
    log = kw["log_config"]
    assert log["Type"] == "json-file" and log["Config"]["max-size"]  # type: ignore[index]
    mounts = kw["mounts"]
    assert isinstance(mounts, list) and len(mounts) == 1  # the dataset and nothing else
    assert mounts[0]["Type"] == "bind"
    assert mounts[0]["ReadOnly"] is True
    assert mounts[0]["Source"] == str((tmp_path / "d.parquet").resolve())
    assert mounts[0]["Target"] == "/data/dataset.parquet"
    assert "volumes" not in kw and "privileged" in kw


def test_dataset_key_changes_when_the_file_is_replaced(tmp_path: Path) -> None:
    path = _dataset(tmp_path, 0o644)
    before = DatasetKey.of(path)
    assert DatasetKey.of(path) == before
    replacement = tmp_path / "new.parquet"
    replacement.write_bytes(b"other bytes, other size")
    os.replace(replacement, path)
    assert DatasetKey.of(path) != before


def test_dataset_groups_follow_the_file_mode(tmp_path: Path) -> None:
    world = DatasetKey.of(_dataset(tmp_path, 0o444))
    assert world.sandbox_groups() == []
    group = DatasetKey.of(_dataset(tmp_path, 0o440))
    assert group.sandbox_groups() == [os.stat(tmp_path / "d.parquet").st_gid]
    owner_only = DatasetKey.of(_dataset(tmp_path, 0o600))
    with pytest.raises(SandboxError, match="group-readable"):
        owner_only.sandbox_groups()


def test_missing_dataset_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="cannot be read"):
        DatasetKey.of(tmp_path / "absent.parquet")


# -- the attach stream -------------------------------------------------------------------------


def _frame(stream: int, payload: bytes) -> bytes:
    return bytes([stream, 0, 0, 0]) + len(payload).to_bytes(4, "big") + payload


def test_demux_separates_streams_across_chunk_boundaries() -> None:
    data = _frame(1, b'{"ok":') + _frame(2, b"warning\n") + _frame(1, b"true}")
    demux = _Demux(max_stdout=1000)
    for i in range(0, len(data), 3):  # arbitrary cuts, inside headers too
        demux.feed(data[i : i + 3])
    assert bytes(demux.stdout) == b'{"ok":true}'
    assert bytes(demux.stderr_tail) == b"warning\n"


def test_demux_stops_a_flood_before_buffering_it_whole() -> None:
    demux = _Demux(max_stdout=1024)
    header = bytes([1, 0, 0, 0]) + (10 * 1024 * 1024).to_bytes(4, "big")
    demux.feed(header + b"x" * 1000)
    with pytest.raises(LimitExceeded) as info:
        demux.feed(b"x" * 100)  # still inside the one 10 MiB frame
    assert info.value.limit == "output"


# -- configuration and availability -------------------------------------------------------------


def test_engine_address_prefers_configuration_then_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    assert engine_address(DockerOptions()) == "unix:///var/run/docker.sock"
    monkeypatch.setenv("DOCKER_HOST", "tcp://10.0.0.1:2376")
    assert engine_address(DockerOptions()) == "tcp://10.0.0.1:2376"
    assert engine_address(DockerOptions(host="unix:///x.sock")) == "unix:///x.sock"


@pytest.mark.parametrize("image", [None, "safeaccess-sandbox:latest", "sha256:abc"])
def test_images_must_be_pinned(image: str | None) -> None:
    backend = DockerBackend(DockerOptions(image=image, host="unix:///nonexistent.sock"))
    with pytest.raises(SandboxUnavailable, match="image"):
        backend.check_available()


def test_unreachable_engine_is_reported(tmp_path: Path) -> None:
    sock = tmp_path / "no-engine.sock"
    backend = DockerBackend(DockerOptions(image=IMAGE, host=f"unix://{sock}"))
    with pytest.raises(SandboxUnavailable, match=r"does not answer|cannot reach"):
        backend.check_available()


# -- the warm pool --------------------------------------------------------------------------------


class _Items:
    """Fake containers: counts starts and stops, can be marked dead or made to fail."""

    def __init__(self) -> None:
        self.started: list[tuple[str, int]] = []
        self.stopped: list[tuple[str, int]] = []
        self.dead: set[tuple[str, int]] = set()
        self.fail = False
        self._lock = threading.Lock()

    def start(self, key: str) -> tuple[str, int]:
        if self.fail:
            raise SandboxError("engine refused")
        with self._lock:
            item = (key, len(self.started))
            self.started.append(item)
        return item

    def stop(self, item: tuple[str, int]) -> None:
        with self._lock:
            self.stopped.append(item)

    def alive(self, item: tuple[str, int]) -> bool:
        return item not in self.dead


def _pool(items: _Items, size: int = 2, max_keys: int = 2) -> WarmPool[str, tuple[str, int]]:
    return WarmPool(
        start=items.start, stop=items.stop, alive=items.alive, size=size, max_keys=max_keys
    )


def test_pool_fills_hands_out_each_container_once_and_refills() -> None:
    items = _Items()
    pool = _pool(items)
    try:
        pool.want("a")
        assert pool.wait_ready("a", 2, timeout=5)
        first, second = pool.take("a"), pool.take("a")
        assert first is not None and second is not None and first != second
        assert pool.take("a") is None  # empty until refilled: never handed out twice
        pool.want("a")  # the backend calls this after a job
        assert pool.wait_ready("a", 2, timeout=5)
        again = pool.take("a")
        assert again not in (first, second)
    finally:
        pool.close()


def test_pool_evicts_least_recent_dataset_and_close_stops_everything() -> None:
    items = _Items()
    pool = _pool(items, size=1, max_keys=2)
    for key in ("a", "b"):
        pool.want(key)
        assert pool.wait_ready(key, 1, timeout=5)
    pool.want("c")  # "a" is now the least recently used of three
    assert pool.wait_ready("c", 1, timeout=5)
    assert [k for k, _ in items.stopped] == ["a"]
    pool.close()
    assert sorted(k for k, _ in items.stopped) == ["a", "b", "c"]
    assert pool.take("b") is None


def test_pool_discards_dead_containers() -> None:
    items = _Items()
    pool = _pool(items, size=2)
    try:
        pool.want("a")
        assert pool.wait_ready("a", 2, timeout=5)
        items.dead.add(items.started[0])
        got = pool.take("a")
        assert got == items.started[1]
        assert items.started[0] in items.stopped
    finally:
        pool.close()


def test_pool_failure_is_recorded_and_jobs_run_cold() -> None:
    items = _Items()
    items.fail = True
    pool = _pool(items, size=1)
    try:
        pool.want("a")
        deadline = time.monotonic() + 5
        while pool.last_error is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool.last_error == "engine refused"
        assert pool.take("a") is None
    finally:
        pool.close()


# -- the image --------------------------------------------------------------------------------------


def test_image_closure_leaves_out_host_tools_and_the_server() -> None:
    names = {d.metadata["Name"].lower() for d in _closure("safeaccess-sandbox")}
    assert {"safeaccess-sandbox", "safeaccess-client", "safeaccess-rules", "pandas"} <= names
    assert "docker" not in names
    assert "safeaccess-server" not in names
    assert "fastapi" not in names


def test_image_plan_has_runtime_and_runner_but_no_server_tests_or_keys() -> None:
    rootfs = plan_rootfs()
    paths = [str(p) for p in rootfs.entries]
    site = "/opt/python/lib/python3.11/site-packages/"
    assert "/opt/python/bin/python3" in paths
    assert site + "safeaccess/sandbox/runner/__init__.py" in paths
    assert site + "safeaccess/sandbox/docker/entry.py" in paths
    assert site + "safeaccess/rules/outputs.py" in paths
    assert not any("/safeaccess/server/" in p for p in paths)
    assert not any("/tests/" in p for p in paths)
    # (certifi's public CA bundle is a .pem; no private key, database or dataset may be)
    assert not any(p.endswith(("_key.pem", ".db", ".sqlite", ".parquet")) for p in paths)
    assert not any(p.startswith(site + "docker/") for p in paths)
    passwd = rootfs.entries[PurePosixPath("/etc/passwd")].data or b""
    assert b":10001:10001:" in passwd and b"root" not in passwd


def test_set_sandbox_image_updates_only_that_key(tmp_path: Path) -> None:
    from safeaccess.server.config import set_sandbox_image

    config = tmp_path / "config.yaml"
    config.write_text(
        "server_id: centre-1\nsandbox:\n  backend: docker\n  docker:\n    pool_size: 2\n"
    )
    config.chmod(0o600)
    set_sandbox_image(config, IMAGE)
    raw = yaml.safe_load(config.read_text())
    assert raw == {
        "server_id": "centre-1",
        "sandbox": {"backend": "docker", "docker": {"pool_size": 2, "image": IMAGE}},
    }
    assert config.stat().st_mode & 0o777 == 0o600


def test_set_sandbox_image_leaves_an_invalid_config_untouched(tmp_path: Path) -> None:
    from safeaccess.server.config import set_sandbox_image

    config = tmp_path / "config.yaml"
    text = "server_id: centre-1\nsandbox:\n  docker:\n    pool_size: -1\n"
    config.write_text(text)
    from safeaccess.server.errors import ConfigError

    with pytest.raises(ConfigError, match="would not be valid"):
        set_sandbox_image(config, IMAGE)
    assert config.read_text() == text


def test_example_configuration_is_valid() -> None:
    from safeaccess.server.config import ServerConfig

    path = Path(__file__).resolve().parents[2] / "deploy" / "config.example.yaml"
    config = ServerConfig.model_validate(yaml.safe_load(path.read_text()))
    assert config.sandbox.backend == "docker"
    assert config.sandbox.docker.image is not None
    assert config.sandbox.docker.image.startswith("sha256:")


def test_prune_keeps_the_current_and_in_use_images() -> None:
    import docker.errors

    from safeaccess.sandbox.docker.image import LABEL_FINGERPRINT, prune_images

    class Image:
        def __init__(self, image_id: str, labels: dict[str, str]):
            self.id = image_id
            self.labels = labels

    class Images:
        def __init__(self) -> None:
            self.removed: list[str] = []
            self.items = [
                Image("sha256:current", {LABEL_FINGERPRINT: "a"}),
                Image("sha256:old", {LABEL_FINGERPRINT: "b"}),
                Image("sha256:in-use", {LABEL_FINGERPRINT: "c"}),
                Image("sha256:production", {}),  # built from the Dockerfile: not ours to prune
            ]

        def list(self, filters: dict[str, str]) -> list[Image]:
            return self.items

        def remove(self, image_id: str) -> None:
            if image_id == "sha256:in-use":
                raise docker.errors.APIError("conflict: image is being used by a container")
            self.removed.append(image_id)

    class Client:
        images = Images()

    client = Client()
    assert prune_images(client, keep="sha256:current") == ["sha256:old"]  # type: ignore[arg-type]
    assert client.images.removed == ["sha256:old"]
