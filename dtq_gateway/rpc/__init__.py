"""The gRPC surface: the Broker, Admin and Events servicers, request validation, auth,
interceptors, and the mapping of domain errors to gRPC statuses.
"""
