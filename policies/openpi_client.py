"""A client for openpi's policy server (``scripts/serve_policy.py``) that survives real servers.

The wire format (openpi's ``websocket_policy_server`` and its ``openpi-client`` package):

* a websocket (no compression, no size limit); optional ``Authorization: Api-Key <key>``;
  the server also answers ``GET /healthz`` with plain HTTP;
* on connect the server sends one binary frame: its metadata, msgpack;
* per request the client sends one observation dict, msgpack, and receives the action dict
  (``{"actions": (H, A), "server_timing": ...}``); an error arrives as a text frame (the
  server's traceback) and the server then closes the connection (1011);
* numpy arrays travel as msgpack maps ``{b"__ndarray__": True, b"data": raw bytes,
  b"dtype": dtype.str, b"shape": shape}``, numpy scalars as ``{b"__npgeneric__": True,
  b"data": value, b"dtype": dtype.str}``.

``openpi-client`` itself pins numpy<2 and cannot share this environment, so the format is
spoken here directly; the tests check it against ``openpi_client.msgpack_numpy`` running in
an interpreter of its own (``scripts/install_openpi_env.sh``).

What a real server does that the happy path does not: it may not be listening yet, be
something else on that port (an HTTP server), accept and never send its metadata, hang in
``infer``, fail with a traceback, or restart mid-run. Each has a bound (:class:`Timeouts`)
and a one-line error naming the server; a server that went away and came back within
``reconnect_s`` is reconnected and the caller is told the episodes in flight were lost
(:class:`~rlinf_user.policies.base.EpisodeInterrupted`), so a run goes on.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlinf_user.policies.base import EpisodeInterrupted, PolicyUnavailable

log = logging.getLogger(__name__)


def _unpack_error() -> type[Exception]:
    import msgpack  # imported where used: composing a config imports every policy's module

    return msgpack.UnpackException


def _pack_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind in "VOc":
            raise ValueError(f"cannot send an array of dtype {obj.dtype} to an openpi server")
        return {b"__ndarray__": True, b"data": np.ascontiguousarray(obj).tobytes(), b"dtype": obj.dtype.str, b"shape": obj.shape}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise TypeError(f"cannot send {type(obj).__name__} to an openpi server")


def _unpack_hook(obj: dict) -> Any:
    if b"__ndarray__" in obj:
        return np.ndarray(buffer=obj[b"data"], dtype=np.dtype(obj[b"dtype"]), shape=tuple(obj[b"shape"]))
    if b"__npgeneric__" in obj:
        return np.dtype(obj[b"dtype"]).type(obj[b"data"])
    return obj


def packb(obj: Any) -> bytes:
    import msgpack

    return msgpack.packb(obj, default=_pack_default)


def unpackb(data: bytes) -> Any:
    import msgpack

    return msgpack.unpackb(data, object_hook=_unpack_hook)


class OpenpiServerError(PolicyUnavailable):
    """The server failed (its traceback in ``details``), hung, or went away for good."""

    def __init__(self, message: str, details: str | None = None):
        super().__init__(message)
        self.details = details


class OpenpiReconnected(EpisodeInterrupted):
    """The connection broke and a new one is up: the request in flight was never answered."""


@dataclass
class Timeouts:
    """``policy.timeouts``: seconds each wait on the server may take."""

    connect_s: float = 10.0  # the TCP connection and the websocket handshake
    metadata_s: float = 10.0  # the metadata frame a server sends first
    infer_s: float = 30.0  # one inference (a pi0 on a busy GPU answers in 0.05-0.5 s)
    reconnect_s: float = 30.0  # a server that closed the connection may come back within this


def _last_line(traceback_text: str) -> str:
    lines = [ln.strip() for ln in traceback_text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "(an empty error)"


class OpenpiClient:
    """One connection to an openpi policy server, reconnected when the server restarts."""

    def __init__(self, uri: str, api_key: str | None = None, timeouts: Timeouts | None = None):
        self.uri = uri
        self.api_key = api_key
        self.timeouts = timeouts or Timeouts()
        self.reconnects = 0
        self._stack = contextlib.ExitStack()
        self.ws = None
        self.metadata = self._connect()

    def _connect(self) -> Any:
        """Open a connection and read the metadata frame; an :class:`OpenpiServerError` that
        says which step failed and what the other side did."""
        from websockets.exceptions import (
            ConnectionClosed,
            InvalidHandshake,
            InvalidStatus,
            InvalidURI,
            WebSocketException,
        )
        from websockets.sync.client import connect

        t = self.timeouts
        headers = {"Authorization": f"Api-Key {self.api_key}"} if self.api_key else None
        stack = contextlib.ExitStack()  # the connection is a context manager
        try:
            ws = stack.enter_context(connect(self.uri, compression=None, max_size=None, additional_headers=headers,
                                             open_timeout=t.connect_s, close_timeout=1.0))  # fmt: skip
        except InvalidURI as err:
            raise OpenpiServerError(f"policy.server={self.uri} is not a websocket address (ws://<host>:<port>): {err}") from err
        except InvalidStatus as err:
            raise OpenpiServerError(
                f"{self.uri} answered HTTP {err.response.status_code}, not a websocket handshake: "
                "is an openpi policy server (serve_policy.py) listening on that port?"
            ) from err
        except (InvalidHandshake, WebSocketException) as err:
            raise OpenpiServerError(f"{self.uri} is not an openpi policy server (the websocket handshake failed: {err})") from err
        except TimeoutError as err:
            raise OpenpiServerError(f"no openpi policy server at {self.uri}: no handshake within "
                                    f"{t.connect_s:g} s (policy.timeouts.connect_s)") from err  # fmt: skip
        except OSError as err:
            raise OpenpiServerError(f"no openpi policy server at {self.uri}: {err}") from err
        try:
            first = ws.recv(timeout=t.metadata_s)
        except TimeoutError as err:
            stack.close()
            raise OpenpiServerError(
                f"{self.uri} accepted the connection but sent no metadata within {t.metadata_s:g} s "
                "(policy.timeouts.metadata_s); an openpi policy server sends its metadata first"
            ) from err
        except ConnectionClosed as err:
            stack.close()
            raise OpenpiServerError(f"{self.uri} closed the connection before sending its metadata ({err})") from err
        if isinstance(first, str):
            stack.close()
            raise OpenpiServerError(f"{self.uri} sent text instead of its metadata: {_last_line(first)[:200]}", first)
        try:
            metadata = unpackb(first)
        except (ValueError, TypeError, _unpack_error()) as err:
            stack.close()
            raise OpenpiServerError(f"{self.uri}'s first frame is not msgpack metadata ({err})") from err
        self._stack.close()
        self._stack, self.ws = stack, ws
        return metadata

    def infer(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        """The server's answer to one observation. Raises :class:`OpenpiServerError` when it
        failed, hung or is gone, :class:`OpenpiReconnected` when it came back."""
        from websockets.exceptions import ConnectionClosed

        data = packb(dict(obs))
        try:
            self.ws.send(data)
            reply = self.ws.recv(timeout=self.timeouts.infer_s)
        except TimeoutError as err:
            raise OpenpiServerError(f"the openpi server at {self.uri} did not answer an inference within "
                                    f"{self.timeouts.infer_s:g} s (policy.timeouts.infer_s)") from err  # fmt: skip
        except ConnectionClosed as err:
            self._reconnect(err)
        if isinstance(reply, str):
            log.debug("the openpi server at %s failed; its traceback:\n%s", self.uri, reply)
            raise OpenpiServerError(f"the openpi server at {self.uri} failed: {_last_line(reply)}", reply)
        try:
            answer = unpackb(reply)
        except (ValueError, TypeError, _unpack_error()) as err:
            raise OpenpiServerError(f"the openpi server at {self.uri} answered something that is not msgpack ({err})") from err
        if not isinstance(answer, dict):
            raise OpenpiServerError(f"the openpi server at {self.uri} answered a {type(answer).__name__}, not an action dict")
        return answer

    def _reconnect(self, cause: Exception) -> None:
        """The server closed the connection: reconnect within ``reconnect_s`` (then raise
        :class:`OpenpiReconnected`) or give up with an :class:`OpenpiServerError`."""
        budget = self.timeouts.reconnect_s
        log.warning("the openpi server at %s closed the connection (%s); reconnecting for up to %g s", self.uri, cause, budget)
        deadline = time.monotonic() + budget
        last: Exception = cause
        while time.monotonic() < deadline:
            try:
                self.metadata = self._connect()
            except OpenpiServerError as err:
                last = err
                time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
                continue
            self.reconnects += 1
            log.warning("reconnected to the openpi server at %s", self.uri)
            raise OpenpiReconnected(f"the openpi server at {self.uri} restarted; the request in flight was lost") from cause
        raise OpenpiServerError(f"the openpi server at {self.uri} closed the connection ({cause}) and did not come back "
                                f"within {budget:g} s (policy.timeouts.reconnect_s): {last}") from cause  # fmt: skip

    def close(self) -> None:
        self._stack.close()
