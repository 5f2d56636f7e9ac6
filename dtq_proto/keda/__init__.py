"""Generated stubs of KEDA's external scaler contract (proto/keda/externalscaler.proto).
Do not edit: run `make proto`."""
