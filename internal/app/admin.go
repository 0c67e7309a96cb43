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

// API is a running broker's HTTP API, as the client commands call it.
type API struct {
	// URL is its base URL: http://127.0.0.1:8080, https://assent.example.com.
	URL string
	// Client makes the calls; nil is http.DefaultClient. For a broker served
	// over TLS with a CA of its own, or asking for client certificates, it
	// carries them (httptls.ClientFiles.Client).
	Client *http.Client
}

func (a API) client() *http.Client {
	if a.Client == nil {
		return http.DefaultClient
	}
	return a.Client
}

// RememberedList prints the remembered choices a running broker holds, through
// its HTTP API. What came from requests and answers (ids, tools, scope
// values, principals) is printed with terminal controls escaped
// (textsafe.Line).
func RememberedList(ctx context.Context, w io.Writer, api API) error {
	var out struct {
		Remembered []policy.Grant `json:"remembered"`
	}
	if err := api.call(ctx, http.MethodGet, "/v1/remembered", nil, &out); err != nil {
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
func RememberedRevoke(ctx context.Context, w io.Writer, api API, id string) error {
	var out struct {
		Revoked policy.Grant `json:"revoked"`
	}
	if err := api.call(ctx, http.MethodDelete, "/v1/remembered/"+url.PathEscape(id), nil, &out); err != nil {
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
// running broker, through POST /v1/cancels of its HTTP API, and
// prints one line per request: its id and what became of it. With
// authentication on, the token (TokenEnv) must be the agent's own or an
// admin's; each cancel is recorded as theirs. It fails if any request could
// not be cancelled.
func Cancel(ctx context.Context, w io.Writer, api API, q CancelQuery) error {
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
	if err := api.call(ctx, http.MethodPost, "/v1/cancels", body, &out); err != nil {
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

// call sends body (JSON, or nil for none) to path of the broker's API with
// the API token, and reads its answer into out.
func (a API) call(ctx context.Context, method, path string, body []byte, out any) error {
	u := a.URL + path
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
	resp, err := a.client().Do(req)
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
