"""HTTP stack of every worker: JSON answers, request signing and authorization, owner routing, counting, common views."""
