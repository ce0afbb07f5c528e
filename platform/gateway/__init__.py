"""The OpenAI-compatible experiment gateway (``ablab gateway``).

A team changes one base URL; each request is assigned locally (the SDK's config refresh),
the variant's strategy picks the backend and rewrites only the body fields it sets, the
stream is passed through byte for byte while it is measured, and an ``exposure`` and an
``inference`` event are written to a durable outbox before the answer completes.

Layout (protocol apart from serving, as vLLM's entrypoints do):

- :mod:`.settings`    backends, templates, where events go;
- :mod:`.protocol`    SSE framing and the OpenAI chunk shapes, pure;
- :mod:`.translators` each backend kind's quirks in one small class;
- :mod:`.stream`      the stream meter: a pure function over chunks (TTFT, ITL, usage);
- :mod:`.rewrite`     strategy → request body (model, params, prompts, CoT, compression);
- :mod:`.metering`    measurements → the inference event (TPOT, tokens, cost);
- :mod:`.emit`        the durable outbox and its forwarder to ``POST /v1/events``;
- :mod:`.serving`     one serving class per endpoint; :mod:`.app` the thin ASGI app.

Nothing here imports torch, PyFlink, chDB or Streamlit at module level: the gateway ships
in the light install (entropy compression loads the in-repo scorer only when used).
"""
