"""Franka Panda / FR3 driver on franky, grippers."""
