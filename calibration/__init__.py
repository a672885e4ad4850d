"""Calibration data and code: camera intrinsics, hand-eye transforms, workspace bounds."""
