package events

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/google/uuid"
)

// Content types and limits of the NATS encoding.
const (
	// ContentTypeStructured marks a structured-mode message: the whole event is the body.
	ContentTypeStructured = "application/cloudevents+json"
	// ContentTypeJSON is the only data content type of the v1 contract.
	ContentTypeJSON = "application/json"
	// DefaultMaxEventSize bounds an encoded event (body plus headers) unless a
	// Codec says otherwise.
	DefaultMaxEventSize = 1 << 20

	headerContentType = "Content-Type"
	binaryPrefix      = "ce-"
)

// Header is a NATS message header; nats.Header converts to and from it.
type Header = map[string][]string

// Event is a CloudEvent as the CloudEvents Go SDK models it.
type Event = event.Event

// NewID returns a new request or event id: a UUIDv7, so ids sort by time.
func NewID() string {
	id, err := uuid.NewV7()
	if err != nil {
		// NewV7 fails only when the system's random source does; uuid.New panics then too.
		return uuid.NewString()
	}
	return id.String()
}

// DerivedID returns the id derived from key and the stream sequence seq
// of the message stored at at: a UUIDv7 whose time is at and whose other
// bits are a hash of key and seq, so that every reader of the same stored
// message derives the same id (the broker's decision and remembered-choice
// ids, which a replay of the record must name as the broker did).
func DerivedID(key string, seq uint64, at time.Time) string {
	sum := sha256.Sum256([]byte(key + "\x00" + strconv.FormatUint(seq, 10)))
	var u uuid.UUID
	copy(u[:], sum[:])
	var ts [8]byte
	binary.BigEndian.PutUint64(ts[:], uint64(at.UnixMilli()))
	copy(u[0:6], ts[2:8])
	u[6] = 0x70 | u[6]&0x0f // version 7
	u[8] = 0x80 | u[8]&0x3f // RFC 9562 variant
	return u.String()
}

// New builds a v1 event of type typ. An empty id gets a new UUIDv7; source must
// not be empty (convention: "agent/<name>", "approver/<name>", "broker/<name>").
// data is stored as compact JSON without HTML escaping (<, > and & stay as
// they are); nil data means an event without data.
func New(typ, id, source string, data any) (Event, error) {
	if id == "" {
		id = NewID()
	}
	if err := CheckToken("id", id); err != nil {
		return Event{}, err
	}
	e := event.New(event.CloudEventsVersionV1)
	e.SetID(id)
	e.SetType(typ)
	e.SetSource(source)
	e.SetTime(time.Now().UTC())
	e.SetDataContentType(ContentTypeJSON)
	if data != nil {
		// Not e.SetData: it marshals with HTML escaping, which makes each <, >
		// and & six bytes, and it would mark ready-made []byte as binary data
		// (written as data_base64).
		b, err := marshalCanonical(data)
		if err != nil {
			return Event{}, fmt.Errorf("%w: data: %v", ErrMalformed, err)
		}
		e.DataEncoded = b
	}
	if err := e.Validate(); err != nil {
		return Event{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return e, nil
}

// Encode returns e in structured mode: a Content-Type header and the whole
// event as the JSON body, one compact JSON object. Strings are not HTML
// escaped, neither in the envelope nor in the data, which is written as it is
// stored, white space aside. This is what Assent publishes.
func Encode(e *Event) (Header, []byte, error) {
	// Not json.Marshal(e): it would escape HTML in the output of MarshalJSON.
	raw, err := e.MarshalJSON()
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	body := raw
	if !writesCompact(e) {
		// The SDK copies the data in as it is stored; Compact checks that
		// the result is one JSON value and drops the data's white space, if
		// any.
		var buf bytes.Buffer
		buf.Grow(len(raw))
		if err := json.Compact(&buf, raw); err != nil {
			return nil, nil, fmt.Errorf("%w: encoded event is not JSON: %v", ErrMalformed, err)
		}
		body = buf.Bytes()
	}
	if len(body) == 0 || body[0] != '{' {
		return nil, nil, fmt.Errorf("%w: encoded event is not a JSON object", ErrMalformed)
	}
	return Header{headerContentType: {ContentTypeStructured}}, body, nil
}

// writesCompact reports whether the SDK writes e as compact JSON, so that
// json.Compact would not change a byte of it: the attributes are JSON strings
// without white space around them, and so are the extensions when they are
// strings (Assent's are); the data, stored as JSON, is written as it is, so
// it must be one compact JSON value (as New makes it).
func writesCompact(e *Event) bool {
	for _, v := range e.Extensions() {
		if _, ok := v.(string); !ok {
			return false
		}
	}
	if e.DataEncoded == nil {
		return true
	}
	ct := e.DataContentType()
	return !e.DataBase64 && (ct == "" || ct == ContentTypeJSON) && json.Valid(e.DataEncoded) && isCompact(e.DataEncoded)
}

// isCompact reports whether the valid JSON b has no white space outside its
// strings.
func isCompact(b []byte) bool {
	inString := false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case inString && c == '\\':
			i++ // the escaped byte
		case c == '"':
			inString = !inString
		case !inString && (c == ' ' || c == '\t' || c == '\n' || c == '\r'):
			return false
		}
	}
	return true
}

