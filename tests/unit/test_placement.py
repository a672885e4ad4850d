"""Starting a local Ray runtime."""


def test_a_local_ray_node_gives_its_dashboard_agent_any_free_port():
    """A second Ray on the machine holds Ray's fixed agent port: ours must not wait for it."""
    from ray._private.parameter import RayParams

    from rlinf_user.runtime.orchestration.placement import agent_on_any_free_port

    assert agent_on_any_free_port()
    assert RayParams().dashboard_agent_listen_port == 0
    assert RayParams().no_monitor  # a local node never autoscales
