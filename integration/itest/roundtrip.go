package itest

import (
	"github.com/assent-dev/assent/pkg/events"
)

// DecisionBody is the body of POST /v1/approvals/{id}/decision.
type DecisionBody struct {
	Principal string `json:"principal"`
	events.Responded
}
