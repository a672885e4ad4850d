"""Servers that act or score for the env workers: the batched rollout server (a policy on a
GPU node) and the learned-reward server."""
