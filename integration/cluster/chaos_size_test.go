//go:build !chaos

package cluster

// defaultChaosRequests is TestChaos's load in the regular suite (CI); the
// chaos build tag (chaos_full_test.go) raises it to the full size.
const defaultChaosRequests = 1000

// defaultChaosFailoverRounds is TestChaosFailover's rounds of each crash in
// the regular suite (CI).
const defaultChaosFailoverRounds = 1

// defaultLeaderChangeN, defaultLeaderChangeStepDowns and
// defaultLeaderChangeKills size TestDecisionAcrossLeaderChange in the
// regular suite: subjects per phase, step-downs of the stream's leader in
// the first and kills of its node in the second.
const (
	defaultLeaderChangeN         = 5000
	defaultLeaderChangeStepDowns = 20
	defaultLeaderChangeKills     = 2
)
