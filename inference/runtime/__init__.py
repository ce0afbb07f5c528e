"""Runtime kernels behind the strategy factors: sharded-KV attention, gathered sparse FFN,
LoRA adapter banks, precision variants."""
