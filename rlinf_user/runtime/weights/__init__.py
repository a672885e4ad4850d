"""Weight publication (learner) and subscription (env workers, servers): versioned, over TCP
or Ray, changed tensors only."""
