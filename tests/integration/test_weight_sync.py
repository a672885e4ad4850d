"""Weight publication through a real Ray runtime: chunked, only changed tensors, applied
by a subscriber between steps without blocking, with a staleness bound."""

import time

import pytest
import torch

from rlinf_user.runtime.weights.store import WeightPublisher, WeightStore, WeightSubscriber


@pytest.fixture(scope="module")
def ray_runtime():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
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


@pytest.mark.parametrize("transport", ["tcp", "ray"])
def test_chunked_changed_only_publication_reaches_a_subscriber(ray_runtime, transport):
    import ray

    store = ray.remote(WeightStore).remote()
    learner, worker = net(), net()
    with torch.no_grad():
        for p in worker.parameters():
            p.zero_()
    params_before = [id(p) for p in worker.parameters()]
    pub = WeightPublisher(store, changed_only=True, chunk_bytes=16_384, transport=transport)  # ray: 64x256 split
    pub.publish(learner.state_dict(), 0)
    assert pub.last_stats["tensors"] == 4
    assert pub.last_stats["chunks"] > 2 if transport == "ray" else pub.last_stats["chunks"] == 0
    sub = WeightSubscriber(store, worker, min_interval_s=0.0)
    poll_until(sub, 0)
    assert [id(p) for p in worker.parameters()] == params_before  # new values, the same Parameter objects
    assert not worker[0].weight.requires_grad and worker[2].weight.requires_grad
    assert all(
        torch.equal(a, b) for a, b in zip(learner.state_dict().values(), worker.state_dict().values(), strict=True)
    )
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
    with torch.no_grad():  # later versions keep arriving (tcp: into the buffers the swaps handed back)
        for v in (3, 4, 5):
            learner[2].weight.mul_(0.5)
            pub.publish(learner, v)
            poll_until(sub, v)
            assert torch.equal(worker[2].weight, learner[2].weight) and torch.equal(worker[0].weight, learner[0].weight)
    sub.close()
    late_sub.close()
    pub.close()


def test_bf16_module_over_tcp(ray_runtime):
    import ray

    store = ray.remote(WeightStore).remote()
    torch.manual_seed(1)
    learner = torch.nn.Linear(32, 16, dtype=torch.bfloat16)
    worker = torch.nn.Linear(32, 16, dtype=torch.bfloat16)
    pub = WeightPublisher(store)
    sub = WeightSubscriber(store, worker, min_interval_s=0.0)
    for v in range(3):
        with torch.no_grad():
            learner.weight.add_(0.25)
        pub.publish(learner, v)
        poll_until(sub, v)
        assert worker.weight.dtype == torch.bfloat16 and torch.equal(worker.weight, learner.weight)
    pub.close()


def test_a_restarted_publisher_is_found_again(ray_runtime):
    """The learner's weight server dies with it; the worker's pull fails, it asks the
    store again and gets the new learner's server (new port, new token)."""
    import ray

    store = ray.remote(WeightStore).remote()
    learner = net()
    pub = WeightPublisher(store)
    pub.publish(learner, 0)
    sub = WeightSubscriber(store, net(), min_interval_s=0.0)
    sub.sync()
    pub.close()  # gone, mid-run
    with torch.no_grad():
        learner[2].weight.add_(3.0)
    pub2 = WeightPublisher(store)
    pub2.publish(learner, 5)  # above the last version, everything sent again
    poll_until(sub, 5)
    assert torch.equal(sub.module[2].weight, learner[2].weight)
    pub2.close()


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


def test_weights_pulled_through_an_emulated_slow_link(ray_runtime):
    """placement.weight_link: the worker's pull crosses a 25 ms / 8 Mbit/s link."""
    import ray

    from rlinf_user.netem import LinkSpec

    store = ray.remote(WeightStore).remote()
    learner = net()  # 70 kB of float32: about 70 ms at 8 Mbit/s
    pub = WeightPublisher(store)
    pub.publish(learner, 0)
    fast = WeightSubscriber(store, net(), min_interval_s=0.0)
    slow = WeightSubscriber(store, net(), min_interval_s=0.0, link=LinkSpec(delay_ms=25, mbit=8))
    for v in (1, 2, 3):
        with torch.no_grad():
            learner[2].weight.add_(1.0)
            learner[0].weight.add_(1.0)
        pub.publish(learner.state_dict(), v)  # a bare state dict is compared by value: both layers go
        poll_until(fast, v)
        poll_until(slow, v)
        assert torch.equal(slow.module[0].weight, learner[0].weight)
        assert slow.last_timing["fetched"] - slow.last_timing["answered"] >= 0.05 + 0.07  # 2 x 25 ms + bytes
        assert fast.last_timing["fetched"] - fast.last_timing["answered"] < 0.05
    for s in (fast, slow):
        s.close()
    pub.close()
