package store

import (
	"context"
	"fmt"
	"time"
)

// Webhook kinds: what a webhook reports on.
const (
	WebhookJob   = "job"
	WebhookBatch = "batch"
)

// WebhookRef names the object of a webhook delivery.
type WebhookRef struct {
	Kind string // WebhookJob or WebhookBatch
	ID   string
}

// webhookTable is a webhook kind's table, its *_webhook_pending index's
// predicate, and when an object finished.
type webhookTable struct {
	name, pending, finishedAt string
}

var webhookTables = map[string]webhookTable{
	WebhookJob: {"jobs", `webhook_url IS NOT NULL AND webhook_done_at IS NULL AND status IN ('succeeded', 'failed', 'cancelled')`,
		"finished_at"},
	WebhookBatch: {"batches", `webhook_url IS NOT NULL AND webhook_done_at IS NULL AND status IN ('completed', 'failed', 'expired', 'cancelled')`,
		"COALESCE(completed_at, failed_at, expired_at, cancelled_at)"},
}

func webhookTableOf(method, kind string) (webhookTable, error) {
	t, ok := webhookTables[kind]
	if !ok {
		return t, fmt.Errorf("store: %s: Kind %q: want %q or %q", method, kind, WebhookJob, WebhookBatch)
	}
	return t, nil
}

// WebhookDone records, once, that the object's webhook needs no more delivery.
func (db *DB) WebhookDone(ctx context.Context, ref WebhookRef) error {
	t, err := webhookTableOf("WebhookDone", ref.Kind)
	if err != nil {
		return err
	}
	n, err := db.rw.exec(ctx, `UPDATE `+t.name+` SET webhook_done_at = COALESCE(webhook_done_at, $2) WHERE id = $1`,
		ref.ID, db.d.ts(db.nowUTC()))
	if err != nil {
		return db.d.wrap(err)
	}
	if n == 0 {
		return notFound(ref.Kind, ref.ID)
	}
	return nil
}

// WebhookListPendingParams select a page of pending webhooks.
type WebhookListPendingParams struct {
	Kind string // WebhookJob or WebhookBatch
	// FinishedBefore skips objects that finished since.
	FinishedBefore time.Time
	After          string // id of the last object of the previous page
	Limit          int    // default 1000, at most 10000
}

// WebhookListPending returns a page of the finished objects whose webhook
// delivery has not ended, oldest first.
func (db *DB) WebhookListPending(ctx context.Context, p *WebhookListPendingParams) ([]*WebhookRef, bool, error) {
	t, err := webhookTableOf("WebhookListPending", p.Kind)
	if err != nil {
		return nil, false, err
	}
	refs, more, err := page(ctx, db.ro, func(r row) (*WebhookRef, error) {
		ref := &WebhookRef{Kind: p.Kind}
		return ref, r.Scan(&ref.ID)
	}, webhookListPendingSQL(db.d, t, p))
	return refs, more, db.d.wrap(err)
}

func webhookListPendingSQL(d *dialect, t webhookTable, p *WebhookListPendingParams) pageQuery {
	var a args
	q := `SELECT id FROM ` + t.name + ` WHERE ` + t.pending
	if !p.FinishedBefore.IsZero() {
		q += ` AND ` + t.finishedAt + ` < ` + a.add(d.ts(p.FinishedBefore))
	}
	return pageSQL(q, a, p.After, false, p.Limit)
}
