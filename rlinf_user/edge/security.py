"""ZMQ CURVE authentication between the training side and the edge daemon.

``rlinf-user edge keygen <dir>`` writes two key pairs in ZMQ's certificate format::

    <dir>/edge.key, edge.key_secret        the daemon's pair (secret stays on the robot PC)
    <dir>/client.key, client.key_secret    the training side's pair
    <dir>/authorized/client.key            public keys the daemon accepts (add more here)

The daemon loads its secret key and accepts only clients whose public key is in its
authorized folder (ZAP, via :class:`zmq.auth.thread.ThreadAuthenticator`). The client
needs the daemon's public key and its own pair. Without keys the daemon refuses to bind
anything but a loopback interface.
"""

from __future__ import annotations

import ipaddress
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq
import zmq.auth

log = logging.getLogger(__name__)


ZAP_DOMAIN = "rlinf-user"
CONTROL_DOMAIN = "rlinf-user-control"  # the controller's own socket: one key at a time


class _Admit:
    """A ZAP credentials provider that admits the keys a predicate accepts."""

    def __init__(self, predicate: Callable[[str], bool]):
        self.predicate = predicate

    def callback(self, domain: str, key: bytes) -> bool:
        return bool(self.predicate(key.decode() if isinstance(key, bytes) else str(key)))


class AuthError(RuntimeError):
    """Authentication failed or is misconfigured."""


def keygen(directory: str | Path) -> dict[str, Path]:
    """Create the edge and client key pairs (refuses to overwrite existing keys)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    for name in ("edge", "client"):
        if (d / f"{name}.key_secret").exists():
            raise AuthError(f"{d / (name + '.key_secret')} exists; refusing to overwrite keys")
    edge_pub, edge_sec = zmq.auth.create_certificates(str(d), "edge")
    cli_pub, cli_sec = zmq.auth.create_certificates(str(d), "client")
    auth = d / "authorized"
    auth.mkdir(exist_ok=True)
    shutil.copy(cli_pub, auth / "client.key")
    for secret in (edge_sec, cli_sec):
        Path(secret).chmod(0o600)
    return {
        "edge_public": Path(edge_pub),
        "edge_secret": Path(edge_sec),
        "client_public": Path(cli_pub),
        "client_secret": Path(cli_sec),
        "authorized": auth,
    }


def _load(path: str | Path, need_secret: bool) -> tuple[bytes, bytes | None]:
    p = Path(path).expanduser()
    if not p.exists():
        raise AuthError(f"key file {p} does not exist (create keys with `rlinf-user edge keygen`)")
    try:
        public, secret = zmq.auth.load_certificate(str(p))
    except Exception as err:  # noqa: BLE001 - zmq raises ValueError/OSError variants
        raise AuthError(f"cannot read key file {p}: {err}") from err
    if need_secret and not secret:
        raise AuthError(f"{p} holds no secret key (use the *.key_secret file)")
    return public, secret


def is_ipv4(addr: str) -> bool:
    try:
        ipaddress.IPv4Address(addr)
    except ValueError:
        return False
    return True


def user_id(frame: zmq.Frame) -> str | None:
    """The CURVE public key (z85) that authenticated the connection a frame came in on."""
    try:
        return frame.get("User-Id") or None
    except zmq.ZMQError:
        return None


def is_loopback(host: str) -> bool:
    if host in ("localhost", "127.0.0.1", "::1"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ServerAuth:
    """Configures the daemon's sockets; keeps the ZAP authenticator thread alive."""

    def __init__(self, ctx: zmq.Context, secret_key_file: str | None, authorized_dir: str | None,
                 bind_host: str):  # fmt: skip
        self.enabled = bool(secret_key_file)
        self._auth = None
        if not self.enabled:
            if not is_loopback(bind_host):
                raise AuthError(
                    f"refusing to serve the robot unauthenticated on {bind_host}: set "
                    "edge.secret_key and edge.authorized_keys (see `rlinf-user edge keygen`), "
                    "or bind to 127.0.0.1"
                )
            log.warning("edge daemon is unauthenticated (loopback only)")
            return
        if not authorized_dir or not Path(authorized_dir).expanduser().is_dir():
            raise AuthError(f"edge.authorized_keys={authorized_dir!r} is not a folder of client keys")
        self.public, self.secret = _load(secret_key_file, need_secret=True)
        from zmq.auth.thread import ThreadAuthenticator

        self._auth = ThreadAuthenticator(ctx, log=logging.getLogger(__name__ + ".zap"))
        self._auth.start()
        # one callback per domain (pyzmq consults callbacks or certificate folders, never both)
        self._keys = set(zmq.auth.load_certificates(str(Path(authorized_dir).expanduser())))
        self._auth.configure_curve_callback(domain=ZAP_DOMAIN, credentials_provider=_Admit(self.authorized))

    def authorized(self, key: str) -> bool:
        """``key`` (z85) is one of the authorized client keys."""
        return key.encode() in self._keys

    def apply(self, sock: zmq.Socket, admit: Callable[[str], bool] | None = None) -> None:
        """Make ``sock`` a CURVE server admitting the authorized keys, or, with ``admit``,
        only the (z85) keys it accepts at the moment of each handshake."""
        if self.enabled:
            sock.curve_secretkey = self.secret
            sock.curve_publickey = self.public
            sock.curve_server = True
            domain = ZAP_DOMAIN
            if admit is not None:
                domain = CONTROL_DOMAIN
                provider = _Admit(lambda key: self.authorized(key) and admit(key))
                self._auth.configure_curve_callback(domain=domain, credentials_provider=provider)
            sock.zap_domain = domain.encode()

    def close(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None


def client_options(server_public_file: str | None, client_secret_file: str | None) -> dict[str, Any]:
    """Socket options for the training side (empty dict: no CURVE)."""
    if not server_public_file and not client_secret_file:
        return {}
    if not (server_public_file and client_secret_file):
        raise AuthError("set both edge.server_public_key and edge.client_secret_key (or neither)")
    server_public, _ = _load(server_public_file, need_secret=False)
    public, secret = _load(client_secret_file, need_secret=True)
    return {
        zmq.CURVE_SERVERKEY: server_public,
        zmq.CURVE_PUBLICKEY: public,
        zmq.CURVE_SECRETKEY: secret,
    }


HANDSHAKE_FAILURES = {
    zmq.EVENT_HANDSHAKE_FAILED_AUTH: "the peer's key was refused (not in the authorized keys)",
    zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "security mechanism mismatch (one side uses CURVE keys, "
    "the other does not, or a key is wrong)",
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "security handshake failed",
}
# A refusal is final; a handshake cut short (NO_DETAIL: the connection dropped mid-handshake,
# as when the daemon's ingress guard sheds pending connections under a flood) is retried by
# libzmq on its own, so a client reports it only when no reply came in time.
HANDSHAKE_REFUSALS = (zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
