"""Learned rewards: a success classifier for robots without a success sensor."""
