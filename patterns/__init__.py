"""The pattern engine: pack schema, loader, compiler and detectors, plus the built-in packs.

Pure logic only: nothing here imports bytewax, pymongo, kubernetes or grpc.
"""
