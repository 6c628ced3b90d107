package client_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmq/llmq/client"
)

func TestSignAndVerify(t *testing.T) {
	t.Parallel()
	secret, body := "whsec_test", []byte(`{"id":"job_1","status":"succeeded"}`)
	now := time.Now()
	h := client.SignWebhook([]string{secret}, now, body)
	if !strings.HasPrefix(h, "t=") || !strings.Contains(h, ",v1=") {
		t.Fatalf("header = %q", h)
	}
	if err := client.VerifyWebhook(secret, h, body, 5*time.Minute); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	cases := []struct {
		name   string
		secret string
		header string
		body   []byte
		want   error
	}{
		{"other body", secret, h, []byte(`{"id":"job_1","status":"failed"}`), client.ErrBadSignature},
		{"other secret", "whsec_other", h, body, client.ErrBadSignature},
		{"too old", secret, client.SignWebhook([]string{secret}, now.Add(-10*time.Minute), body), body, client.ErrStaleSignature},
		{"from the future", secret, client.SignWebhook([]string{secret}, now.Add(10*time.Minute), body), body, client.ErrStaleSignature},
		{"no header", secret, "", body, client.ErrNoSignature},
		{"no v1", secret, "t=123", body, client.ErrNoSignature},
		{"timestamp moved", secret, strings.Replace(h, "t=", "t=1", 1), body, client.ErrBadSignature},
	}
	for _, c := range cases {
		if err := client.VerifyWebhook(c.secret, c.header, c.body, 5*time.Minute); !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
		}
	}
	// A header with a rotated-out signature beside the current one passes.
	rotated := h + ",v1=" + strings.Repeat("ab", 32)
	if err := client.VerifyWebhook(secret, rotated, body, 5*time.Minute); err != nil {
		t.Fatalf("two signatures: %v", err)
	}
	// During a rotation's overlap a delivery is signed by both secrets: a
	// receiver holding either verifies it, one holding neither does not.
	both := client.SignWebhook([]string{"whsec_new", secret}, now, body)
	for _, s := range []string{"whsec_new", secret} {
		if err := client.VerifyWebhook(s, both, body, 5*time.Minute); err != nil {
			t.Errorf("signed by both, verified with %s: %v", s, err)
		}
	}
	if err := client.VerifyWebhook("whsec_other", both, body, 5*time.Minute); !errors.Is(err, client.ErrBadSignature) {
		t.Errorf("signed by both, verified with a third secret: %v", err)
	}
}

// A receiver checks each delivery's signature over the raw body before it
// reads the body, and answers 2xx once it has what it needs.
func ExampleVerifyWebhook() {
	const secret = "whsec_example" // the tenant's webhook_secret (llmq admin tenants get ID)
	receive := func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, "cannot read the body", http.StatusBadRequest)
			return
		}
		if err := client.VerifyWebhook(secret, r.Header.Get(client.WebhookSignatureHeader), body, 5*time.Minute); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		var job client.Job
		if err := json.Unmarshal(body, &job); err != nil {
			http.Error(w, "not a job", http.StatusBadRequest)
			return
		}
		// Deliveries are at least once: dedupe by WebhookIDHeader.
		fmt.Println(r.Header.Get(client.WebhookEventHeader), r.Header.Get(client.WebhookIDHeader), job.Status)
		w.WriteHeader(http.StatusNoContent)
	}

	// A delivery as llmq sends it.
	body := []byte(`{"id":"job_1","object":"job","status":"succeeded"}`)
	req := httptest.NewRequest(http.MethodPost, "/hooks/llmq", bytes.NewReader(body))
	req.Header.Set(client.WebhookEventHeader, "job.succeeded")
	req.Header.Set(client.WebhookIDHeader, "job:job_1")
	req.Header.Set(client.WebhookSignatureHeader, client.SignWebhook([]string{secret}, time.Now(), body))
	w := httptest.NewRecorder()
	receive(w, req)
	fmt.Println(w.Code)
	// Output:
	// job.succeeded job:job_1 succeeded
	// 204
}
