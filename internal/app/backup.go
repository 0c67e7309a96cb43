package app

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/assent-dev/assent/internal/natsconn"
	"github.com/assent-dev/assent/internal/natsembed"
	"github.com/assent-dev/assent/internal/snapshot"
	"github.com/assent-dev/assent/pkg/events"
)

// BackupFormat names the layout of a backup directory, in its manifest.
const BackupFormat = "assent-backup/1"

// ManifestFile is the file of a backup directory that describes the rest;
// it is written last, so a directory without it holds no finished backup.
const ManifestFile = "manifest.json"

// Manifest describes a backup: what was saved, from where, and how to check
// each file.
type Manifest struct {
	Format        string         `json:"format"`
	BrokerVersion string         `json:"broker_version"`
	Created       time.Time      `json:"created"`
	Server        string         `json:"server"` // the NATS server's name and version
	Streams       []StreamBackup `json:"streams"`
	Skipped       []SkippedRes   `json:"skipped,omitempty"`
}

// StreamBackup is one stream's snapshot in a backup.
type StreamBackup struct {
	Name     string          `json:"name"`
	File     string          `json:"file"`
	Bytes    int64           `json:"bytes"`
	SHA256   string          `json:"sha256"`
	Messages uint64          `json:"messages"`
	LastSeq  uint64          `json:"last_seq"`
	Config   json.RawMessage `json:"config"`
	State    json.RawMessage `json:"state"`
}

// SkippedRes is a stream a backup leaves out, and why.
type SkippedRes struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// backedUp reports whether a stream is Assent's: the event stream, its other
// streams (ASSENT_WEBHOOKS) and every assent-* bucket.
func backedUp(name string) bool {
	return name == events.StreamName || strings.HasPrefix(name, events.StreamName+"_") || strings.HasPrefix(name, "KV_assent-")
}

// Backup saves a snapshot of each of Assent's streams and buckets that nc's
// account holds into dir, which must be new or empty, with a manifest, and
// reports progress on progress (nil: none). The event stream is saved first and the
// buckets after it, so the request state can only be newer than the events:
// the skew a running broker repairs (docs/backups.md). Buckets in memory
// (live approver presence) are left out and listed as skipped.
func Backup(ctx context.Context, nc *nats.Conn, dir, version string, progress io.Writer) (*Manifest, error) {
	if progress == nil {
		progress = io.Discard
	}
	if err := emptyDir(dir, "--out"); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	var names []string
	lister := js.StreamNames(ctx)
	for name := range lister.Name() {
		if backedUp(name) {
			names = append(names, name)
		}
	}
	if err := lister.Err(); err != nil {
		return nil, fmt.Errorf("list streams: %w", err)
	}
	// ASSENT first; the rest in name order.
	slices.SortFunc(names, func(a, b string) int {
		switch {
		case a == b:
			return 0
		case a == events.StreamName:
			return -1
		case b == events.StreamName:
			return 1
		}
		return strings.Compare(a, b)
	})
	if len(names) == 0 || names[0] != events.StreamName {
		return nil, fmt.Errorf("no %s stream on %s: is this the NATS server (and account) the broker uses?", events.StreamName, nc.ConnectedUrlRedacted())
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	m := &Manifest{Format: BackupFormat, BrokerVersion: version, Created: time.Now().UTC(),
		Server: nc.ConnectedServerName() + " " + nc.ConnectedServerVersion()}
	for i, name := range names {
		s, err := js.Stream(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("stream %s: %w", name, err)
		}
		if s.CachedInfo().Config.Storage == jetstream.MemoryStorage {
			m.Skipped = append(m.Skipped, SkippedRes{Name: name, Reason: "kept in memory: JetStream snapshots only file storage, and its contents come back by themselves (approvers announce themselves every 10 s)"})
			fmt.Fprintf(progress, "backup %s (%d/%d): skipped, kept in memory\n", name, i+1, len(names))
			continue
		}
		sb, err := saveStream(ctx, nc, dir, name, newMeter(progress, "backup", name, i+1, len(names)))
		if err != nil {
			return nil, err
		}
		m.Streams = append(m.Streams, sb)
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := writeFileSync(filepath.Join(dir, ManifestFile), append(data, '\n')); err != nil {
		return nil, err
	}
	return m, nil
}

// saveStream writes stream's snapshot to dir/<stream>.snapshot.
func saveStream(ctx context.Context, nc *nats.Conn, dir, stream string, meter *meter) (StreamBackup, error) {
	file := stream + ".snapshot"
	tmp := filepath.Join(dir, file+".part")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return StreamBackup{}, err
	}
	defer os.Remove(tmp) //nolint:errcheck // gone after the rename
	defer f.Close()      //nolint:errcheck // closed and checked below
	sum := sha256.New()
	info, err := snapshot.Save(ctx, nc, stream, io.MultiWriter(f, sum), meter.update)
	if err != nil {
		return StreamBackup{}, err
	}
	if err := f.Sync(); err != nil {
		return StreamBackup{}, err
	}
	size, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return StreamBackup{}, err
	}
	if err := f.Close(); err != nil {
		return StreamBackup{}, err
	}
	if err := os.Rename(tmp, filepath.Join(dir, file)); err != nil {
		return StreamBackup{}, err
	}
	st, err := snapshot.ParseState(info.State)
	if err != nil {
		return StreamBackup{}, fmt.Errorf("snapshot %s: %w", stream, err)
	}
	meter.done(st.Msgs, size)
	return StreamBackup{Name: stream, File: file, Bytes: size, SHA256: hex.EncodeToString(sum.Sum(nil)),
		Messages: st.Msgs, LastSeq: st.LastSeq, Config: info.Config, State: info.State}, nil
}

