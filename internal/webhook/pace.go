package webhook

import (
	"context"
	"net/url"
	"strings"
	"time"

	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/queue"
	"github.com/llmq/llmq/internal/store"
)

// paceScope is the Pacer scope of a delivery: its tenant and destination
// host. A host's deliveries are paced per tenant: a batch finishing sends its
// tenant's webhooks at the tier's webhook_host_rps, and a receiver shared by
// many tenants (a chat service's hooks) is not one queue for all of them.
func paceScope(tenantID, rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil || u.Hostname() == "" {
		return ""
	}
	return "webhook:" + tenantID + ":" + strings.ToLower(u.Hostname())
}

// pace waits for the delivery's slot at its host: it sleeps a short wait
// (up to Options.MaxInlineWait) and returns an error that puts the task back
// for a longer one, without counting a failure. The slot is kept across
// that return, so deferred deliveries go out in the order they first asked,
// each at its slot. It returns the scope to release with done after the
// attempt, "" when nothing is paced.
func (h *Handler) pace(ctx context.Context, d *delivery, tenant *store.Tenant) (string, error) {
	if h.Spacer == nil || h.Policy == nil {
		return "", nil
	}
	scope := paceScope(tenant.ID, d.url)
	if scope == "" {
		return "", nil // deliver refuses the URL
	}
	rps := float64(config.DefaultWebhookHostRPS)
	if tier, ok := h.Policy.Current().Tier(tenant.Tier); ok {
		rps = tier.WebhookHostRPS
	}
	wait, err := h.Spacer.Slot(ctx, scope, d.id, time.Duration(float64(time.Second)/rps))
	if err != nil {
		return "", err
	}
	if wait > h.opts.MaxInlineWait {
		return "", queue.Requeue("waiting for its slot at the webhook's host", wait)
	}
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-t.C:
		}
	}
	return scope, nil
}

// done frees the delivery's slot once it was attempted, so a retry takes a
// new one behind the deliveries queued meanwhile.
func (h *Handler) done(ctx context.Context, scope string, d *delivery) {
	if scope == "" {
		return
	}
	if err := h.Spacer.Done(context.WithoutCancel(ctx), scope, d.id); err != nil {
		h.Logger.Debug("free a webhook's slot", "webhook", d.id, "err", err)
	}
}
