// Package itest holds the helpers that Assent's end-to-end test packages
// (integration and its sub-packages) share: embedded NATS servers and brokers,
// the HTTP client, waits, the programs of cmd/ built once per test binary.
// Only tests import it.
//
// Every helper that takes a *testing.T calls t.Helper and undoes what it
// started with t.Cleanup. Paths are relative to the module's root (RepoRoot),
// not to the test's package directory.
package itest