// EncodeBinary returns e in binary mode: attributes as ce- headers (values
// percent-encoded), the data content type as Content-Type, and the data as body.
func EncodeBinary(e *Event) (Header, []byte, error) {
	h := Header{
		binaryPrefix + "specversion": {e.SpecVersion()},
		binaryPrefix + "id":          {url.PathEscape(e.ID())},
		binaryPrefix + "type":        {url.PathEscape(e.Type())},
		binaryPrefix + "source":      {url.PathEscape(e.Source())},
	}
	if !e.Time().IsZero() {
		h[binaryPrefix+"time"] = []string{e.Time().UTC().Format(time.RFC3339Nano)}
	}
	if s := e.Subject(); s != "" {
		h[binaryPrefix+"subject"] = []string{url.PathEscape(s)}
	}
	if ct := e.DataContentType(); ct != "" {
		h[headerContentType] = []string{ct}
	}
	for k, v := range e.Extensions() {
		h[binaryPrefix+k] = []string{url.PathEscape(fmt.Sprint(v))}
	}
	return h, e.Data(), nil
}

// Codec decodes events from NATS messages.
type Codec struct {
	// MaxSize bounds body plus header bytes; zero means DefaultMaxEventSize.
	MaxSize int
}

// Decode reads a v1 event from a NATS message in either content mode: structured
// when Content-Type is application/cloudevents+json, binary when ce- headers are
// present, and structured otherwise. It checks the envelope (spec version 1.0,
// id usable as a subject token, source, type, JSON data) but not the data; use
// DecodeRequested and friends for that. Errors wrap ErrInvalid. It never panics.
func (c Codec) Decode(h Header, body []byte) (Event, error) {
	limit := c.MaxSize
	if limit <= 0 {
		limit = DefaultMaxEventSize
	}
	size := len(body)
	for k, vs := range h {
		for _, v := range vs {
			size += len(k) + len(v)
		}
	}
	if size > limit {
		return Event{}, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, size, limit)
	}
	var e Event
	ct := headerValue(h, headerContentType)
	switch {
	case mediaType(ct) == ContentTypeStructured:
		if err := unmarshalStructured(&e, body); err != nil {
			return Event{}, fmt.Errorf("%w: %v", ErrMalformed, err)
		}
	case headerValue(h, binaryPrefix+"specversion") != "":
		var err error
		if e, err = decodeBinary(h, body); err != nil {
			return Event{}, err
		}
	default:
		if err := unmarshalStructured(&e, body); err != nil {
			return Event{}, fmt.Errorf("%w: not a structured CloudEvent and no ce- headers: %v", ErrMalformed, err)
		}
	}
	if err := checkEnvelope(&e); err != nil {
		return Event{}, err
	}
	return e, nil
}

// Decode is Codec{}.Decode: the default size limit.
func Decode(h Header, body []byte) (Event, error) { return Codec{}.Decode(h, body) }

func decodeBinary(h Header, body []byte) (Event, error) {
	if v := headerValue(h, binaryPrefix+"specversion"); v != event.CloudEventsVersionV1 {
		return Event{}, fieldErr("specversion", fmt.Errorf("%w: %q (want 1.0)", ErrBadValue, truncate(v, 20)))
	}
	e := event.New(event.CloudEventsVersionV1)
	for k, vs := range h {
		if len(vs) == 0 || len(k) <= len(binaryPrefix) || !strings.EqualFold(k[:len(binaryPrefix)], binaryPrefix) {
			continue
		}
		name := strings.ToLower(k[len(binaryPrefix):])
		val, err := url.PathUnescape(vs[0])
		if err != nil {
			return Event{}, fieldErr(k, fmt.Errorf("%w: bad percent-encoding", ErrMalformed))
		}
		switch name {
		case "specversion", "data":
		case "id":
			e.SetID(val)
		case "type":
			e.SetType(val)
		case "source":
			e.SetSource(val)
		case "subject":
			e.SetSubject(val)
		case "dataschema":
			e.SetDataSchema(val)
		case "datacontenttype":
			e.SetDataContentType(val)
		case "time":
			t, err := time.Parse(time.RFC3339Nano, val)
			if err != nil {
				return Event{}, fieldErr("time", fmt.Errorf("%w: not RFC 3339", ErrBadValue))
			}
			e.SetTime(t)
		default:
			if !validExtensionName(name) {
				continue
			}
			e.SetExtension(name, val)
		}
	}
	if ct := headerValue(h, headerContentType); ct != "" {
		if mediaType(ct) == ContentTypeJSON {
			ct = ContentTypeJSON
		}
		e.SetDataContentType(ct)
	}
	if len(body) > 0 {
		e.DataEncoded = body
	}
	return e, nil
}

// reservedName are the CloudEvents v1 names an extension may not take.
var reservedName = map[string]bool{
	"specversion": true, "id": true, "source": true, "type": true, "datacontenttype": true,
	"dataschema": true, "subject": true, "time": true, "data": true,
}

