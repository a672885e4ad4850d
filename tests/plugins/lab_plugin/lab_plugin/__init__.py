"""A lab's own algorithm and env backend for rlinf-user (a test fixture)."""
