"""ablab's inference runtime: a small in-repo transformer, the strategy components that
change how it runs (sparse FFN, sharded KV, precision, batching, LoRA, prompt side), the
worker that serves it over HTTP, and the traffic and label simulators that exercise it."""
