package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"text/tabwriter"
	"time"

	"github.com/assent-dev/assent/internal/textsafe"
	"github.com/assent-dev/assent/pkg/policy"
)

// RememberedList prints the remembered choices a running broker holds, through
// its HTTP API at base (e.g. http://127.0.0.1:8080). What came from requests
// and answers (ids, tools, scope values, principals) is printed with terminal
// controls escaped (textsafe.Line).
func RememberedList(ctx context.Context, w io.Writer, base string) error {
	var out struct {
		Remembered []policy.Grant `json:"remembered"`
	}
	if err := adminCall(ctx, http.MethodGet, base+"/v1/remembered", &out); err != nil {
		return err
	}
	if len(out.Remembered) == 0 {
		fmt.Fprintln(w, "no remembered choices")
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tVERDICT\tTOOL\tSCOPE\tBY\tEXPIRES")
	for _, g := range out.Remembered {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s=%s\t%s\t%s\n", textsafe.Line(g.ID), textsafe.Line(string(g.Verdict)), textsafe.Line(g.Tool),
			textsafe.Line(g.Scope), textsafe.Line(g.ScopeValue), textsafe.Line(g.CreatedBy), g.ExpiresAt.Format(time.RFC3339))
	}
	return tw.Flush()
}

// RememberedRevoke revokes remembered choice id on a running broker, and
// prints what it revoked as RememberedList does.
func RememberedRevoke(ctx context.Context, w io.Writer, base, id string) error {
	var out struct {
		Revoked policy.Grant `json:"revoked"`
	}
	if err := adminCall(ctx, http.MethodDelete, base+"/v1/remembered/"+url.PathEscape(id), &out); err != nil {
		return err
	}
	g := out.Revoked
	fmt.Fprintf(w, "revoked %s (%s %s for %s=%s)\n", textsafe.Line(g.ID), textsafe.Line(string(g.Verdict)), textsafe.Line(g.Tool), textsafe.Line(g.Scope), textsafe.Line(g.ScopeValue))
	return nil
}

// apiError reads the broker's JSON error from resp, escaped for a terminal
// (the message may quote a request), with what to do about a missing token.
func apiError(resp *http.Response, method, u string) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil || e.Error.Code == "" {
		return fmt.Errorf("%s %s: %s", method, u, resp.Status)
	}
	err := fmt.Errorf("%s: %s", textsafe.Line(e.Error.Code), textsafe.Line(e.Error.Message))
	if resp.StatusCode == http.StatusUnauthorized {
		err = fmt.Errorf("%w (set %s to an API token: broker token create)", err, TokenEnv)
	}
	return err
}

// CancelQuery selects the pending requests "broker cancel" cancels: every
// one of Agent, of Session, or of both.
type CancelQuery struct {
	Agent, Session, Reason string
}

// Cancel cancels every pending request of an agent and/or a session on a
// running broker, through POST /v1/cancels of its HTTP API at base, and
// prints one line per request: its id and what became of it. With
// authentication on, the token (TokenEnv) must be the agent's own or an
// admin's; each cancel is recorded as theirs. It fails if any request could
// not be cancelled.
func Cancel(ctx context.Context, w io.Writer, base string, q CancelQuery) error {
	body, err := json.Marshal(map[string]string{"agent": q.Agent, "session": q.Session, "reason": q.Reason})
	if err != nil {
		return err
	}
	var out struct {
		Results []struct {
			ID      string `json:"id"`
			Status  string `json:"status"`
			Message string `json:"message"`
		} `json:"results"`
		Cancelled int `json:"cancelled"`
		Total     int `json:"total"`
	}
	if err := apiCall(ctx, http.MethodPost, base+"/v1/cancels", body, &out); err != nil {
		return err
	}
	failed := 0
	for _, r := range out.Results {
		line := textsafe.Line(r.ID) + "\t" + textsafe.Line(r.Status)
		if r.Status != "cancelled" {
			failed++
			line += "\t" + textsafe.Line(r.Message)
		}
		fmt.Fprintln(w, line)
	}
	fmt.Fprintf(w, "cancelled %d of %d\n", out.Cancelled, out.Total)
	if failed > 0 {
		return errReported
	}
	return nil
}

func adminCall(ctx context.Context, method, u string, out any) error {
	return apiCall(ctx, method, u, nil, out)
}

// apiCall sends body (JSON, or nil for none) to the broker's API at u with
// the API token, and reads its answer into out.
func apiCall(ctx context.Context, method, u string, body []byte, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	authorize(req)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return apiError(resp, method, u)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return err
	}
	return json.Unmarshal(data, out)
}
