package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"

	"go.uber.org/zap"
)

// pprofMux serves Go's runtime profiles (net/http/pprof) under
// /debug/pprof/, on a mux of its own: never on the HTTP API's listener, and
// never through http.DefaultServeMux.
func pprofMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index) // heap, goroutine, allocs, ... by name
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// servePprof listens on addr and serves the profiles until the returned
// stop is called; stop waits for the server to end and is safe to call
// twice. It starts before anything else in Run, so that a profile can
// cover the embedded server's recovery and the broker's first pass over
// the state bucket.
func servePprof(addr string, log *zap.Logger) (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("pprof listen: %w", err)
	}
	// No write timeout: /debug/pprof/profile?seconds=N answers after N seconds.
	srv := &http.Server{Handler: pprofMux(), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Error("pprof server stopped", zap.Error(err))
		}
	}()
	url = "http://" + ln.Addr().String()
	log.Info("serving runtime profiles (pprof)", zap.String("url", url+"/debug/pprof/"))
	var once sync.Once
	return url, func() {
		once.Do(func() {
			// A profile being taken is cut short: it is of a process that is
			// going away.
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			if err := srv.Shutdown(ctx); err != nil {
				srv.Close()
			}
			<-done
		})
	}, nil
}