// ErrBrokerRunning: a broker replica runs against the NATS server a restore
// would write to.
var ErrBrokerRunning = errors.New("a broker is running against this NATS server")

// ReadManifest reads dir's manifest and checks every file it names (size and
// SHA-256) before anything is restored.
func ReadManifest(dir string) (*Manifest, error) {
	data, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s holds no %s, so it is not a backup made by \"broker backup\" (or one that did not finish): give the directory a backup wrote", dir, ManifestFile)
	}
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("%s: %w: the manifest is damaged; use another copy of the backup", filepath.Join(dir, ManifestFile), err)
	}
	if m.Format != BackupFormat {
		return nil, fmt.Errorf("%s: format %q, want %q: not a backup this broker can restore", filepath.Join(dir, ManifestFile), m.Format, BackupFormat)
	}
	var errs []error
	for _, s := range m.Streams {
		if err := checkFile(dir, s); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("%w\nnothing was restored: use another copy of the backup", err)
	}
	return &m, nil
}

func checkFile(dir string, s StreamBackup) error {
	if s.File == "" || filepath.Base(s.File) != s.File {
		return fmt.Errorf("stream %s: file name %q in the manifest is not a plain file name", s.Name, s.File)
	}
	f, err := os.Open(filepath.Join(dir, s.File))
	if err != nil {
		return fmt.Errorf("stream %s: %w", s.Name, err)
	}
	defer f.Close() //nolint:errcheck // read only
	sum := sha256.New()
	n, err := io.Copy(sum, f)
	switch {
	case err != nil:
		return fmt.Errorf("stream %s: %s: %w", s.Name, s.File, err)
	case n != s.Bytes:
		return fmt.Errorf("stream %s: %s has %d bytes, the manifest says %d: the file is damaged", s.Name, s.File, n, s.Bytes)
	case hex.EncodeToString(sum.Sum(nil)) != s.SHA256:
		return fmt.Errorf("stream %s: %s does not match its checksum in the manifest: the file is damaged", s.Name, s.File)
	}
	return nil
}

// RestoreOptions tune Restore.
type RestoreOptions struct {
	// Force deletes streams that exist already in the target and replaces
	// them with the backup's; without it, Restore refuses and changes nothing.
	Force bool
	// Replicas, if not zero, is the replica count every restored stream gets,
	// instead of the one it was saved with: a backup of a three-node cluster
	// restored into a single server needs 1.
	Replicas int
}

