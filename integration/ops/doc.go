// Package ops holds Assent's end-to-end tests of deployment and operations:
// the files under deploy/ and deploy/local/run.sh, the README's nats CLI
// commands, broker backup and restore, the upgrade from a broker that kept
// request state in a bucket, the dashboard, alerts and connection and
// lateness metrics.
//
// Its helpers are shared with the other end-to-end packages in
// integration/itest (see package integration).
package ops
