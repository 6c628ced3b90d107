package client

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Headers of a webhook delivery, a POST of the job or batch as GET shows
// it.
const (
	// WebhookSignatureHeader carries t=<unix seconds>,v1=<hex
	// HMAC-SHA256(secret, "<t>.<body>")>, one v1 per signing secret.
	WebhookSignatureHeader = "X-Llmq-Signature"
	// WebhookEventHeader names what happened: "job.succeeded",
	// "batch.completed"…
	WebhookEventHeader = "X-Llmq-Event"
	// WebhookIDHeader is the same for every attempt of one delivery
	// ("job:<id>", "batch:<id>"): deliveries are at least once, receivers
	// dedupe by it.
	WebhookIDHeader = "X-Llmq-Webhook-Id"
)

// Errors of VerifyWebhook.
var (
	ErrNoSignature    = errors.New("webhook: no valid t=…,v1=… signature header")
	ErrBadSignature   = errors.New("webhook: signature does not match")
	ErrStaleSignature = errors.New("webhook: signature timestamp outside the tolerance")
)

// SignWebhook returns the WebhookSignatureHeader value of body sent at
// time at: a v1 signature by each secret (two during a rotation's overlap,
// the new one first), so a receiver holding either verifies it.
func SignWebhook(secrets []string, at time.Time, body []byte) string {
	t := strconv.FormatInt(at.Unix(), 10)
	var b strings.Builder
	b.WriteString("t=" + t)
	for _, s := range secrets {
		b.WriteString(",v1=" + hex.EncodeToString(webhookMAC(s, t, body)))
	}
	return b.String()
}

// VerifyWebhook checks a delivery as a receiver should: header is the
// WebhookSignatureHeader value, body the raw request body (before any JSON
// parsing), and t must be within tolerance of now, so a captured delivery
// cannot be replayed later. Any v1 may match.
func VerifyWebhook(secret, header string, body []byte, tolerance time.Duration) error {
	var (
		t    string
		sigs [][]byte
	)
	for _, part := range strings.Split(header, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			continue
		}
		switch k {
		case "t":
			t = v
		case "v1":
			if sig, err := hex.DecodeString(v); err == nil {
				sigs = append(sigs, sig)
			}
		}
	}
	ts, err := strconv.ParseInt(t, 10, 64)
	if err != nil || len(sigs) == 0 {
		return ErrNoSignature
	}
	want := webhookMAC(secret, t, body)
	if !slices.ContainsFunc(sigs, func(sig []byte) bool { return hmac.Equal(sig, want) }) {
		return ErrBadSignature
	}
	if d := time.Since(time.Unix(ts, 0)); d > tolerance || d < -tolerance {
		return ErrStaleSignature
	}
	return nil
}

func webhookMAC(secret, t string, body []byte) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(t + "."))
	m.Write(body)
	return m.Sum(nil)
}
