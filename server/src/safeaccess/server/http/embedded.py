"""Run the API with uvicorn in a background thread on a loopback port (demo, tests, benchmarks)."""

from __future__ import annotations

import threading
import time

import uvicorn
from fastapi import FastAPI


class EmbeddedServer:
    """A uvicorn server in a daemon thread. Use as a context manager; `url` is set once started."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0):
        self._config = uvicorn.Config(
            app, host=host, port=port, log_level="warning", lifespan="off", access_log=False
        )
        self._server = uvicorn.Server(self._config)
        self._thread = threading.Thread(target=self._server.run, name="safeaccess-api", daemon=True)
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 20.0) -> EmbeddedServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the API server did not start on {self.host}:{self.port}")
            time.sleep(0.02)
        # With port 0 the OS chose a free port; read it back from the listening socket.
        sockets = [s for server in self._server.servers for s in server.sockets]
        self.port = int(sockets[0].getsockname()[1])
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
