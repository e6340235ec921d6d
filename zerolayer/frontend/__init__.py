"""The frontend layer: the public APIs (each a room), routing to schedulers and the text side of a
request, around one domain object (``generation.TextGenerator``) that every API calls."""
