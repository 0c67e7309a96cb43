// Package events is Assent's v1 wire contract: the CloudEvent types that agents,
// approvers and brokers exchange, their data structs, the NATS subjects they travel
// on, validation with precise errors, and encoding for NATS in structured and binary
// content mode.
//
// The package does no I/O and does not import a NATS client: headers are plain
// map[string][]string values (nats.Header converts to and from it directly).
//
// The contract in brief (docs/protocol.md has the full text):
//
//	dev.assent.approval.requested  agent    assent.request.<agent>
//	dev.assent.approval.pending    broker   assent.pending.<agent>
//	dev.assent.approval.responded  approver assent.response.<principal>.<request-id>
//	dev.assent.approval.cancel     agent    assent.cancel.<request-id>
//	dev.assent.approval.escalated  broker   assent.pending.<agent>
//	dev.assent.approval.decided    broker   assent.decision.<request-id>
//
// Unknown fields are ignored so newer peers can add fields; missing required fields
// are errors. Every decode error wraps ErrInvalid, and a more specific sentinel where
// a caller may want to branch (ErrTooLarge, ErrMissingTool, ...).
package events
