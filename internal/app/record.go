package app

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/broker"
	"github.com/assent-dev/assent/internal/chain"
	"github.com/assent-dev/assent/internal/natsconn"
	"github.com/assent-dev/assent/internal/natsembed"
	"github.com/assent-dev/assent/pkg/events"
)

// recordCommands are `broker audit verify` and `broker audit witness`: the
// chained record (internal/chain, docs/security.md).
func recordCommands() []*command {
	keysFlag := func(fs *flag.FlagSet) *[]string {
		var keys []string
		fs.Func("trust-decision-key", "the broker's decision `key` (public, A...), which signs checkpoints and decisions; repeat it or separate keys with commas", func(v string) error {
			k, err := events.ParseTrustedKeys(v)
			keys = append(keys, k...)
			return err
		})
		return &keys
	}
	trusted := func(keys []string) (*events.TrustedKeys, error) {
		if len(keys) == 0 {
			return nil, nil
		}
		return events.NewTrustedKeys(keys...)
	}
	return []*command{
		{
			name: "audit verify", synopsis: "[--nats-url URL | --backup DIR] [--trust-decision-key KEY] [--witness FILE]",
			summary: "check that the record proves itself",
			about: `Reads the whole stream, live (--nats-url) or from a backup (--backup DIR, made
by "broker backup", restored into a throwaway server), and checks its chained
record: each checkpoint the brokers stored against the hash chain its
messages make, each checkpoint against the one before, that nothing younger
than the stream's age limit is gone from its start, and, with
--trust-decision-key, that the broker's key signed every checkpoint and every
decision. With --witness, the checkpoints "broker audit witness" kept must
still be there: a stream cut short or made again is found even when its own
newest checkpoints went with it. Exits 0 if the record proves itself, 1 if
not, with what is wrong.`,
			define: func(fs *flag.FlagSet) func(context.Context, CLI, []string) error {
				s := natsFlags(fs, "NATS credentials `file` that may read the stream (an approver's or agent's will do)")
				backup := fs.String("backup", "", "verify the backup in `DIR` instead of a live server")
				witness := fs.String("witness", "", "the witness `FILE` of broker audit witness")
				keys := keysFlag(fs)
				return func(ctx context.Context, c CLI, _ []string) error {
					tk, err := trusted(*keys)
					if err != nil {
						return err
					}
					o := chain.Options{Keys: tk}
					if *witness != "" {
						if _, err := os.Stat(*witness); err != nil {
							return fmt.Errorf("--witness: %w", err)
						}
						if o.Witnessed, err = chain.ReadWitnessed(*witness); err != nil {
							return err
						}
					}
					o.Progress = func(seq, last uint64) { fmt.Fprintf(c.Stderr, "read %d of %d\r", seq, last) }
					js, done, err := recordSource(ctx, c, *s, *backup)
					if err != nil {
						return err
					}
					defer done()
					r, err := chain.Verify(ctx, js, broker.StreamName, o)
					if err != nil {
						return err
					}
					printReport(c.Stdout, r)
					if !r.OK() {
						return errReported
					}
					return nil
				}
			},
		},
		{
			name: "audit witness", synopsis: "--out FILE [--every DURATION] [--trust-decision-key KEY] [--nats-url URL]",
			summary:  "keep the brokers' checkpoints outside their reach",
			required: []string{"out"},
			about: `Reads the stream's last checkpoint every --every and appends each new one to
FILE (one JSON line each, synced to disk), until interrupted. Run it where
the brokers' credentials cannot reach, with credentials that may only read
(an approver's or agent's will do). "broker audit verify --witness FILE"
then finds a stream cut short or made again. It says so at once, on standard
error, when the stream's last checkpoint goes back or does not follow the
one kept before, or (with --trust-decision-key) a trusted key did not sign
it, and then exits 1 when stopped.`,
			define: func(fs *flag.FlagSet) func(context.Context, CLI, []string) error {
				s := natsFlags(fs, "NATS credentials `file` that may read the stream (an approver's or agent's will do)")
				out := fs.String("out", "", "the witness `FILE`, appended to (made if missing)")
				every := fs.Duration("every", broker.DefaultCheckpointInterval, "how often to read the last checkpoint")
				keys := keysFlag(fs)
				return func(ctx context.Context, c CLI, _ []string) error {
					if *every <= 0 {
						return fmt.Errorf("--every %s: want a positive duration", *every)
					}
					tk, err := trusted(*keys)
					if err != nil {
						return err
					}
					if tk == nil {
						fmt.Fprintln(c.Stderr, "warning: without --trust-decision-key the witness keeps checkpoints whoever signed them")
					}
					nc, err := natsconn.Connect(*s, nats.Name("assent-witness"), nats.MaxReconnects(-1))
					if err != nil {
						return err
					}
					defer nc.Close()
					js, err := jetstream.New(nc)
					if err != nil {
						return err
					}
					alerts := 0
					fmt.Fprintf(c.Stderr, "witnessing the checkpoints of stream %s at %s into %s, every %s; stop with Ctrl-C\n", broker.StreamName, s.URL, *out, *every)
					err = chain.Witness(ctx, js, broker.StreamName, *out, chain.WitnessOptions{
						Every: *every, Keys: tk,
						Saw: func(w chain.Witnessed, cp events.Checkpoint) {
							fmt.Fprintf(c.Stdout, "%s kept the checkpoint at stream sequence %d: sequences %d to %d, head %s\n",
								w.At.Format(time.RFC3339), w.Seq, cp.From, cp.Upto, cp.Head)
						},
						Alert: func(msg string) {
							alerts++
							fmt.Fprintf(c.Stderr, "ALERT %s %s\n", time.Now().UTC().Format(time.RFC3339), msg)
						},
					})
					if err != nil {
						return err
					}
					if alerts > 0 {
						return fmt.Errorf("%d alerts: check the record with broker audit verify --witness %s", alerts, *out)
					}
					return nil
				}
			},
		},
	}
}

