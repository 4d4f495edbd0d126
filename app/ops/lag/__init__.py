"""Consumer lag: offsets reader, Burrow-style evaluation, monitor and pages."""
