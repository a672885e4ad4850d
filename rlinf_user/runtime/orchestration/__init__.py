"""The driver: places the roles on the cluster, runs the training loop, restarts what died,
keeps the run record."""
