// Package webhook delivers llmq's webhooks: when a job or batch that named
// a webhook_url ends, a task POSTs the object as GET shows it, signed by
// client.SignWebhook. Network errors, timeouts, 408, 429 and 5xx are
// retried; other answers and redirects end the delivery. Every connection
// is checked after DNS resolution against internal addresses (unless
// LLMQ_WEBHOOK_ALLOW_PRIVATE), and deliveries of a tenant to one host are
// paced at its tier's webhook_host_rps.
package webhook

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/hibiken/asynq"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/limiter"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/wire"
)

// Options tune a Handler. The zero value is ready to use.
type Options struct {
	// AllowPrivate lets deliveries reach internal addresses.
	AllowPrivate bool
	// Timeout bounds one delivery attempt, connection to last byte.
	// Defaults to 10s.
	Timeout time.Duration
	// MaxInlineWait is the longest wait for a delivery's slot at its host
	// slept inside the handler; a longer one puts the task back in its
	// queue until then. Defaults to 1s.
	MaxInlineWait time.Duration
}

// Deps are what a Handler works with.
type Deps struct {
	Store  *store.DB
	Logger *slog.Logger
	// Observer is told the outcome of every attempt. Defaults to none.
	Observer Observer
	// Spacer and Policy pace deliveries per tenant and destination host at
	// the tier's webhook_host_rps. Default to none: no pacing.
	Spacer *limiter.Spacer
	Policy *config.PolicyHolder
}

// Observer is told what deliveries do.
type Observer interface {
	// WebhookDelivery reports one attempt for a kind ("job", "batch"):
	// outcome is "delivered", or a reason from a small fixed set:
	// "http_3xx", "http_4xx", "http_5xx", "timeout", "network", "refused"
	// (an internal address), "invalid_url", "gave_up" (retries used up).
	WebhookDelivery(kind, outcome string)
}

type nopObserver struct{}

func (nopObserver) WebhookDelivery(string, string) {}

// Handler delivers TypeWebhook tasks.
type Handler struct {
	Deps
	opts   Options
	client *http.Client
}

