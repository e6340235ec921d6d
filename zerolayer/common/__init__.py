"""Pieces shared by every layer: configs, errors, the gRPC server bootstrap, protobuf conversion."""
