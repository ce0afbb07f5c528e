"""Strategy factors: the built-in pack, the gateway's factors and those a deployment declares."""
