//go:build !chaos

package cluster

// defaultChaosRequests is TestChaos's load in the regular suite (CI); the
// chaos build tag (chaos_full_test.go) raises it to the full size.
const defaultChaosRequests = 1000

// defaultChaosFailoverRounds is TestChaosFailover's rounds of each crash in
// the regular suite (CI).
const defaultChaosFailoverRounds = 1
