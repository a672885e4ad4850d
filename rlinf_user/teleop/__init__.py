"""Human in the loop: demonstrations by teleoperation, gated interventions, HG-DAgger."""
