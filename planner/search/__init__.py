"""Search over legal configurations: enumerate (space), evaluate memory then time (evaluate), rank."""
