"""Generated gRPC stubs for dtq.v1 (proto/dtq.proto). Do not edit: run `make proto`."""
