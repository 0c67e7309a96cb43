// Package scale holds TestScalePending, the built broker with many
// requests pending, and TestScaleRecord, a record of many decided requests
// read by insights and replayed (-tags scale for the full million of each).
//
// Its helpers are shared with the other end-to-end packages in
// integration/itest (see package integration).
package scale
