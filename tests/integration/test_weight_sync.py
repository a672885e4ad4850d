"""Weight publication through a real Ray runtime: chunked, only changed tensors, applied
by a subscriber between steps without blocking, with a staleness bound."""

import time

import pytest
import torch

from rlinf_user.runtime.weights import WeightPublisher, WeightStore, WeightSubscriber


@pytest.fixture(scope="module")
def ray_runtime():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def net():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
    m[0].requires_grad_(False)  # a frozen "backbone"
    return m


def poll_until(sub, version, timeout=10.0):
    deadline = time.monotonic() + timeout
    while sub.version < version:
        assert time.monotonic() < deadline, f"version {version} never applied (at {sub.version})"
        sub.poll()
        time.sleep(0.005)


def test_chunked_changed_only_publication_reaches_a_subscriber(ray_runtime):
    import ray

    store = ray.remote(WeightStore).remote()
    learner, worker = net(), net()
    with torch.no_grad():
        for p in worker.parameters():
            p.zero_()
    pub = WeightPublisher(store, changed_only=True, chunk_bytes=16_384)  # the 64x256 weight is split
    pub.publish(learner.state_dict(), 0)
    assert pub.last_stats["tensors"] == 4 and pub.last_stats["chunks"] > 2
    sub = WeightSubscriber(store, worker, min_interval_s=0.0)
    poll_until(sub, 0)
    assert all(torch.equal(a, b) for a, b in zip(learner.state_dict().values(), worker.state_dict().values(), strict=True))
    with torch.no_grad():
        learner[2].weight.add_(1.0)  # a training step on the head only
    pub.publish(learner.state_dict(), 1)
    assert pub.last_stats["tensors"] == 1  # the frozen layer and the unchanged bias stay home
    poll_until(sub, 1)
    assert torch.equal(worker[2].weight, learner[2].weight) and torch.equal(worker[0].weight, learner[0].weight)
    assert sub.last_latency_s is not None and 0 <= sub.last_latency_s < 10
    with torch.no_grad():
        learner[2].bias.add_(1.0)
    pub.publish(learner, 2)  # given the module: trainable tensors go, frozen ones are not even compared
    assert pub.last_stats["tensors"] == 2
    poll_until(sub, 2)
    assert torch.equal(worker[2].bias, learner[2].bias)
    late = net()  # a worker joining later gets every tensor's current value
    late_sub = WeightSubscriber(store, late)
    late_sub.sync()
    assert late_sub.version == 2 and torch.equal(late[2].weight, learner[2].weight)


def test_a_worker_too_far_behind_waits_for_the_newest(ray_runtime):
    import ray

    store = ray.remote(WeightStore).remote()
    learner = net()
    pub = WeightPublisher(store)
    pub.publish(learner.state_dict(), 0)
    sub = WeightSubscriber(store, net(), min_interval_s=0.0, max_lag=1)
    sub.sync()
    for v in (1, 2, 3):
        with torch.no_grad():
            learner[2].bias.add_(1.0)
        pub.publish(learner.state_dict(), v)
    deadline = time.monotonic() + 10
    while sub.waits == 0:  # the next answer shows v3 while it holds v0: 3 > max_lag
        assert time.monotonic() < deadline
        sub.poll()
    assert sub.version == 3 and torch.equal(sub.module[2].bias, learner[2].bias)
    assert ray.get(store.current_version.remote()) == 3
