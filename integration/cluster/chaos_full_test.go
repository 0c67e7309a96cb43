//go:build chaos

package cluster

// defaultChaosRequests is TestChaos's full size, with -tags chaos:
//
//	go test ./integration/cluster -run TestChaos -tags chaos -v -timeout 60m
const defaultChaosRequests = 10000

// defaultChaosFailoverRounds is TestChaosFailover's rounds of each crash
// with -tags chaos.
const defaultChaosFailoverRounds = 5

// defaultLeaderChangeN, defaultLeaderChangeStepDowns and
// defaultLeaderChangeKills are TestDecisionAcrossLeaderChange's full size,
// with -tags chaos.
const (
	defaultLeaderChangeN         = 100000
	defaultLeaderChangeStepDowns = 200
	defaultLeaderChangeKills     = 5
)