// NewHandler returns a Handler with its own HTTP client (no proxy: a proxy
// would dial the target itself, out of reach of the address check; no
// redirects; the address check on every dial).
func NewHandler(d Deps, opts Options) *Handler {
	d.Logger = cmp.Or(d.Logger, slog.New(slog.DiscardHandler))
	if d.Observer == nil {
		d.Observer = nopObserver{}
	}
	opts.Timeout = cmp.Or(opts.Timeout, 10*time.Second)
	opts.MaxInlineWait = cmp.Or(opts.MaxInlineWait, time.Second)
	dialer := &net.Dialer{Timeout: opts.Timeout, KeepAlive: 30 * time.Second, Control: dialControl}
	if opts.AllowPrivate {
		dialer.Control = nil
	}
	tr := &http.Transport{
		DialContext:           dialer.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          100,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   opts.Timeout,
		ResponseHeaderTimeout: opts.Timeout,
	}
	return &Handler{Deps: d, opts: opts, client: &http.Client{
		Transport:     tr,
		Timeout:       opts.Timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// Close releases the handler's idle connections.
func (h *Handler) Close() { h.client.CloseIdleConnections() }

type delivery struct {
	kind, id, event, url, tenantID string
	body                           []byte
}

// errNotYet is a delivery enqueued just before its object's terminal state
// was stored (the batch sweeper does that, so a crash cannot lose the
// call): asynq retries it shortly.
var errNotYet = errors.New("webhook: the object has not reached a terminal state yet")

func (h *Handler) ProcessTask(ctx context.Context, t *asynq.Task) error {
	p, err := queue.ParseWebhookPayload(t)
	if err != nil {
		h.Logger.Error("dropping malformed webhook task", "err", err)
		return nil
	}
	d, err := h.load(ctx, p)
	if err != nil || d == nil {
		return err
	}
	tenant, err := h.Store.TenantGetByID(ctx, d.tenantID)
	if err != nil {
		return fmt.Errorf("webhook %s: load tenant: %w", d.id, err)
	}
	scope, err := h.pace(ctx, d, tenant)
	if err != nil {
		return err
	}
	outcome, err := h.deliver(ctx, d, tenant.WebhookSecrets(time.Now()))
	h.done(ctx, scope, d)
	ended := err == nil || errors.Is(err, asynq.SkipRetry)
	if !ended {
		retried, _ := asynq.GetRetryCount(ctx)
		if maxRetry, ok := asynq.GetMaxRetry(ctx); ok && retried >= maxRetry {
			outcome, ended = "gave_up", true
			h.Logger.Warn("webhook retries used up; giving up", "webhook", d.id, "attempts", retried+1)
		}
	}
	h.Observer.WebhookDelivery(d.kind, outcome)
	if ended {
		// Should this fail, the reconciler sends it once more: deliveries
		// are at least once.
		if derr := h.Store.WebhookDone(context.WithoutCancel(ctx), store.WebhookRef{Kind: p.Kind, ID: p.ID}); derr != nil {
			h.Logger.Warn("record webhook delivery", "webhook", d.id, "err", derr)
		}
	}
	return err
}

// load reads the object of a delivery; nil when there is nothing to send.
func (h *Handler) load(ctx context.Context, p *queue.WebhookPayload) (*delivery, error) {
	d := &delivery{kind: p.Kind, id: p.Kind + ":" + p.ID}
	var obj any
	switch p.Kind {
	case store.WebhookJob:
		j, err := h.Store.JobGetByID(ctx, p.ID)
		if errors.Is(err, store.ErrNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		if !j.Status.Terminal() {
			return nil, errNotYet
		}
		d.url, d.tenantID, d.event, obj = j.WebhookURL, j.TenantID, "job."+string(j.Status), wire.Job(j)
	case store.WebhookBatch:
		b, err := h.Store.BatchGetByID(ctx, p.ID)
		if errors.Is(err, store.ErrNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		if !b.Status.Terminal() {
			return nil, errNotYet
		}
		c, err := h.Store.JobCountsByBatch(ctx, b.ID)
		if err != nil {
			return nil, err
		}
		d.url, d.tenantID, d.event, obj = b.WebhookURL, b.TenantID, "batch."+string(b.Status), wire.Batch(b, c)
	}
	if d.url == "" {
		return nil, nil
	}
	body, err := json.Marshal(obj)
	d.body = body
	return d, err
}

// deliver makes one attempt and names its outcome. A nil error ends the
// task; an error wrapping asynq.SkipRetry ends it as failed; any other error
// is retried.
func (h *Handler) deliver(ctx context.Context, d *delivery, secrets []string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.url, bytes.NewReader(d.body))
	if err != nil || (req.URL.Scheme != "http" && req.URL.Scheme != "https") || req.URL.Host == "" {
		h.Logger.Warn("webhook not sent: not an http(s) URL", "webhook", d.id)
		return "invalid_url", fmt.Errorf("webhook %s: invalid URL: %w", d.id, asynq.SkipRetry)
	}
	log := h.Logger.With("webhook", d.id, "host", req.URL.Hostname()) // the host only: a URL may carry a token
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "llmq-webhook/1")
	req.Header.Set(client.WebhookEventHeader, d.event)
	req.Header.Set(client.WebhookIDHeader, d.id)
	req.Header.Set(client.WebhookSignatureHeader, client.SignWebhook(secrets, time.Now(), d.body))
	resp, err := h.client.Do(req)
	if err != nil {
		// net/http's error quotes the whole URL, whose path may hold the
		// receiver's secret: keep what it wraps (the dial's host:port and
		// why), for the log and for the task's last error alike.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		var be *BlockedError
		if errors.As(err, &be) {
			log.Warn("webhook refused: its address is internal (LLMQ_WEBHOOK_ALLOW_PRIVATE allows it)", "addr", be.Addr.String())
			return "refused", fmt.Errorf("webhook %s: %w: %w", d.id, be, asynq.SkipRetry)
		}
		outcome := "network"
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			outcome = "timeout"
		}
		log.Debug("webhook attempt failed; will retry", "err", err)
		return outcome, fmt.Errorf("webhook %s: %w", d.id, err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	st, outcome := resp.StatusCode, "http_"+strconv.Itoa(resp.StatusCode/100)+"xx"
	switch {
	case st >= 200 && st < 300:
		log.Debug("webhook delivered", "status", st)
		return "delivered", nil
	case st == http.StatusRequestTimeout || st == http.StatusTooManyRequests || st >= 500:
		log.Debug("webhook answered a retryable status; will retry", "status", st)
		return outcome, fmt.Errorf("webhook %s: answered %d", d.id, st)
	}
	log.Warn("webhook refused by its receiver; not retried", "status", st)
	return outcome, fmt.Errorf("webhook %s: answered %d: %w", d.id, st, asynq.SkipRetry)
}