// Restore restores the backup in dir into nc's server: every stream of its
// manifest, after checking every file. No broker may run against the server
// (ErrBrokerRunning otherwise). A stream that exists already is refused,
// nothing restored, unless o.Force is set: then it is deleted and replaced.
// Each restored stream must hold the messages the backup saved. Progress is
// reported on progress (nil: none).
func Restore(ctx context.Context, nc *nats.Conn, dir string, o RestoreOptions, progress io.Writer) (*Manifest, error) {
	if progress == nil {
		progress = io.Discard
	}
	if o.Replicas < 0 {
		return nil, fmt.Errorf("replicas %d: want 1 or more, or 0 for as saved", o.Replicas)
	}
	m, err := ReadManifest(dir)
	if err != nil {
		return nil, err
	}
	if err := brokerRunning(ctx, nc); err != nil {
		return nil, err
	}
	for i := range m.Streams {
		s := &m.Streams[i]
		cfg, replicas, err := withReplicas(s.Config, o.Replicas)
		if err != nil {
			return nil, fmt.Errorf("stream %s: the manifest's configuration: %w", s.Name, err)
		}
		if replicas > 1 && nc.ConnectedClusterName() == "" {
			return nil, fmt.Errorf("stream %s was saved with %d replicas, but %s is a single server, not a cluster; nothing was restored: restore with --replicas 1", s.Name, replicas, nc.ConnectedUrlRedacted())
		}
		s.Config = cfg
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	var existing []string
	for _, s := range m.Streams {
		_, err := js.Stream(ctx, s.Name)
		switch {
		case err == nil:
			existing = append(existing, s.Name)
		case !errors.Is(err, jetstream.ErrStreamNotFound):
			return nil, fmt.Errorf("stream %s: %w", s.Name, err)
		}
	}
	if len(existing) > 0 && !o.Force {
		return nil, fmt.Errorf("%s already on %s; nothing was restored: restore into a new server (or data directory), or, to replace them with the backup's and lose what they hold now, run again with --force", plural(existing, "stream"), nc.ConnectedUrlRedacted())
	}
	for i, s := range m.Streams {
		meter := newMeter(progress, "restore", s.Name, i+1, len(m.Streams))
		if slices.Contains(existing, s.Name) {
			if err := js.DeleteStream(ctx, s.Name); err != nil {
				return nil, fmt.Errorf("--force: delete stream %s: %w", s.Name, err)
			}
			fmt.Fprintf(progress, "restore %s (%d/%d): deleted the existing stream (--force)\n", s.Name, i+1, len(m.Streams))
		}
		f, err := os.Open(filepath.Join(dir, s.File))
		if err != nil {
			return nil, err
		}
		st, err := snapshot.Restore(ctx, nc, snapshot.Info{Config: s.Config, State: s.State}, f, meter.update)
		f.Close() //nolint:errcheck // read only
		if err != nil {
			return nil, err
		}
		if st.Msgs != s.Messages || st.LastSeq != s.LastSeq {
			return nil, fmt.Errorf("stream %s restored with %d messages up to sequence %d, but the backup saved %d up to %d: check the server's log, then restore again with --force", s.Name, st.Msgs, st.LastSeq, s.Messages, s.LastSeq)
		}
		meter.done(st.Msgs, s.Bytes)
	}
	return m, nil
}

// withReplicas returns cfg, a stream configuration, with replicas replicas
// unless that is zero, and the replica count it then has.
func withReplicas(cfg json.RawMessage, replicas int) (json.RawMessage, int, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(cfg, &fields); err != nil {
		return nil, 0, err
	}
	if replicas == 0 {
		n := 1
		if raw, ok := fields["num_replicas"]; ok {
			if err := json.Unmarshal(raw, &n); err != nil {
				return nil, 0, err
			}
		}
		return cfg, max(n, 1), nil
	}
	fields["num_replicas"] = json.RawMessage(fmt.Sprint(replicas))
	out, err := json.Marshal(fields)
	return out, replicas, err
}

// brokerRunning asks, as an agent looking up a decision would, whether a
// broker answers on nc's server: any answer (even "unknown") means one runs.
func brokerRunning(ctx context.Context, nc *nats.Conn) error {
	subject := events.PrivatePrefix + "assent-restore.lookup.probe"
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	_, err := nc.RequestWithContext(ctx, subject, nil)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return nil
	case err == nil:
		return fmt.Errorf("%w (one answered on %s): stop every broker replica that uses %s, restore, then start them again", ErrBrokerRunning, subject, nc.ConnectedUrlRedacted())
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%w (something listens on %s but did not answer): stop every broker replica that uses %s, restore, then start them again", ErrBrokerRunning, subject, nc.ConnectedUrlRedacted())
	}
	return fmt.Errorf("check for a running broker: %w", err)
}

