"""`serve` and `worker` freeze their start-up objects out of the cyclic collector before they
serve (`server/heap.py`): a full collection no longer walks the whole start-up heap."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest

from safeaccess.server.admin.cli import main as server_cli
from safeaccess.server.config import initialise
from safeaccess.server.heap import freeze_startup_objects


@pytest.fixture
def unfreeze() -> Any:
    yield
    gc.unfreeze()  # give the test process's objects back to the collector


def _walked_by_a_full_collection(objects: list[Any]) -> bool:
    """Whether all of `objects` are in the generations a full collection walks."""
    walked = {id(o) for o in gc.get_objects()}
    return all(id(o) in walked for o in objects)


def test_start_up_objects_are_left_out_of_a_full_collection(unfreeze: Any) -> None:
    # Long-lived containers, as a server's modules, caches and models are.
    kept = [{"n": i, "items": [i, str(i)]} for i in range(1000)]
    gc.unfreeze()
    assert _walked_by_a_full_collection([kept, *kept])
    freeze_startup_objects()
    assert gc.get_freeze_count() >= 2 * len(kept)
    assert not any(id(o) in {id(w) for w in gc.get_objects()} for o in (kept, kept[0], kept[-1]))
    # Made after start-up: collected as before.
    later = [{"n": [i]} for i in range(10)]
    assert _walked_by_a_full_collection([later, *later])


def test_serve_freezes_before_it_serves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unfreeze: Any
) -> None:
    import uvicorn

    seen: list[int] = []
    # serve runs a uvicorn.Server of its own (stopping admissions on SIGTERM): its run, not
    # a real server, records the freeze count at the moment serving would begin
    monkeypatch.setattr(
        uvicorn.Server, "run", lambda self, sockets=None: seen.append(gc.get_freeze_count())
    )
    root = tmp_path / "data"
    initialise(root, server_id="heap")
    gc.unfreeze()
    assert server_cli(["serve", "--data-dir", str(root), "--port", "0"]) == 0
    assert len(seen) == 1 and seen[0] > 0
