"""Pages of the dashboard; each exposes ``render(ctx)``."""
