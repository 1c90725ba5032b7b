"""The store: where things live on disk, atomic writes, file content keys.

The lowest layer: imports nothing else of specrepl, so every layer can ask it
for a location.
"""
