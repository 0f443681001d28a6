"""Exports made for a session: the export worker process and the export cache (content keys,
atomic entries, per-entry locks). They call ``formats`` and sit above them; ``plugin`` uses them.
"""
