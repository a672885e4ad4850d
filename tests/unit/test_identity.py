"""Every node of a run runs the same build: an env worker started by a driver of another
build (another version, or the same version with other source files) refuses to start and
names both."""

import pytest

from rlinf_user import __version__
from rlinf_user.config.compose import compose_config
from rlinf_user.identity import ANOTHER_BUILD, check_same_build, project_identity
from rlinf_user.runtime.rollout.env_worker import EnvWorker


def test_the_identity_is_the_version_and_a_digest_of_the_sources():
    ident = project_identity()
    version, digest = ident.split("+")
    assert version == __version__ and len(digest) == 10 and int(digest, 16) >= 0
    check_same_build(ident)  # the same build passes
    check_same_build(None)  # a caller that does not say is not checked


def test_a_worker_of_another_build_refuses_to_start_naming_both():
    cfg = compose_config([], sim="reach")
    other = f"{__version__}+0000000000"
    with pytest.raises(RuntimeError, match=ANOTHER_BUILD) as err:
        EnvWorker(cfg, worker_id=0, driver_build=other)
    assert project_identity() in str(err.value) and other in str(err.value)
    worker = EnvWorker(cfg, worker_id=0, driver_build=project_identity())  # the same build starts
    worker.close()
