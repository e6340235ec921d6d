"""Process plumbing every layer shares: settings, errors, server bootstrap, tracing, conversion."""
