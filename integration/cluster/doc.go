// Package cluster holds Assent's end-to-end tests of several broker
// replicas: the chaos test (-tags chaos for its full size), rolling
// restarts and two replicas sharing the work.
//
// Its helpers are shared with the other end-to-end packages in
// integration/itest (see package integration).
package cluster
