package chain

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/pkg/events"
)

// A witness keeps copies of the stream's checkpoints where the broker's
// credentials cannot reach them (its own disk, another machine): a stream
// cut short, or rewritten, then no longer matches what the witness saw,
// even once its newest checkpoints are gone from it (Verify's
// Options.Witnessed).

// WitnessOptions shape Witness.
type WitnessOptions struct {
	// Every is how often the stream's last checkpoint is read.
	Every time.Duration
	// Keys, if set, must have signed each checkpoint.
	Keys *events.TrustedKeys
	// Saw is told of each checkpoint kept.
	Saw func(w Witnessed, c events.Checkpoint)
	// Alert is told of what a witness must not see: a checkpoint no
	// trusted key signed, one that does not follow the last one kept, the
	// chain going back.
	Alert func(msg string)
}

// ReadWitnessed reads a witness file (one Witnessed a line); a missing file
// holds none.
func ReadWitnessed(path string) ([]Witnessed, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Witnessed
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for n := 1; sc.Scan(); n++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var w Witnessed
		if err := json.Unmarshal(sc.Bytes(), &w); err != nil {
			return nil, fmt.Errorf("%s line %d: %w (a witness file holds one checkpoint a line)", path, n, err)
		}
		out = append(out, w)
	}
	return out, sc.Err()
}

// Witness reads stream's last checkpoint every o.Every until ctx ends, and
// appends each new one to the file at path, synced to disk before it is
// reported. It returns an error only when it cannot read the stream at the
// start or write the file.
func Witness(ctx context.Context, js jetstream.JetStream, stream, path string, o WitnessOptions) error {
	kept, err := ReadWitnessed(path)
	if err != nil {
		return err
	}
	var last *events.Checkpoint
	var lastSeq uint64
	if n := len(kept); n > 0 {
		e, err := events.Decode(nil, kept[n-1].Event)
		if err != nil {
			return fmt.Errorf("%s: its last checkpoint: %w", path, err)
		}
		c, err := events.DecodeCheckpoint(&e)
		if err != nil {
			return fmt.Errorf("%s: its last checkpoint: %w", path, err)
		}
		last, lastSeq = &c, kept[n-1].Seq
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("stream %s: %w", stream, err)
	}
	alert := func(format string, args ...any) {
		if o.Alert != nil {
			o.Alert(fmt.Sprintf(format, args...))
		}
	}
	var refused uint64 // a checkpoint alerted about, not kept
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		got, found, err := LastCheckpoint(cctx, s)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			alert("cannot read the stream's last checkpoint: %v", err)
		case found && got.Seq != refused && (last == nil || got.Seq != lastSeq):
			c := got.Checkpoint
			if o.Keys != nil {
				if _, err := o.Keys.VerifyCheckpoint(got.Event); err != nil {
					alert("the checkpoint at stream sequence %d, not kept: %v", got.Seq, err)
					refused = got.Seq
					break
				}
			}
			if last != nil {
				switch {
				case c.Upto <= last.Upto || got.Seq < lastSeq:
					alert("the stream's last checkpoint (at %d, up to %d) is behind the one witnessed last (at %d, up to %d): the stream was cut short or rewritten",
						got.Seq, c.Upto, lastSeq, last.Upto)
				case c.From == last.Upto+1 && c.Prev != last.Head:
					alert("the checkpoint at stream sequence %d does not follow the one witnessed at %d (its prev %s, that head %s): the stream was rewritten",
						got.Seq, lastSeq, c.Prev, last.Head)
				}
			}
			_, body, err := events.Encode(got.Event)
			if err != nil {
				return err
			}
			w := Witnessed{Seq: got.Seq, At: time.Now().UTC(), Event: body}
			line, err := json.Marshal(w)
			if err != nil {
				return err
			}
			if _, err := f.Write(append(line, '\n')); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			if err := f.Sync(); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			last, lastSeq = &c, got.Seq
			if o.Saw != nil {
				o.Saw(w, c)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(o.Every):
		}
	}
}
