"""The learner role: an algorithm fed by its data (replay buffer or on-policy segments),
data-parallel replicas, HG-DAgger's BC learner; runs on the learner's node (a GPU)."""
