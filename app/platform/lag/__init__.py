"""Consumer lag as every worker reads it: the offsets reader, the worker's own lag export, and
the stall watchdog its readings feed (the ops group's monitor builds on the same reader)."""
