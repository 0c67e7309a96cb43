// Package integration holds Assent's end-to-end tests and benchmarks: real
// embedded NATS servers, real brokers, the real SDK and HTTP API.
//
// Slow suites sit behind build tags (see docs/testing.md); benchmarks compare
// Assent with raw JetStream doing the minimum equivalent work in the same run.
package integration
