"""Naming the process that holds a port: only a listener on the same address (or a wildcard) counts."""

import os
import socket
import subprocess
import sys

from rlinf_user.procs import port_holder


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def test_port_holder_names_the_listener_on_that_address_not_another_alias():
    port = _free_port("127.0.0.52")
    other = subprocess.Popen(
        [sys.executable, "-c",
         "import socket,sys,time; s=socket.socket(); s.bind(('127.0.0.53', int(sys.argv[1]))); s.listen(1);"
         "print('up', flush=True); time.sleep(60)", str(port)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    mine = socket.socket()
    try:
        assert other.stdout.readline().strip() == "up"
        mine.bind(("127.0.0.52", port))
        mine.listen(1)
        assert port_holder(port, "127.0.0.52").startswith(f"pid {os.getpid()} ")
        assert port_holder(port, "127.0.0.53").startswith(f"pid {other.pid} ")
        assert port_holder(port, "127.0.0.54") is None
        assert port_holder(port) is not None  # no address: any listener on the port
    finally:
        mine.close()
        other.kill()
        other.wait()


def test_a_wildcard_listener_holds_every_address():
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen(1)
        port = s.getsockname()[1]
        assert port_holder(port, "127.0.0.77").startswith(f"pid {os.getpid()} ")
