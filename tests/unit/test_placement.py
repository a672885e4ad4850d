"""Starting a local Ray runtime."""


def test_a_local_ray_node_takes_any_free_agent_port_and_starts_no_autoscaler():
    """A second Ray on the machine holds Ray's fixed agent port: ours must not wait for it."""
    from ray._private.parameter import RayParams

    from rlinf_user.runtime.orchestration.placement import lean_local_node

    assert lean_local_node()
    assert RayParams().dashboard_agent_listen_port == 0
    assert RayParams().no_monitor  # a local node never autoscales
