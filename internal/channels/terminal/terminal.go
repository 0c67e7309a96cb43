package terminal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	tea "github.com/charmbracelet/bubbletea"
	"github.com/charmbracelet/x/term"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/assent-dev/assent/internal/channels"
	"github.com/assent-dev/assent/pkg/events"
	"github.com/assent-dev/assent/pkg/handler"
)

// Channel is the terminal's channel name, as decisions and presence record it.
const Channel = "cli"

// Lookback is how far back the terminal looks in the stream at start for
// requests still pending: the broker's default longest timeout.
const Lookback = 24 * time.Hour

// Options configure Run.
type Options struct {
	// NATS is the connection to the broker's NATS server or cluster. It
	// stays the caller's: Run neither drains nor closes it. Required.
	NATS *nats.Conn
	// Principal is who answers: a principal of the policy, as a subject
	// token. Required.
	Principal string
	// Directory, if set, is the brokers' policy: requests the principal may
	// not answer are shown dimmed with the reason (or hidden), and answering
	// them is refused locally with nothing sent. Nil shows every pending
	// request and leaves every judgement to the broker.
	Directory *channels.Directory
	// Agents limits the list to these agents' requests; empty means all.
	Agents []string
	// Editor edits arguments (key e): a program, or a shell command line,
	// given the file to edit as its last argument. Default $VISUAL, then
	// $EDITOR, then vi.
	Editor string
	// In and Out are the terminal. Default os.Stdin and os.Stdout. An In
	// that is a file must be a terminal.
	In  io.Reader
	Out io.Writer
	// Trusted, if set, are the broker's decision keys: a decided event none
	// of them signed does not withdraw a request (docs/protocol.md).
	Trusted *events.TrustedKeys
	// Logger; nil logs nothing. The screen is the terminal's, so log to a
	// file (or not at all) rather than to stderr.
	Logger *zap.Logger
}

