"""pgr adapter for llamaindex: not built yet (see the adapters issue). Importing it gives nothing."""
