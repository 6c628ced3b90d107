package store

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/llmq/llmq/internal/ids"
)

// APIKey is a tenant's API key, of which only the SHA-256 hash is stored.
type APIKey struct {
	ID       string
	TenantID string
	Prefix   string // the first characters of the key, for display
	Hash     []byte // SHA-256 of the key, 32 bytes
	// APIExempt frees the key from its tier's API rate limit, whatever its
	// tenant's setting.
	APIExempt bool
	CreatedAt time.Time
	RevokedAt *time.Time
}

const apiKeyColumns = `id, tenant_id, prefix, hash, api_exempt, created_at, revoked_at`

func apiKeyDest(k *APIKey) []any {
	return []any{&k.ID, &k.TenantID, &k.Prefix, &k.Hash, &k.APIExempt, timeCol{&k.CreatedAt}, nullTimeCol{&k.RevokedAt}}
}

func scanAPIKey(r row) (*APIKey, error) {
	var k APIKey
	return &k, r.Scan(apiKeyDest(&k)...)
}

// APIKeyInsertParams are the fields of a new key.
type APIKeyInsertParams struct {
	ID       string // optional; a new ids.Key id when empty
	TenantID string
	Prefix   string
	Hash     []byte // SHA-256 of the key
	// APIExempt frees the key from its tier's API rate limit.
	APIExempt bool
}

// APIKeyInsert stores a key. A hash taken is ErrConflict; an unknown tenant
// ErrNotFound.
func (db *DB) APIKeyInsert(ctx context.Context, p *APIKeyInsertParams) (*APIKey, error) {
	if err := required("APIKeyInsert", "TenantID", p.TenantID, "Prefix", p.Prefix); err != nil {
		return nil, err
	}
	k, err := scanAPIKey(db.rw.queryRow(ctx, `
		INSERT INTO api_keys (id, tenant_id, prefix, hash, api_exempt, created_at) VALUES ($1, $2, $3, $4, $5, $6)
		RETURNING `+apiKeyColumns,
		cmp.Or(p.ID, ids.New(ids.Key)), p.TenantID, p.Prefix, p.Hash, p.APIExempt, db.d.ts(db.nowUTC())))
	return k, db.d.wrap(err)
}

// sqlAPIKeyGetByHash reads api_keys_hash and the tenants primary key.
const sqlAPIKeyGetByHash = `
	SELECT k.id, k.tenant_id, k.prefix, k.hash, k.api_exempt, k.created_at, k.revoked_at,
	       t.id, t.name, t.tier, t.budget_override_micros, t.api_exempt, t.webhook_secret,
	       coalesce(t.webhook_secret_previous, ''), t.webhook_secret_previous_until, t.created_at, t.updated_at
	FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
	WHERE k.hash = $1 AND k.revoked_at IS NULL`

// APIKeyGetByHash returns the unrevoked key with this hash and its tenant.
func (db *DB) APIKeyGetByHash(ctx context.Context, hash []byte) (*APIKey, *Tenant, error) {
	var k APIKey
	var t Tenant
	err := db.ro.queryRow(ctx, sqlAPIKeyGetByHash, hash).Scan(append(apiKeyDest(&k), tenantDest(&t)...)...)
	if errors.Is(err, sql.ErrNoRows) {
		// The hash is a secret's digest: not worth naming.
		return nil, nil, fmt.Errorf("%w: api key", ErrNotFound)
	}
	if err != nil {
		return nil, nil, err
	}
	return &k, &t, nil
}

// APIKeyRevoke revokes the key, once, and returns it.
func (db *DB) APIKeyRevoke(ctx context.Context, id string) (*APIKey, error) {
	k, err := getOne(ctx, db.rw, scanAPIKey, "api key", id, `UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $2) WHERE id = $1
		RETURNING `+apiKeyColumns, id, db.d.ts(db.nowUTC()))
	return k, db.d.wrap(err)
}

// APIKeyListByTenant returns every key of the tenant, revoked ones too,
// newest first (a handful: no paging).
func (db *DB) APIKeyListByTenant(ctx context.Context, tenantID string) ([]*APIKey, error) {
	return collect(ctx, db.ro, scanAPIKey, `SELECT `+apiKeyColumns+` FROM api_keys WHERE tenant_id = $1 ORDER BY id DESC`, tenantID)
}

// APIKeyUpdateParams change a key; nil fields are left as they are.
type APIKeyUpdateParams struct {
	ID        string
	APIExempt *bool
}

// APIKeyUpdate applies p and returns the key, revoked or not.
func (db *DB) APIKeyUpdate(ctx context.Context, p *APIKeyUpdateParams) (*APIKey, error) {
	if p.APIExempt == nil {
		// Nothing to change: read it, so the answer is the same either way.
		return getOne(ctx, db.ro, scanAPIKey, "api key", p.ID, `SELECT `+apiKeyColumns+` FROM api_keys WHERE id = $1`, p.ID)
	}
	k, err := getOne(ctx, db.rw, scanAPIKey, "api key", p.ID, `UPDATE api_keys SET api_exempt = $2 WHERE id = $1 RETURNING `+apiKeyColumns,
		p.ID, *p.APIExempt)
	return k, db.d.wrap(err)
}

// APIKeyListExemptParams select exempt keys.
type APIKeyListExemptParams struct {
	Limit int // default 20, at most 1000
}

// APIKeyListExempt returns a page of the unrevoked exempt keys, newest first.
func (db *DB) APIKeyListExempt(ctx context.Context, p *APIKeyListExemptParams) ([]*APIKey, bool, error) {
	// The predicate is api_keys_exempt's, literally.
	return page(ctx, db.ro, scanAPIKey, pageSQL(`SELECT `+apiKeyColumns+` FROM api_keys
		WHERE api_exempt = TRUE AND revoked_at IS NULL`, nil, "", true, p.Limit))
}