// withDefaults returns o with every unset optional field at its default.
func (o Options) withDefaults() Options {
	if o.Editor == "" {
		o.Editor = os.Getenv("VISUAL")
	}
	if o.Editor == "" {
		o.Editor = os.Getenv("EDITOR")
	}
	if o.Editor == "" {
		o.Editor = "vi"
	}
	if o.In == nil {
		o.In = os.Stdin
	}
	if o.Out == nil {
		o.Out = os.Stdout
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return o
}

// Validate reports every problem with o at once, each saying what to do
// about it. Run calls it on o with its defaults applied.
func (o Options) Validate() error {
	var errs []error
	switch {
	case o.NATS == nil:
		errs = append(errs, errors.New("no NATS connection: connect to the broker's NATS server (--nats-url) first"))
	case o.NATS.IsClosed():
		errs = append(errs, errors.New("the NATS connection is closed: connect again (--nats-url)"))
	}
	if err := events.CheckToken("principal", o.Principal); err != nil {
		errs = append(errs, fmt.Errorf("%w: pass --principal with your name in the policy (1-128 characters of A-Z a-z 0-9 _ -)", err))
	} else if o.Directory != nil {
		if p := o.Directory.Policy(); p != nil && len(p.Principals) > 0 && p.Principals[o.Principal] == nil {
			errs = append(errs, fmt.Errorf("principal %q is not in the policy: pass --principal with one of %s", o.Principal, strings.Join(o.Directory.Expand(nil), ", ")))
		}
	}
	for _, a := range o.Agents {
		if err := events.CheckToken("agent", a); err != nil {
			errs = append(errs, fmt.Errorf("%w: fix --agent", err))
		}
	}
	if f, ok := o.In.(*os.File); ok && !term.IsTerminal(f.Fd()) {
		errs = append(errs, errors.New("input is not a terminal: run approver-bot cli in an interactive terminal, without piping or redirecting its input"))
	}
	if o.Out == nil {
		errs = append(errs, errors.New("no output: Out must be the terminal"))
	}
	return errors.Join(errs...)
}

// setupTimeout bounds the start, when the caller's context sets no deadline.
const setupTimeout = 15 * time.Second

// Run shows the principal's pending requests in the terminal o.In and o.Out
// and answers them as the user says, until the user quits (q, ctrl+c) or ctx
// ends; both return nil. It returns an error, without touching the screen,
// if the options are invalid or the broker's stream cannot be read.
//
// Run follows the stream from Lookback ago with an ordered consumer, so the
// list holds the requests pending before it started too; it announces the
// principal's presence on the "cli" channel while it runs, and waits for
// answers in flight before it returns.
func Run(ctx context.Context, o Options) error {
	o = o.withDefaults()
	if err := o.Validate(); err != nil {
		return fmt.Errorf("terminal: %w", err)
	}
	log := o.Logger.Named("terminal").With(zap.String("principal", o.Principal))
	js, err := jetstream.New(o.NATS)
	if err != nil {
		return fmt.Errorf("terminal: %w", err)
	}
	f := newFeed(log, events.Codec{MaxSize: max(int(o.NATS.MaxPayload()), events.DefaultMaxEventSize)})
	f.trusted = o.Trusted
	cons, err := f.consumer(ctx, js, o.Agents, time.Now().Add(-Lookback))
	if err != nil {
		return fmt.Errorf("terminal: %w", streamAdvice(err, o.NATS))
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var sends inflight
	m := newModel(runCtx, config{
		principal: o.Principal,
		dir:       o.Directory,
		editor:    o.Editor,
		out:       o.Out,
		status:    o.NATS.Status,
		answer:    answerer(js, o.Principal, &sends),
		styles:    newStyles(o.Out),
		log:       log,
	})
	p := tea.NewProgram(m,
		tea.WithInput(o.In),
		tea.WithOutput(o.Out),
		tea.WithAltScreen(),
		tea.WithoutSignalHandler(), // the caller owns signals: they end ctx
	)

	cc, err := cons.Consume(f.handle, jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) { f.fail(err) }))
	if err != nil {
		return fmt.Errorf("terminal: read the stream: %w", err)
	}
	if info := cons.CachedInfo(); info != nil && info.NumPending == 0 {
		f.caughtUp() // nothing to replay
	}

	// What the feed reads waits in its queue until the program runs.
	var wg sync.WaitGroup
	ended := make(chan struct{})
	wg.Go(func() {
		// Quit rather than kill the program when ctx ends: a killed
		// program leaves its input reader running and the terminal's
		// last screen unpainted.
		select {
		case <-ctx.Done():
			p.Quit()
		case <-ended:
		}
	})
	wg.Go(func() { f.forward(runCtx, p.Send) })
	wg.Go(func() { tick(runCtx, p.Send) })
	wg.Go(func() { handler.Announce(runCtx, js, log, Channel, func() []string { return []string{o.Principal} }) })

	_, err = p.Run()
	close(ended)
	stop()
	cc.Stop()
	<-cc.Closed()
	wg.Wait()
	sends.Wait()
	if err != nil {
		return fmt.Errorf("terminal: the screen failed (%w): run approver-bot cli in an interactive terminal", err)
	}
	return nil
}

// streamAdvice says what to do about an error opening the stream.
func streamAdvice(err error, nc *nats.Conn) error {
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("no stream %s on %s: no Assent broker has run against this NATS server; start the broker (it creates the stream) or point --nats-url at the broker's NATS: %w", events.StreamName, nc.ConnectedUrlRedacted(), err)
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, nats.ErrNoResponders):
		return fmt.Errorf("%s does not serve JetStream: point --nats-url at the broker's NATS server: %w", nc.ConnectedUrlRedacted(), err)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return fmt.Errorf("the NATS server did not answer in time: check --nats-url and that the server is up, then try again: %w", err)
	}
	return fmt.Errorf("read stream %s: %w (check the NATS credentials allow reading it)", events.StreamName, err)
}

// tick sends the time every second until ctx ends: deadlines count down,
// and answers without a decision are reported.
func tick(ctx context.Context, send func(tea.Msg)) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			send(tickMsg(now))
		}
	}
}
