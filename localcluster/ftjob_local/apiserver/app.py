"""Running the server: in the foreground (the `python -m` entry point) or on a background thread (tests, tools)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from .server import ApiServer


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


async def _serve(server: ApiServer, sock: socket.socket) -> web.AppRunner:
    # handler_cancellation: a client that goes away (kubectl get -w, Ctrl-C) ends its watch at once.
    runner = web.AppRunner(server.app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    return runner


def _write_url(state_dir: str, url: str) -> None:
    """DIR/apiserver.url tells other processes where the server listens (written atomically once ready)."""
    path = os.path.join(state_dir, "apiserver.url")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(url + "\n")
    os.replace(tmp, path)


@dataclass
class ServerHandle:
    url: str
    server: ApiServer
    stop: Callable[[], None]
    loop: asyncio.AbstractEventLoop | None = None

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` on the server's event loop (the only thread that may touch its state)."""
        assert self.loop is not None

        async def run() -> Any:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=30)


def start_in_thread(state_dir: str, port: int = 0, host: str = "127.0.0.1") -> ServerHandle:
    """Start the server on a daemon thread; returns once it accepts connections. Call `.stop()` to end it."""
    server = ApiServer(state_dir)
    try:
        sock = _bind(host, port)
    except OSError:
        server.store.close()
        raise
    url = f"http://{host}:{sock.getsockname()[1]}"
    server.address = f"{host}:{sock.getsockname()[1]}"
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    state: dict[str, object] = {}

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            state["runner"] = loop.run_until_complete(_serve(server, sock))
        except BaseException as e:  # reported to the caller below
            state["error"] = e
            ready.set()
            return
        ready.set()
        loop.run_forever()
        loop.run_until_complete(state["runner"].cleanup())  # type: ignore[union-attr]
        loop.close()

    thread = threading.Thread(target=run, name="ftjob-apiserver", daemon=True)
    thread.start()
    ready.wait()
    if "error" in state:
        sock.close()
        server.store.close()
        raise RuntimeError(f"the API server did not start: {state['error']}")
    _write_url(server.state_dir, url)
    stopped = threading.Event()

    def stop() -> None:
        if stopped.is_set():
            return
        stopped.set()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        server.store.close()

    return ServerHandle(url, server, stop, loop)


def run_forever(state_dir: str, port: int, host: str = "127.0.0.1") -> None:
    os.makedirs(state_dir, exist_ok=True)
    try:  # a URL left by an earlier run must not be mistaken for this one's
        os.remove(os.path.join(state_dir, "apiserver.url"))
    except FileNotFoundError:
        pass
    server = ApiServer(state_dir)
    try:
        sock = _bind(host, port)
    except OSError:
        server.store.close()
        raise
    url = f"http://{host}:{sock.getsockname()[1]}"
    server.address = f"{host}:{sock.getsockname()[1]}"

    async def main() -> None:
        runner = await _serve(server, sock)
        _write_url(server.state_dir, url)
        print(f"ftjob apiserver listening on {url} (state in {server.state_dir})", flush=True)
        done = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, done.set)
        await done.wait()
        await runner.cleanup()

    try:
        asyncio.run(main())
    finally:
        server.store.close()