// validExtensionName follows the CloudEvents rule: lower-case letters and digits,
// at most 20 characters.
func validExtensionName(s string) bool {
	if s == "" || len(s) > 20 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

func checkEnvelope(e *Event) error {
	if e.SpecVersion() != event.CloudEventsVersionV1 {
		return fieldErr("specversion", fmt.Errorf("%w: %q (want 1.0)", ErrBadValue, truncate(e.SpecVersion(), 20)))
	}
	if err := e.Validate(); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if err := CheckToken("id", e.ID()); err != nil {
		return err
	}
	for name := range e.Extensions() {
		// The SDK keeps an unknown member of a structured event as an
		// extension under its lower-cased name: "dAtA" would become a
		// second "data", which re-encoding turns into the data itself.
		if name == "" || strings.Trim(name, "abcdefghijklmnopqrstuvwxyz0123456789") != "" || reservedName[name] {
			return fieldErr(truncate(name, 40), fmt.Errorf("%w: not an extension attribute name (lower-case letters and digits, not a context attribute or data)", ErrBadValue))
		}
	}
	if t := e.Time(); !t.IsZero() && (t.UTC().Year() < 0 || t.UTC().Year() > 9999) {
		return fieldErr("time", fmt.Errorf("%w: outside years 0000-9999 in UTC", ErrBadValue))
	}
	if ct := e.DataContentType(); ct != "" {
		if mt, _ := e.Context.GetDataMediaType(); mt != ContentTypeJSON {
			return fieldErr("datacontenttype", fmt.Errorf("%w: %q (want %s)", ErrBadValue, truncate(ct, 60), ContentTypeJSON))
		}
	}
	if len(e.Data()) > 0 && !json.Valid(e.Data()) {
		return fieldErr("data", fmt.Errorf("%w: not valid JSON", ErrMalformed))
	}
	if len(e.Data()) > 0 && e.DataContentType() == "" {
		e.SetDataContentType(ContentTypeJSON)
	}
	return nil
}

func headerValue(h Header, key string) string {
	if vs, ok := h[key]; ok && len(vs) > 0 {
		return vs[0]
	}
	for k, vs := range h {
		if len(vs) > 0 && strings.EqualFold(k, key) {
			return vs[0]
		}
	}
	return ""
}

func mediaType(ct string) string {
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	return strings.ToLower(strings.TrimSpace(ct))
}

// validator is a data struct of this package.
type validator interface{ Validate() error }

// DecodeData checks that e has type typ and reads its data into a T, then
// validates it. Data of the wrong shape (a string where an object belongs, for
// example) wraps ErrMalformed; data holding invalid UTF-8 or a lone surrogate
// escape anywhere, unknown fields included, wraps ErrBadText (CheckJSONText);
// unknown fields are otherwise ignored.
func DecodeData[T any, PT interface {
	*T
	validator
}](e *Event, typ string) (T, error) {
	var v T
	if e.Type() != typ {
		return v, fmt.Errorf("%w: %q (want %q)", ErrWrongType, truncate(e.Type(), 60), typ)
	}
	data := e.Data()
	if len(data) == 0 {
		return v, fieldErr("data", ErrMissingField)
	}
	// The decoder would turn bad text into U+FFFD; refuse it instead.
	if err := CheckJSONText(data); err != nil {
		return v, fieldErr("data", err)
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return v, fieldErr("data", fmt.Errorf("%w: %v", ErrMalformed, err))
	}
	if err := PT(&v).Validate(); err != nil {
		return v, err
	}
	return v, nil
}

// DecodeRequested reads and validates the data of a requested event.
func DecodeRequested(e *Event) (Requested, error) { return DecodeData[Requested](e, TypeRequested) }

// DecodeResponded reads and validates the data of a responded event.
func DecodeResponded(e *Event) (Responded, error) { return DecodeData[Responded](e, TypeResponded) }

// DecodeCancel reads and validates the data of a cancel event. A cancel with no
// data is valid.
func DecodeCancel(e *Event) (Cancel, error) {
	if e.Type() == TypeCancel && len(e.Data()) == 0 {
		return Cancel{}, nil
	}
	return DecodeData[Cancel](e, TypeCancel)
}

// DecodeDecided reads and validates the data of a decided event.
func DecodeDecided(e *Event) (Decided, error) { return DecodeData[Decided](e, TypeDecided) }

// DecodePending reads and validates the data of a pending event.
func DecodePending(e *Event) (Pending, error) { return DecodeData[Pending](e, TypePending) }

// DecodeEscalated reads and validates the data of an escalated event.
func DecodeEscalated(e *Event) (Escalated, error) { return DecodeData[Escalated](e, TypeEscalated) }

// unmarshalStructured reads a structured-mode body. The SDK's parser is lenient
// (it accepts a missing "{" or trailing bytes) and panics on some inputs, so the
// body is checked first and a panic becomes an error.
func unmarshalStructured(e *Event, body []byte) (err error) {
	if !json.Valid(body) {
		return fmt.Errorf("body is not valid JSON")
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("cannot parse event: %v", r)
		}
	}()
	return e.UnmarshalJSON(body)
}
