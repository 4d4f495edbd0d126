"""code-svc: AVCC codes and the record state machine."""
