package store

import (
	"context"
	"slices"
	"strings"
	"time"
)

// StoredResponse is a response a provider stored for a tenant, or an item
// of its output, as llmq relayed it.
type StoredResponse struct {
	ID string // the provider's id of the response or item
	// ResponseID is ID for a response, the response holding it for an item.
	ResponseID string
	TenantID   string
	Deployment string // provider/upstream, whose account holds it
	Tokens     int64  // what naming it adds to a prompt
	CreatedAt  time.Time
}

// StoredResponseRetention is the 30 days OpenAI keeps a stored response.
const StoredResponseRetention = 30 * 24 * time.Hour

// StoredResponseInsert records rs; an id recorded keeps its first owner.
func (db *DB) StoredResponseInsert(ctx context.Context, rs []StoredResponse) error {
	now := db.nowUTC()
	for chunk := range slices.Chunk(rs, 500) {
		var a args
		values := make([]string, len(chunk))
		for i, r := range chunk {
			if err := required("StoredResponseInsert", "ID", r.ID, "ResponseID", r.ResponseID, "TenantID", r.TenantID); err != nil {
				return err
			}
			row := []any{r.ID, r.ResponseID, r.TenantID, r.Deployment, r.Tokens, db.d.ts(now)}
			values[i] = "(" + list(&a, row) + ")"
		}
		if _, err := db.rw.exec(ctx, `INSERT INTO stored_responses (id, response_id, tenant_id, deployment, tokens, created_at)
			VALUES `+strings.Join(values, ", ")+` ON CONFLICT (id) DO NOTHING`, a...); err != nil {
			return failed("StoredResponseInsert", db.d.wrap(err))
		}
	}
	return nil
}

// StoredResponseGet returns the rows of ids that are recorded, by id.
func (db *DB) StoredResponseGet(ctx context.Context, ids []string) (map[string]*StoredResponse, error) {
	out := make(map[string]*StoredResponse, len(ids))
	if len(ids) == 0 {
		return out, nil
	}
	var a args
	err := db.ro.query(ctx, `SELECT id, response_id, tenant_id, deployment, tokens, created_at FROM stored_responses
		WHERE id IN (`+list(&a, ids)+`)`, a, func(r row) error {
		var s StoredResponse
		err := r.Scan(&s.ID, &s.ResponseID, &s.TenantID, &s.Deployment, &s.Tokens, timeCol{&s.CreatedAt})
		out[s.ID] = &s
		return err
	})
	if err != nil {
		return nil, failed("StoredResponseGet", err)
	}
	return out, nil
}

// StoredResponsePurge deletes up to limit rows recorded before before,
// oldest first, and returns how many.
func (db *DB) StoredResponsePurge(ctx context.Context, before time.Time, limit int) (int64, error) {
	if err := positive("StoredResponsePurge", limit); err != nil {
		return 0, err
	}
	n, err := db.rw.exec(ctx, `DELETE FROM stored_responses WHERE id IN
		(SELECT id FROM stored_responses WHERE created_at < $1 ORDER BY created_at LIMIT $2)`, db.d.ts(before), limit)
	return n, failed("StoredResponsePurge", err)
}
