"""pgr adapter for mem0: not built yet (see the adapters issue). Importing it gives nothing."""
