package events

// Distributed tracing: the CloudEvents distributed tracing extension. An
// event may carry the W3C Trace Context of the work that published it in two
// optional string attributes, so that the spans its readers make join the
// same trace (docs/tracing.md). They are never required and never checked
// here: a reader ignores a malformed value and handles the event as if it
// carried none.
const (
	// TraceParentAttribute holds a W3C traceparent,
	// "00-<trace id>-<parent span id>-<flags>".
	TraceParentAttribute = "traceparent"
	// TraceStateAttribute holds a W3C tracestate: vendors' key=value pairs.
	TraceStateAttribute = "tracestate"
)

// The names of the attributes that Assent's spans carry, the same in the SDK
// and the broker (docs/tracing.md lists which span has which).
const (
	SpanAttrRequestID = "assent.request_id"
	SpanAttrAgent     = "assent.agent"
	SpanAttrTool      = "assent.tool"
	SpanAttrState     = "assent.state"
	SpanAttrOutcome   = "assent.outcome"
	SpanAttrRule      = "assent.rule"
	SpanAttrAuto      = "assent.auto"
	SpanAttrPrincipal = "assent.principal"
	SpanAttrChannel   = "assent.channel"
	SpanAttrDecision  = "assent.decision"
	SpanAttrLevel     = "assent.level"
	SpanAttrReminder  = "assent.reminder"
	SpanAttrReplica   = "assent.replica"
)

// TraceCarrier reads and writes the trace attributes of an event. Its
// methods are those of OpenTelemetry's propagation.TextMapCarrier, so a
// propagator reads and writes through it directly:
//
//	ctx = propagation.TraceContext{}.Extract(ctx, events.TraceCarrier{Event: &e})
//
// Only traceparent and tracestate are read and written; a value that is not
// a string reads as empty.
type TraceCarrier struct{ Event *Event }

// Get returns the attribute key, if it is a trace attribute holding a
// string, else "".
func (c TraceCarrier) Get(key string) string {
	if key != TraceParentAttribute && key != TraceStateAttribute {
		return ""
	}
	s, _ := c.Event.Extensions()[key].(string)
	return s
}

// Set sets the attribute key, if it is a trace attribute; an empty value
// removes it.
func (c TraceCarrier) Set(key, value string) {
	if key != TraceParentAttribute && key != TraceStateAttribute {
		return
	}
	if value == "" {
		c.Event.SetExtension(key, nil)
		return
	}
	c.Event.SetExtension(key, value)
}

// Keys lists the trace attributes the event carries.
func (c TraceCarrier) Keys() []string {
	var keys []string
	for _, k := range []string{TraceParentAttribute, TraceStateAttribute} {
		if _, ok := c.Event.Extensions()[k]; ok {
			keys = append(keys, k)
		}
	}
	return keys
}
