"""The edge side: the daemon on the robot PC, its control loop, safety and ZMQ protocol."""
