"""faust plumbing: the app factory, transport fixes, the effects runtime of the lifecycle groups."""
