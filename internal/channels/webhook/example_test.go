package webhook_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"time"

	"github.com/assent-dev/assent/internal/channels/webhook"
)

// Sign with a test vector of the Standard Webhooks reference libraries.
func ExampleSign() {
	key, err := webhook.ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		panic(err)
	}
	fmt.Println(webhook.Sign(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", time.Unix(1614265330, 0), []byte(`{"test": 2432232314}`)))
	// Output: v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=
}

// A receiver checks every delivery before it acts on it.
func ExampleVerify() {
	key, err := webhook.ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		panic(err)
	}
	receive := func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			return
		}
		if err := webhook.Verify(key, r.Header, body, time.Now()); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		// Act on the event once per r.Header.Get(webhook.HeaderID).
		w.WriteHeader(http.StatusNoContent)
	}

	body := []byte(`{"specversion":"1.0","id":"evt-1","source":"broker/main","type":"dev.assent.approval.pending"}`)
	now := time.Now()
	for _, sent := range [][]byte{body, append(bytes.Clone(body), ' ')} {
		r := httptest.NewRequest(http.MethodPost, "/assent", bytes.NewReader(sent))
		r.Header.Set(webhook.HeaderID, "evt-1")
		r.Header.Set(webhook.HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
		r.Header.Set(webhook.HeaderSignature, webhook.Sign(key, "evt-1", now, body))
		w := httptest.NewRecorder()
		receive(w, r)
		fmt.Println(w.Code)
	}
	// Output:
	// 204
	// 401
}
