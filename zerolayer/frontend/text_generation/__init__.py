"""The public gRPC API ``zerolayer.v1.TextGeneration``: its thin handlers."""
