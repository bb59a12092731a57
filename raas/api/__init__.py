"""HTTP service: routes, wire schemas, auth. Importing this package imports no web framework."""
