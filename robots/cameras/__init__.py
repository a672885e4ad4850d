"""Cameras: one capture thread per camera, stamped frames, read_latest(max_age)."""
