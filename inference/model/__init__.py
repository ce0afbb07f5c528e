"""The small decoder-only transformer ablab serves, and loading its shipped weights."""
