"""pgr adapter for qdrant: not built yet (see the adapters issue). Importing it gives nothing."""
