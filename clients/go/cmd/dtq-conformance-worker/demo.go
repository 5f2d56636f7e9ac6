package main

import dtq "dtq/clients/go"

// registerDemo adds the demo's task types (filled in by demo_handlers.go).
func registerDemo(w *dtq.Worker) {}
