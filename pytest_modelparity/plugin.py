"""pytest plugin entry point (placeholder until the plugin work lands)."""