// emptyDir checks that dir does not exist or is an empty directory.
func emptyDir(dir, flagName string) error {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("%s %s: %w", flagName, dir, err)
	case len(entries) > 0:
		return fmt.Errorf("%s %s is not empty: give a new or empty directory, so that nothing is overwritten or mixed in", flagName, dir)
	}
	return nil
}

func writeFileSync(path string, data []byte) error {
	tmp := path + ".part"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close() //nolint:errcheck // the write failed already
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close() //nolint:errcheck // the sync failed already
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync() // the rename, on file systems that need it
		d.Close()    //nolint:errcheck // read only
	}
	return nil
}

// meter reports one stream's progress: bytes at most once a second, then a
// line when done.
type meter struct {
	w              io.Writer
	verb, name     string
	i, n           int
	start, printed time.Time
}

func newMeter(w io.Writer, verb, name string, i, n int) *meter {
	now := time.Now()
	return &meter{w: w, verb: verb, name: name, i: i, n: n, start: now, printed: now}
}

func (m *meter) update(bytes int64) {
	if time.Since(m.printed) < time.Second {
		return
	}
	m.printed = time.Now()
	fmt.Fprintf(m.w, "%s %s (%d/%d): %s so far\n", m.verb, m.name, m.i, m.n, byteSize(bytes))
}

func (m *meter) done(msgs uint64, bytes int64) {
	fmt.Fprintf(m.w, "%s %s (%d/%d): %s, %s, done in %s\n", m.verb, m.name, m.i, m.n, messages(msgs), byteSize(bytes), time.Since(m.start).Round(time.Millisecond))
}

// messages says n messages, or 1 message.
func messages(n uint64) string {
	if n == 1 {
		return "1 message"
	}
	return fmt.Sprintf("%d messages", n)
}

func byteSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for q := n / unit; q >= unit; q /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func plural(names []string, what string) string {
	if len(names) == 1 {
		return what + " " + names[0] + " is"
	}
	return what + "s " + strings.Join(names, ", ") + " are"
}

// natsFlags defines the flags of a command's NATS connection, credsHelp
// saying whose credentials it takes.
func natsFlags(fs *flag.FlagSet, credsHelp string) *natsconn.Settings {
	var s natsconn.Settings
	fs.StringVar(&s.URL, "nats-url", "nats://127.0.0.1:4222", "the NATS server or cluster `URL` the broker uses (a broker's embedded server listens on 127.0.0.1:4222)")
	fs.StringVar(&s.Creds, "nats-creds", "", credsHelp)
	fs.StringVar(&s.CAFile, "nats-ca", "", "the CA `file` of the server's TLS certificate, if the system does not trust it")
	fs.StringVar(&s.CertFile, "nats-cert", "", "a client certificate `file`, for a server that asks for one (mutual TLS)")
	fs.StringVar(&s.KeyFile, "nats-key", "", "the client certificate's key `file`")
	return &s
}

