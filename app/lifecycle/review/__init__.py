"""review-svc: the rule-based review and human review tasks."""
