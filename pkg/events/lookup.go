package events

// A broker lookup asks the brokers what they stored of a request, whatever
// agent asked it: a NATS request with an empty body on
// assent-broker.lookup.<id>, answered with no body and the headers of a
// private lookup (LookupStatus, and for a stored request LookupDeadline and
// LookupRequestDigest) plus LookupAgent. It carries no args and no decided
// event: it tells whether a request exists, whose it is and where it stands,
// for processes that serve every agent (the approver bot's webhooks). An
// agent asks about its own requests on assent-private.<agent>.lookup.<id>
// (PrivateSubject), which also returns the decided event.
const BrokerLookupPrefix = "assent-broker.lookup."

// LookupAgent is the header of a broker lookup's answer naming the agent of
// a stored request.
const LookupAgent = "Assent-Agent"

// BrokerLookupSubject is where the brokers answer what they stored of
// request id.
func BrokerLookupSubject(id string) (string, error) {
	if err := CheckToken("request id", id); err != nil {
		return "", err
	}
	return BrokerLookupPrefix + id, nil
}
