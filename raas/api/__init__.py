"""HTTP service: routes, auth, errors, metrics. The wire types live in raas.wire."""
