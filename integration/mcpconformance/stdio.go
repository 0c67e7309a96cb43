package mcpconformance

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// answerPatience bounds the client's write of an answer to a server's
// request.
const answerPatience = 20 * time.Second

// StartStdio starts cmd and speaks MCP with it over its stdin and stdout:
// newline-delimited JSON, one message a line. Its stderr is kept for
// Diagnostics. Close closes its stdin, waits up to grace for the process to
// exit, and kills it if it has not: a server that keeps timers (a task's
// time to live, a slow tool) may outlive its stdin, where a proxy is
// expected to exit.
func StartStdio(cmd *exec.Cmd, grace time.Duration) (*Conn, error) {
	c := newConn()
	s := &stdioTransport{cmd: cmd, grace: grace, stderr: &tailBuffer{max: 64 << 10}, done: make(chan struct{}), exited: make(chan struct{})}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = s.stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s.stdin = stdin
	go func() {
		defer close(s.done)
		r := bufio.NewReaderSize(stdout, 1<<20)
		for {
			line, err := r.ReadBytes('\n')
			if line = bytes.TrimSpace(line); len(line) > 0 {
				c.deliver(line)
			}
			if err != nil {
				return
			}
		}
	}()
	go func() {
		<-s.done // Wait closes stdout: read it all first
		s.waitErr = cmd.Wait()
		close(s.exited)
	}()
	c.tr = s
	return c, nil
}

type stdioTransport struct {
	cmd    *exec.Cmd
	grace  time.Duration
	stdin  io.WriteCloser
	stderr *tailBuffer
	wmu    sync.Mutex
	done   chan struct{} // stdout read to its end
	exited chan struct{} // Wait returned
	// waitErr is what Wait returned; read after exited is closed.
	waitErr   error
	closeOnce sync.Once
	closeErr  error
}

func (s *stdioTransport) send(ctx context.Context, msg []byte) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	select {
	case <-s.exited:
		return fmt.Errorf("the server exited (%v); its stderr ends: %s", s.waitErr, s.stderr.tail(800))
	default:
	}
	_, err := s.stdin.Write(append(append([]byte(nil), msg...), '\n'))
	return err
}

func (s *stdioTransport) close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		s.wmu.Lock()
		_ = s.stdin.Close()
		s.wmu.Unlock()
		grace := time.NewTimer(s.grace)
		defer grace.Stop()
		select {
		case <-s.exited:
		case <-grace.C:
			_ = s.cmd.Process.Kill()
			<-s.exited
		case <-ctx.Done():
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
		var exit *exec.ExitError
		if s.waitErr != nil && !errors.As(s.waitErr, &exit) {
			s.closeErr = s.waitErr
		}
	})
	return s.closeErr
}

func (s *stdioTransport) session() string { return "" }

func (s *stdioTransport) diagnostics() string {
	return "stderr:\n" + s.stderr.tail(8<<10)
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

// tail is the last n bytes, at a line start when there is one.
func (t *tailBuffer) tail(n int) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := string(t.b)
	if len(s) > n {
		s = s[len(s)-n:]
		if i := strings.IndexByte(s, '\n'); i >= 0 {
			s = s[i+1:]
		}
	}
	return s
}

// String is everything kept.
func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
