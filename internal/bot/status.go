package bot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/assent-dev/assent/internal/channels"
)

// StatusPath serves the bot's status as JSON: NATS, and each channel with
// whom it reaches and what keeps it from delivering.
const StatusPath = "/status"

// MetricsPath serves the bot's metrics, for Prometheus.
const MetricsPath = "/metrics"

// Status is what StatusPath answers.
type Status struct {
	NATS     string          `json:"nats"`
	Channels []ChannelStatus `json:"channels"`
}

// ChannelStatus is one channel's part of Status.
type ChannelStatus struct {
	Name string `json:"name"`
	// Reaches are the principals the channel announces now.
	Reaches []string `json:"reaches"`
	// Problems keep it from delivering (channels.Problem); none while it
	// delivers.
	Problems []channels.Problem `json:"problems,omitempty"`
}

// status is the bot's Status now.
func (b *Bot) status() Status {
	s := Status{NATS: b.nc.Status().String()}
	for _, a := range b.adapters {
		cs := ChannelStatus{Name: a.Name(), Reaches: a.Reaches()}
		if r, ok := a.(channels.Reporter); ok {
			cs.Problems = r.Problems()
		}
		s.Channels = append(s.Channels, cs)
	}
	return s
}

func (b *Bot) serveStatus(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(b.status())
}

// metrics returns the handler of MetricsPath: for each channel whether it
// delivers, how many principals it announces, and each problem; whether
// NATS is connected; and the Go runtime's and the process's collectors.
func (b *Bot) metrics() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), statusCollector{b})
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}

var (
	descDelivering = prometheus.NewDesc("assent_bot_channel_delivering",
		"1 while the channel delivers, 0 while something keeps it from delivering to some principals (assent_bot_channel_problem says what).", []string{"channel"}, nil)
	descReaches = prometheus.NewDesc("assent_bot_channel_principals",
		"Principals the channel announces as reachable (it leaves out those it cannot deliver to).", []string{"channel"}, nil)
	descProblem = prometheus.NewDesc("assent_bot_channel_problem",
		"1 for each thing that keeps a channel from delivering: the target it cannot reach (a Slack conversation or user; empty for its credentials) and the service's error code.", []string{"channel", "target", "code"}, nil)
	descNATS = prometheus.NewDesc("assent_bot_nats_connected", "1 while the bot's NATS connection is up, else 0.", nil, nil)
)

// statusCollector reads the bot's status at each scrape.
type statusCollector struct{ b *Bot }

func (c statusCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDelivering, descReaches, descProblem, descNATS} {
		ch <- d
	}
}

func (c statusCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.b.status()
	ch <- prometheus.MustNewConstMetric(descNATS, prometheus.GaugeValue, bool01(c.b.nc.Status() == nats.CONNECTED))
	for _, cs := range s.Channels {
		ch <- prometheus.MustNewConstMetric(descDelivering, prometheus.GaugeValue, bool01(len(cs.Problems) == 0), cs.Name)
		ch <- prometheus.MustNewConstMetric(descReaches, prometheus.GaugeValue, float64(len(cs.Reaches)), cs.Name)
		for _, p := range cs.Problems {
			ch <- prometheus.MustNewConstMetric(descProblem, prometheus.GaugeValue, 1, cs.Name, p.Target, p.Code)
		}
	}
}

func bool01(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// ErrCannotDeliver is wrapped by the health command's error when a channel
// of a running bot cannot deliver.
var ErrCannotDeliver = errors.New("a channel cannot deliver")

// checkStatus asks the running bot whose health endpoint is healthURL for
// its status (StatusPath on the same server), and returns an error wrapping
// ErrCannotDeliver that lists what keeps its channels from delivering. A
// bot that serves no status (an older one) passes.
func checkStatus(ctx context.Context, healthURL string, timeout time.Duration) error {
	u, err := url.Parse(healthURL)
	if err != nil {
		return err
	}
	u.Path, u.RawQuery = StatusPath, ""
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil
	}
	var s Status
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&s); err != nil {
		return fmt.Errorf("%s: %w", u, err)
	}
	var lines []string
	for _, c := range s.Channels {
		for _, p := range c.Problems {
			who := "everyone"
			if len(p.Principals) > 0 {
				who = strings.Join(p.Principals, ", ")
			}
			lines = append(lines, fmt.Sprintf("%s cannot deliver to %s since %s: %s", c.Name, who, p.Since.Format(time.RFC3339), p.Message))
		}
	}
	if len(lines) > 0 {
		return fmt.Errorf("%w:\n  %s", ErrCannotDeliver, strings.Join(lines, "\n  "))
	}
	return nil
}
