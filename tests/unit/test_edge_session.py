"""Who controls the robot (the edge daemon's control session): one client, reached on
either of its two connections, never another key posing as one of them."""

from rlinf_user.edge.session import ControlSession

PUBLIC, CONTROL = ("router", b"\x00a"), ("ctl", b"\x00b")


def test_the_controller_is_heard_on_the_connection_that_asked_after_moving():
    s = ControlSession(peer_timeout_s=2.0, keys=False)
    assert s.claim(PUBLIC, None, "s1", now=0.0) == (True, "new")
    assert s.bind(CONTROL, None, "s1", now=0.1)
    assert s.controls(CONTROL) and s.controls(PUBLIC)
    # the client gave up on the controller's socket before its reply came: its commands
    # arrive on the public connection, and replies follow them there
    assert s.follow(PUBLIC) and s.peer == PUBLIC
    assert not s.follow(PUBLIC)
    # it may say hello again there without being refused as busy by its own other socket
    assert s.claim(PUBLIC, None, "s1", now=0.5)[0]
    # another connection is not the controller, and may not take a live session
    other = ("router", b"\x00c")
    assert not s.controls(other)
    assert s.claim(other, None, "s2", now=1.0) == (False, "busy")
    # a silent controller loses the robot to the next hello
    assert s.claim(other, None, "s2", now=3.0) == (True, "handover: previous one silent")
    assert not s.controls(PUBLIC) and not s.controls(CONTROL)


def test_with_keys_a_connection_id_is_no_credential():
    s = ControlSession(peer_timeout_s=2.0, keys=True)
    assert s.claim(PUBLIC, "K1", "s1", now=0.0)[0]
    assert not s.bind(CONTROL, "K2", "s1", now=0.1)  # another key cannot move the session
    assert s.bind(CONTROL, "K1", "s1", now=0.1)
    assert s.controls(PUBLIC, "K1") and s.controls(CONTROL, "K1")
    # another key reusing the routing id of the controller's public connection
    assert not s.controls(PUBLIC, "K2")
    assert s.claim(PUBLIC, "K2", "s1", now=0.5) == (False, "busy")
    # the same key and session resume from a new connection (a client back after a drop)
    assert s.claim(("router", b"\x00d"), "K1", "s1", now=0.6) == (True, "handover: same key and session")
    assert not s.controls(PUBLIC, "K1")


def test_a_lapsed_or_released_session_controls_nothing():
    s = ControlSession(peer_timeout_s=2.0, keys=False)
    s.claim(PUBLIC, None, "s1", now=0.0)
    s.lapse()
    assert not s.controls(PUBLIC)
    assert s.claim(PUBLIC, None, "s1", now=0.1)[0]
    s.release()
    assert not s.controls(PUBLIC) and s.session is None
    assert not s.bind(CONTROL, None, "s1", now=0.2)  # a released session cannot be moved
