"""Per-request strategy policies (issue 33): the policy object, its versioned model, the
decision, and off-policy evaluation. Pure: arrays and mappings in, numbers out; reading
events and serving requests are their callers' (``ablab.cli.ope``, the OPE route, the
gateway and the SDK)."""
