package broker

import (
	"crypto/sha256"
	"encoding/binary"
	"strconv"
	"time"

	"github.com/google/uuid"
)

// decisionID is the event id of the decision that the stored message at
// stream sequence trigger, stored at at, makes for request id: a UUIDv7
// whose time is at and whose other bits are a hash of id and trigger. Every
// replica that handles the same trigger builds the same id, so that a
// replica whose publish was refused as a second decision can tell its own
// event (an earlier attempt whose acknowledgement was lost, or a racing
// replica's copy) from another outcome.
func decisionID(id string, trigger uint64, at time.Time) string {
	sum := sha256.Sum256([]byte(id + "\x00" + strconv.FormatUint(trigger, 10)))
	var u uuid.UUID
	copy(u[:], sum[:])
	ms := uint64(at.UnixMilli())
	var ts [8]byte
	binary.BigEndian.PutUint64(ts[:], ms)
	copy(u[0:6], ts[2:8])
	u[6] = 0x70 | u[6]&0x0f // version 7
	u[8] = 0x80 | u[8]&0x3f // RFC 9562 variant
	return u.String()
}
