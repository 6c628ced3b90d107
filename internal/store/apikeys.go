package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/llmq/llmq/internal/ids"
)

// APIKey is a tenant's API key. Only its SHA-256 hash is stored; the
// plaintext is shown once, when the key is made.
type APIKey struct {
	ID        string
	TenantID  string
	Prefix    string // the first characters of the key, for display
	Hash      []byte // SHA-256 of the key, 32 bytes
	CreatedAt time.Time
	RevokedAt *time.Time
}

const apiKeyColumns = `id, tenant_id, prefix, hash, created_at, revoked_at`

func scanAPIKey(r rowScanner) (*APIKey, error) {
	var k APIKey
	if err := r.Scan(&k.ID, &k.TenantID, &k.Prefix, &k.Hash, timeCol{&k.CreatedAt}, nullTimeCol{&k.RevokedAt}); err != nil {
		return nil, err
	}
	return &k, nil
}

// APIKeyInsertParams are the fields of a new key.
type APIKeyInsertParams struct {
	ID       string // optional; a new ids.Key id when empty
	TenantID string
	Prefix   string
	Hash     []byte // SHA-256 of the key
}

// APIKeyInsert stores a key. A hash already stored is ErrConflict; an unknown
// tenant is ErrNotFound.
func (db *DB) APIKeyInsert(ctx context.Context, p *APIKeyInsertParams) (*APIKey, error) {
	if err := errors.Join(required("APIKeyInsert", "TenantID", p.TenantID), required("APIKeyInsert", "Prefix", p.Prefix)); err != nil {
		return nil, err
	}
	if len(p.Hash) != 32 {
		return nil, fmt.Errorf("store: APIKeyInsert: Hash is %d bytes, want a 32-byte SHA-256", len(p.Hash))
	}
	id := p.ID
	if id == "" {
		id = ids.New(ids.Key)
	}
	k, err := scanAPIKey(db.rw.QueryRowContext(ctx, `
		INSERT INTO api_keys (id, tenant_id, prefix, hash, created_at) VALUES ($1, $2, $3, $4, $5)
		RETURNING `+apiKeyColumns,
		id, p.TenantID, p.Prefix, p.Hash, db.d.ts(db.nowUTC())))
	return k, db.d.wrap(err)
}

// sqlAPIKeyGetByHash reads api_keys_hash and the tenants primary key.
const sqlAPIKeyGetByHash = `
	SELECT k.id, k.tenant_id, k.prefix, k.hash, k.created_at, k.revoked_at,
	       t.id, t.name, t.tier, t.budget_override_micros, t.api_exempt, t.webhook_secret, t.created_at, t.updated_at
	FROM api_keys k JOIN tenants t ON t.id = k.tenant_id
	WHERE k.hash = $1 AND k.revoked_at IS NULL`

// APIKeyGetByHash authenticates: it returns the unrevoked key with this hash
// and its tenant, or ErrNotFound.
func (db *DB) APIKeyGetByHash(ctx context.Context, hash []byte) (*APIKey, *Tenant, error) {
	row := db.ro.QueryRowContext(ctx, sqlAPIKeyGetByHash, hash)
	var (
		k APIKey
		t *Tenant
	)
	dest := append([]any{&k.ID, &k.TenantID, &k.Prefix, &k.Hash, timeCol{&k.CreatedAt}, nullTimeCol{&k.RevokedAt}},
		tenantDest(&t)...)
	err := row.Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		// The hash is a secret's digest: not worth naming.
		return nil, nil, fmt.Errorf("%w: api key", ErrNotFound)
	}
	if err != nil {
		return nil, nil, err
	}
	return &k, t, nil
}

// APIKeyRevoke revokes the key and returns it. Revoking a revoked key keeps
// its first revocation time.
func (db *DB) APIKeyRevoke(ctx context.Context, id string) (*APIKey, error) {
	k, err := scanAPIKey(db.rw.QueryRowContext(ctx, `
		UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $2) WHERE id = $1
		RETURNING `+apiKeyColumns, id, db.d.ts(db.nowUTC())))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, notFound("api key", id)
	}
	return k, db.d.wrap(err)
}

// APIKeyListByTenant returns every key of the tenant, revoked ones included,
// newest first. A tenant has a handful of keys, so there is no paging.
func (db *DB) APIKeyListByTenant(ctx context.Context, tenantID string) ([]*APIKey, error) {
	rows, err := db.ro.QueryContext(ctx, `SELECT `+apiKeyColumns+` FROM api_keys WHERE tenant_id = $1 ORDER BY id DESC`, tenantID)
	if err != nil {
		return nil, err
	}
	return collect(rows, scanAPIKey)
}
