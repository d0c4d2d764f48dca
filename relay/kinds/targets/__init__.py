"""Target kinds, one module each (registered in relay.kinds)."""
