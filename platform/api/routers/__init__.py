"""One router per domain; each is included by ``create_app``."""
