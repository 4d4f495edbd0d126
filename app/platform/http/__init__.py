"""HTTP stack of every worker: request signing and authorization, owner routing, common views."""
