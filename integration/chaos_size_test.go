//go:build !chaos

package integration

// defaultChaosRequests is TestChaos's load in the regular suite (CI); the
// chaos build tag (chaos_full_test.go) raises it to the full size.
const defaultChaosRequests = 1000
