"""What the calibration commands share: the arm behind the edge daemon, and a result table."""

from __future__ import annotations

from rich.table import Table

from rlinf_user.config.compose import ConfigError


def connect_arm(cfg, camera: str | None):
    """The edge daemon's arm (and ``camera``) for a calibration session; a clear error when
    no daemon answers or it refuses the session."""
    from rlinf_user.calibration.session import EdgeArm
    from rlinf_user.edge.client import EdgeClient, EdgeTimeout

    edge = cfg.env.edge
    client = EdgeClient(edge.host, int(edge.port), server_public_key=edge.server_public_key,
                        client_secret_key=edge.client_secret_key, timeout_s=float(edge.timeout_s),
                        heartbeat_s=float(edge.heartbeat_s))  # fmt: skip
    try:
        return EdgeArm(client, camera, hello_timeout_s=float(edge.hello_timeout_s))
    except EdgeTimeout:
        client.close(say_bye=False)
        raise ConfigError(f"no edge daemon answered at {edge.host}:{edge.port}: is `rlinf-user edge --robot ...` "
                          "running, and are env.edge.host/port right?") from None
    except ValueError as err:
        client.close()  # the daemon answered: release its control now
        raise ConfigError(str(err)) from None
    except Exception:
        client.close(say_bye=False)
        raise


def results_table(console, title: str, rows: dict[str, str]) -> None:
    """A two-column table of a calibration's results."""
    table = Table(title=title, show_header=False)
    for k, v in rows.items():
        table.add_row(k, str(v))
    console.print(table)
