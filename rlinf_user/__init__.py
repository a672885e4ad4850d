"""rlinf-user: real-robot-first embodied learning."""

__version__ = "0.1.0"
