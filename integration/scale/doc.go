// Package scale holds TestScalePending: the built broker with many
// requests pending (-tags scale for the full million).
//
// Its helpers are shared with the other end-to-end packages in
// integration/itest (see package integration).
package scale
