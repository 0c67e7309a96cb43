package app

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
)

// TokenEnv names the environment variable the admin commands take an API
// token from, for a broker with authentication on.
const TokenEnv = "ASSENT_TOKEN"

// AuditQuery is what "broker audit" asks the audit log for; empty fields
// match everything.
type AuditQuery struct {
	Request, Agent, Principal, Channel, Rule, Type string
	Since, Until                                   string // RFC 3339
	Limit                                          int    // 0: every matching event
}

// Audit writes the events of a running broker's audit log matching q to w as
// JSON lines, oldest first, a page at a time through its HTTP API.
// Each line is one event as GET /v1/audit gives it; the JSON encoding escapes
// terminal controls, so the lines are safe to print.
func Audit(ctx context.Context, w io.Writer, api API, q AuditQuery) error {
	v := url.Values{"format": {"ndjson"}}
	for name, val := range map[string]string{"request": q.Request, "agent": q.Agent, "principal": q.Principal,
		"channel": q.Channel, "rule": q.Rule, "type": q.Type, "since": q.Since, "until": q.Until} {
		if val != "" {
			v.Set(name, val)
		}
	}
	written := 0
	for {
		page := 1000
		if q.Limit > 0 {
			page = min(page, q.Limit-written)
		}
		v.Set("limit", strconv.Itoa(page))
		next, n, err := api.auditPage(ctx, w, api.URL+"/v1/audit?"+v.Encode())
		if err != nil {
			return err
		}
		written += n
		if next == "" || (q.Limit > 0 && written >= q.Limit) {
			return nil
		}
		v.Set("after", next)
	}
}

// auditPage copies one page of JSON lines to w and returns the cursor of the
// next page ("" at the end) and how many lines it copied.
func (a API) auditPage(ctx context.Context, w io.Writer, u string) (string, int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", 0, err
	}
	authorize(req)
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := a.client().Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", 0, apiError(resp, http.MethodGet, u)
	}
	n := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	for sc.Scan() {
		if _, err := fmt.Fprintf(w, "%s\n", sc.Bytes()); err != nil {
			return "", n, err
		}
		n++
	}
	if err := sc.Err(); err != nil {
		return "", n, fmt.Errorf("read the audit log: %w", err)
	}
	return resp.Header.Get("X-Next-After"), n, nil
}

// authorize adds the API token from TokenEnv, if set.
func authorize(req *http.Request) {
	if tok := os.Getenv(TokenEnv); tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
}
