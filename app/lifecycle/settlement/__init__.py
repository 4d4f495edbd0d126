"""settlement-svc: clearing status of settlement instructions."""
