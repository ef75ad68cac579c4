"""pgr_adapters: prospection on top of the stores people already run (mem0, LlamaIndex, Qdrant).

Each adapter is a pgr plugin registered in the ``pgr`` entry-point group; a plugin module imports only
pgr_core, and the framework only when its factory is called.
"""
