"""The scheduler layer (the engine process): its scheduling core, its model, its GPU health."""
