// Package integration holds Assent's end-to-end tests and benchmarks: real
// embedded NATS servers, real brokers, the real SDK and HTTP API.
//
// Slow suites sit behind build tags (see docs/testing.md); benchmarks compare
// Assent with raw JetStream doing the minimum equivalent work in the same run.
//
// The suites are split into packages that go test runs side by side, each
// well inside go test's default 10-minute limit: integration (round trips,
// policies, the HTTP API, channels, restarts, ...), integration/ops
// (deployment files, the nats CLI, backups, operations), integration/cluster
// (chaos, rolling restarts, replicas), integration/scale (many pending
// requests) and integration/browser (the web UI in Chromium). Their shared
// helpers are in integration/itest.
package integration
