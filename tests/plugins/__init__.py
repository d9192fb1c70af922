"""Plugins: discovery and isolation, observers, the conformance kit, contrib, the public face and the wheel."""
