package events

import "time"

// Presence: approver channels announce which principals they reach, so the
// broker can fail fast when nobody could answer a request. A channel puts an
// Announcement under the key "<principal>.<channel>" of the JetStream KV bucket
// PresenceBucket at least every PresenceRefresh; an entry not refreshed for
// PresenceTTL is gone.
const (
	PresenceBucket  = "assent-presence"
	PresenceTTL     = 30 * time.Second
	PresenceRefresh = 10 * time.Second
)

// Announcement is the value of a presence entry.
type Announcement struct {
	Principal string    `json:"principal"`
	Channel   string    `json:"channel"`
	At        time.Time `json:"at"`
}

// PresenceKey is the key principal's channel announces itself under.
func PresenceKey(principal, channel string) (string, error) {
	if err := CheckToken("principal", principal); err != nil {
		return "", err
	}
	if err := CheckToken("channel", channel); err != nil {
		return "", err
	}
	return principal + "." + channel, nil
}
