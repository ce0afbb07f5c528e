"""The experiment registry: experiments, layers, holdouts, API keys and the audit log."""