// recordSource is the stream to verify: the live one s reaches, or the
// backup in dir restored into a throwaway embedded server. done releases
// it.
func recordSource(ctx context.Context, c CLI, s natsconn.Settings, dir string) (jetstream.JetStream, func(), error) {
	if dir == "" {
		nc, err := natsconn.Connect(s, nats.Name("assent-verify"))
		if err != nil {
			return nil, nil, err
		}
		js, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			return nil, nil, err
		}
		return js, nc.Close, nil
	}
	if _, err := ReadManifest(dir); err != nil {
		return nil, nil, err
	}
	tmp, err := os.MkdirTemp("", "assent-verify-")
	if err != nil {
		return nil, nil, err
	}
	ns, err := natsembed.Start(natsembed.Config{Host: "127.0.0.1", Port: -1, StoreDir: tmp, Sync: "1m"}, zap.NewNop())
	if err != nil {
		os.RemoveAll(tmp)
		return nil, nil, err
	}
	done := func() {
		ns.Shutdown()
		ns.WaitForShutdown()
		os.RemoveAll(tmp)
	}
	nc, err := nats.Connect(ns.ClientURL(), nats.InProcessServer(ns))
	if err != nil {
		done()
		return nil, nil, err
	}
	closeAll := func() { nc.Close(); done() }
	if _, err := Restore(ctx, nc, dir, RestoreOptions{Replicas: 1}, c.Stderr); err != nil {
		closeAll()
		return nil, nil, fmt.Errorf("restore the backup to check it: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	return js, closeAll, nil
}

// printReport writes r for a person.
func printReport(w io.Writer, r *chain.Report) {
	verdict := "the record proves itself"
	if !r.OK() {
		verdict = fmt.Sprintf("the record does NOT prove itself: %d problems", len(r.Problems))
		if len(r.Problems) == 1 {
			verdict = "the record does NOT prove itself: 1 problem"
		}
	}
	fmt.Fprintf(w, "%s\n", verdict)
	fmt.Fprintf(w, "stream sequences %d to %d; ", r.First, r.Last)
	checkpoints := fmt.Sprintf("%d checkpoints", r.Checkpoints)
	if r.Checkpoints == 1 {
		checkpoints = "1 checkpoint"
	}
	if r.ProvenTo > 0 {
		fmt.Fprintf(w, "%d to %d proven (%s)\n", r.ProvenFrom, r.ProvenTo, checkpoints)
	} else {
		fmt.Fprintf(w, "none proven (%s)\n", checkpoints)
	}
	fmt.Fprintf(w, "decisions: %d, signed by a trusted key: %d; witnessed checkpoints: %d\n", r.Decisions, r.Signed, r.Witnessed)
	for _, p := range r.Problems {
		fmt.Fprintf(w, "PROBLEM: %s\n", p)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", strings.TrimSpace(n))
	}
}
