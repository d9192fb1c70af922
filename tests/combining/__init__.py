"""Combining proposers: the merge primitive and policies, routers, and combined decoding through the engine."""
