"""HTTP stack of every worker: JSON answers, signing and auth, owner routing, counting, common views."""
