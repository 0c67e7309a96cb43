package app

import (
	"errors"
	"fmt"
	"os"

	"github.com/nats-io/nkeys"

	"github.com/assent-dev/assent/pkg/events"
)

// ReadDecisionKey reads the broker's decision key from the seed file path
// (events.ParseDecisionKey: an nkeys account seed).
func ReadDecisionKey(path string) (nkeys.KeyPair, error) {
	seed, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("decision key: %w", err)
	}
	defer clear(seed)
	kp, err := events.ParseDecisionKey(seed)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return kp, nil
}

// NewDecisionKeyFile makes a new decision key, writes its seed to path (a
// new file, readable by its owner only: an existing one is never
// overwritten), and returns its public key, which readers trust.
func NewDecisionKeyFile(path string) (string, error) {
	kp, err := events.NewDecisionKey()
	if err != nil {
		return "", err
	}
	defer kp.Wipe()
	seed, err := kp.Seed()
	if err != nil {
		return "", err
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return "", err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("%s exists: a decision key is never overwritten; move it away first", path)
		}
		return "", err
	}
	_, err = f.Write(append(seed, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	return pub, nil
}