// backupCommands are `broker backup` and `broker restore` (docs/backups.md).
func backupCommands() []*command {
	return []*command{
		{
			name: "backup", synopsis: "--out DIR [--nats-url URL] [--nats-creds FILE]",
			summary:  "save the stream and buckets to a directory",
			required: []string{"out"},
			about: `Saves a snapshot of Assent's stream (ASSENT) and of each of its buckets, taken
by JetStream itself, with their consumers, into DIR (new or empty), and a
manifest (manifest.json: the broker's version, the time, each stream's
configuration, message count and checksum). The broker may keep running: each
stream is saved as it is at one moment, ASSENT first. Progress goes to
standard error. "broker restore" puts a backup back (docs/backups.md).`,
			define: func(fs *flag.FlagSet) func(context.Context, CLI, []string) error {
				s := natsFlags(fs, "NATS credentials `file` (a broker's: broker creds broker)")
				out := fs.String("out", "", "the `DIR` to write the backup to: new or empty")
				return func(ctx context.Context, c CLI, _ []string) error {
					if err := emptyDir(*out, "--out"); err != nil {
						return err
					}
					nc, err := natsconn.Connect(*s, nats.Name("assent-backup"))
					if err != nil {
						return err
					}
					defer nc.Close()
					m, err := Backup(ctx, nc, *out, c.Version, c.Stderr)
					if err != nil {
						return err
					}
					_, err = fmt.Fprintf(c.Stdout, "backed up %d streams (%s, %s) to %s\n", len(m.Streams), messages(m.messages()), byteSize(m.bytes()), *out)
					return err
				}
			},
		},
		{
			name: "restore", synopsis: "--from DIR [--nats-url URL | --data DIR] [--force] [--replicas N]",
			summary:  "restore a backup into a NATS server",
			required: []string{"from"},
			about: `Restores the backup in DIR ("broker backup") into the NATS server at
--nats-url, or into a new data directory for the broker's embedded server
(--data DIR; then run "broker --data DIR"). It first checks every file against
the manifest, and refuses while a broker runs against the server: stop every
replica first, and start them after. A stream that exists already is not
touched, and nothing is restored, unless --force says to delete and replace
it. --replicas sets the streams' replica count (a backup of a cluster into a
single server needs 1). Each restored stream is checked to hold the messages
the backup saved. Pending requests keep their deadlines. Progress goes to
standard error.`,
			define: func(fs *flag.FlagSet) func(context.Context, CLI, []string) error {
				s := natsFlags(fs, "NATS credentials `file` (a broker's: broker creds broker)")
				from := fs.String("from", "", "the backup's `DIR`")
				data := fs.String("data", "", "restore into this new `DIR` for the broker's embedded server, instead of --nats-url")
				var o RestoreOptions
				fs.BoolVar(&o.Force, "force", false, "delete streams that exist already in the target and replace them with the backup's")
				fs.IntVar(&o.Replicas, "replicas", 0, "give every stream `N` replicas instead of the number it was saved with (1 for a single server)")
				return func(ctx context.Context, c CLI, _ []string) error {
					urlSet := false
					fs.Visit(func(f *flag.Flag) { urlSet = urlSet || f.Name == "nats-url" })
					if *data != "" && urlSet {
						return errors.New("give --nats-url or --data, not both: --data restores into a new data directory of the embedded server")
					}
					if _, err := ReadManifest(*from); err != nil {
						return err
					}
					var nc *nats.Conn
					if *data != "" {
						if err := emptyDir(*data, "--data"); err != nil {
							return fmt.Errorf("%w; restoring into a data directory a broker may be using could damage it", err)
						}
						ns, err := natsembed.Start(natsembed.Config{Port: -1, StoreDir: *data}, nil)
						if err != nil {
							return err
						}
						defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
						if nc, err = nats.Connect(ns.ClientURL(), nats.InProcessServer(ns), nats.Name("assent-restore")); err != nil {
							return err
						}
					} else {
						var err error
						if nc, err = natsconn.Connect(*s, nats.Name("assent-restore")); err != nil {
							return err
						}
					}
					defer nc.Close()
					m, err := Restore(ctx, nc, *from, o, c.Stderr)
					if err != nil {
						return err
					}
					where := nc.ConnectedUrlRedacted()
					if *data != "" {
						where = *data + `; start the broker with --data ` + *data
					}
					_, err = fmt.Fprintf(c.Stdout, "restored %d streams (%s) from %s, saved %s, into %s\n", len(m.Streams), messages(m.messages()), *from, m.Created.Format(time.RFC3339), where)
					return err
				}
			},
		},
	}
}

func (m *Manifest) messages() (n uint64) {
	for _, s := range m.Streams {
		n += s.Messages
	}
	return n
}

func (m *Manifest) bytes() (n int64) {
	for _, s := range m.Streams {
		n += s.Bytes
	}
	return n
}
