package worker

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/assent-dev/assent/internal/textsafe"
)

// WriteStepText writes r as one line for people, numbered n of total. What
// came from the plan, the approvers or the tools (tool, args, reason, errors,
// results) is shown with terminal controls escaped (textsafe.Line).
func WriteStepText(w io.Writer, r StepReport, total int) error {
	var b strings.Builder
	fmt.Fprintf(&b, "step %d/%d %s: ", r.Step, total, r.Tool)
	switch r.Outcome {
	case OutcomeUnguarded:
		b.WriteString("no approval needed")
	case OutcomeRejected:
		b.WriteString("refused before asking")
	default:
		b.WriteString(string(r.Outcome))
		if len(r.DecidedBy) > 0 {
			b.WriteString(" by " + strings.Join(r.DecidedBy, ", "))
		}
		if r.Edited {
			b.WriteString(", args edited to " + string(r.Args))
		}
		if r.Reason != "" {
			fmt.Fprintf(&b, " (%q)", r.Reason)
		}
	}
	switch {
	case r.Executed:
		b.WriteString(" -> " + r.Result.Summary())
	case r.Failed:
		b.WriteString(" -> FAILED: " + r.Error)
	case r.Error != "":
		b.WriteString(" -> not executed: " + r.Error)
	default:
		b.WriteString(" -> not executed")
	}
	if r.RequestID != "" {
		b.WriteString(" [request " + r.RequestID + "]")
	}
	_, err := io.WriteString(w, textsafe.Line(b.String())+"\n")
	return err
}

// WriteJSONLine writes v as one line of JSON. Characters a terminal would act
// on are \u escapes in it (textsafe.JSON), so the line is safe to show too.
func WriteJSONLine(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(append(textsafe.JSON(b), '\n'))
	return err
}

// WriteSummaryText writes s as one line for people.
func WriteSummaryText(w io.Writer, s Summary) error {
	notRun := ""
	if s.NotRun > 0 {
		notRun = fmt.Sprintf(", %d not run (stopped)", s.NotRun)
	}
	_, err := fmt.Fprintf(w, "%d steps: %d executed, %d not executed by decision, %d failed%s\n", s.Steps, s.Executed, s.Declined, s.Failed, notRun)
	return err
}

// WriteLoadText writes r as a short table for people, error text escaped
// (textsafe.Line). An AnswerLoad result has two more lines: answer (the
// approval's publish to the decision) and pending (asking to the pending
// notice).
func WriteLoadText(w io.Writer, r LoadResult) error {
	var b strings.Builder
	if r.Target != "" {
		fmt.Fprintf(&b, "target      %s\n", textsafe.Line(r.Target))
	}
	fmt.Fprintf(&b, "requests    %d sent, concurrency %d\n", r.Sent, r.Concurrency)
	fmt.Fprintf(&b, "total time  %s\n", r.Elapsed.Round(time.Millisecond))
	fmt.Fprintf(&b, "throughput  %.1f decided requests/s\n", r.Throughput)
	latency := func(name string, l Latency) {
		fmt.Fprintf(&b, "%-11s p50 %s  p95 %s  p99 %s  max %s  (min %s, mean %s)\n",
			name, ms(l.P50), ms(l.P95), ms(l.P99), ms(l.Max), ms(l.Min), ms(l.Mean))
	}
	latency("latency", r.Latency)
	if r.Answered {
		latency("answer", r.Answer)
		latency("pending", r.Pending)
	}
	fmt.Fprintf(&b, "outcomes    %s\n", counts(r.Outcomes))
	fmt.Fprintf(&b, "errors      %d", r.Errors)
	if r.Errors > 0 {
		fmt.Fprintf(&b, " (%s; first: %s)", counts(r.ErrorKinds), textsafe.Line(r.FirstError))
	}
	b.WriteByte('\n')
	_, err := io.WriteString(w, b.String())
	return err
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
}

func counts[K ~string](m map[K]int) string {
	if len(m) == 0 {
		return "none"
	}
	keys := slices.Sorted(maps.Keys(m))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", textsafe.Line(string(k)), m[k])
	}
	return strings.Join(parts, " ")
}
