package api

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"net/http"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/ids"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/retention"
	"github.com/llmq/llmq/internal/store"
	"github.com/llmq/llmq/internal/wire"
)

func checkTier(p *config.Policy, tier string) error {
	if _, ok := p.Tier(tier); ok {
		return nil
	}
	names := make([]string, len(p.Tiers))
	for i, t := range p.Tiers {
		names[i] = t.Name
	}
	return wire.Invalid("tier", client.CodeUnknownTier, "Unknown tier '%s'; the policy has: %s.", tier, strings.Join(names, ", "))
}

func budgetOverride(v *float64) (*money.Micros, error) {
	if v == nil {
		return nil, nil
	}
	m, err := money.FromUSD(*v)
	if err != nil || m == 0 {
		return nil, wire.Invalid("daily_budget_usd", client.CodeInvalidValue, "daily_budget_usd must be a positive number of dollars, got %v.", *v)
	}
	return &m, nil
}

// tenantName is name without surrounding spaces. It refuses a name that is
// empty, longer than 200 bytes, or holds a control character (CR, LF, ESC:
// a terminal or a log line would act on it) or a character that reorders
// or hides text (U+202E, zero-width ones): operators read names in lists.
func tenantName(name string) (string, error) {
	name = strings.TrimSpace(name)
	if name == "" || len(name) > 200 {
		return "", wire.Invalid("name", client.CodeInvalidValue, "name is required (at most 200 characters).")
	}
	for i, r := range name {
		if unicode.IsControl(r) || unicode.Is(unicode.Cf, r) || r == utf8.RuneError {
			return "", wire.Invalid("name", client.CodeInvalidValue, "name must not hold control or invisible formatting characters (U+%04X at byte %d).", r, i)
		}
	}
	return name, nil
}

func (s *Server) createTenant(w http.ResponseWriter, r *http.Request) error {
	var req client.TenantCreateParams
	if _, err := decodeJSON(w, r, s.opts.MaxBodyBytes, &req, false); err != nil {
		return err
	}
	name, err := tenantName(req.Name)
	if err != nil {
		return err
	}
	if err := checkTier(s.Policy.Current(), req.Tier); err != nil {
		return err
	}
	override, err := budgetOverride(req.DailyBudgetUSD)
	if err != nil {
		return err
	}
	t, err := s.Store.TenantInsert(r.Context(), &store.TenantInsertParams{Name: name, Tier: req.Tier,
		BudgetOverride: override, APIExempt: req.APIExempt})
	if err != nil {
		return err
	}
	s.Logger.Info("tenant created", "tenant", t.ID, "tier", t.Tier)
	return writeJSON(w, http.StatusCreated, wire.Tenant(t, true))
}

func (s *Server) tenantByPath(r *http.Request) (*store.Tenant, error) {
	id, err := pathID(r, ids.Tenant, "tenant")
	if err != nil {
		return nil, err
	}
	t, err := s.Store.TenantGetByID(r.Context(), id)
	return t, missingAs(err, "tenant", id)
}

func (s *Server) getTenant(w http.ResponseWriter, r *http.Request) error {
	t, err := s.tenantByPath(r)
	if err != nil {
		return err
	}
	return writeOK(w, wire.Tenant(t, true))
}

func (s *Server) listTenants(w http.ResponseWriter, r *http.Request) error {
	limit, after, err := listPage(r.URL.Query(), 1000, ids.Tenant, "tenant")
	if err != nil {
		return err
	}
	ts, more, err := s.Store.TenantList(r.Context(), &store.TenantListParams{After: after, Limit: limit})
	if err != nil {
		return err
	}
	return writeList(w, ts, more, func(t *store.Tenant) client.Tenant { return wire.Tenant(t, false) },
		func(t client.Tenant) string { return t.ID })
}

func (s *Server) updateTenant(w http.ResponseWriter, r *http.Request) error {
	id, err := pathID(r, ids.Tenant, "tenant")
	if err != nil {
		return err
	}
	var req struct {
		Name           *string         `json:"name"`
		Tier           *string         `json:"tier"`
		DailyBudgetUSD json.RawMessage `json:"daily_budget_usd"` // a number sets, null clears
		APIExempt      *bool           `json:"api_exempt"`
	}
	if _, err := decodeJSON(w, r, s.opts.MaxBodyBytes, &req, false); err != nil {
		return err
	}
	p := &store.TenantUpdateParams{ID: id, Name: req.Name, Tier: req.Tier, APIExempt: req.APIExempt}
	if req.Name != nil {
		name, err := tenantName(*req.Name)
		if err != nil {
			return err
		}
		p.Name = &name
	}
	if req.Tier != nil {
		if err := checkTier(s.Policy.Current(), *req.Tier); err != nil {
			return err
		}
	}
	if len(req.DailyBudgetUSD) > 0 {
		p.SetBudgetOverride = true
		var v *float64 // nil for null
		if err := json.Unmarshal(req.DailyBudgetUSD, &v); err != nil {
			return wire.Invalid("daily_budget_usd", client.CodeInvalidType, "daily_budget_usd must be a number of dollars or null.")
		}
		if p.BudgetOverride, err = budgetOverride(v); err != nil {
			return err
		}
	}
	t, err := s.Store.TenantUpdate(r.Context(), p)
	if err != nil {
		return missingAs(err, "tenant", p.ID)
	}
	s.keysChanged(r.Context())
	s.Logger.Info("tenant updated", "tenant", t.ID, "tier", t.Tier)
	return writeOK(w, wire.Tenant(t, false))
}

const keyAlphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

// CreateKey makes a new key for tenant t and stores it hashed, returning
// the plaintext, which is never stored and shown only once: "llmq_" and 40
// random base62 characters (238 bits).
func CreateKey(ctx context.Context, db *store.DB, tenantID string) (*store.APIKey, string, error) {
	return createKey(ctx, db, &store.APIKeyInsertParams{TenantID: tenantID})
}

// createKey is CreateKey with p's other settings.
func createKey(ctx context.Context, db *store.DB, p *store.APIKeyInsertParams) (*store.APIKey, string, error) {
	b := make([]byte, 40)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = keyAlphabet[int(b[i])%len(keyAlphabet)]
	}
	key := "llmq_" + string(b)
	sum := sha256.Sum256([]byte(key))
	p.Prefix, p.Hash = key[:12], sum[:]
	k, err := db.APIKeyInsert(ctx, p)
	if err != nil {
		return nil, "", err
	}
	return k, key, nil
}

func (s *Server) createKey(w http.ResponseWriter, r *http.Request) error {
	t, err := s.tenantByPath(r)
	if err != nil {
		return err
	}
	var o client.KeyUpdateParams // the settings of a key, here optional
	if _, err := decodeJSON(w, r, s.opts.MaxBodyBytes, &o, true); err != nil {
		return err
	}
	k, key, err := createKey(r.Context(), s.Store, &store.APIKeyInsertParams{TenantID: t.ID, APIExempt: o.APIExempt != nil && *o.APIExempt})
	if err != nil {
		return err
	}
	s.Logger.Info("api key created", "tenant", t.ID, "key", k.ID, "api_exempt", k.APIExempt)
	out := wire.APIKey(k)
	out.Key = key
	return writeJSON(w, http.StatusCreated, out)
}

func (s *Server) listKeys(w http.ResponseWriter, r *http.Request) error {
	t, err := s.tenantByPath(r)
	if err != nil {
		return err
	}
	keys, err := s.Store.APIKeyListByTenant(r.Context(), t.ID)
	if err != nil {
		return err
	}
	return writeList(w, keys, false, wire.APIKey, func(k client.APIKey) string { return k.ID })
}

func (s *Server) updateKey(w http.ResponseWriter, r *http.Request) error {
	id, err := pathID(r, ids.Key, "api key")
	if err != nil {
		return err
	}
	var o client.KeyUpdateParams
	if _, err := decodeJSON(w, r, s.opts.MaxBodyBytes, &o, true); err != nil {
		return err
	}
	k, err := s.Store.APIKeyUpdate(r.Context(), &store.APIKeyUpdateParams{ID: id, APIExempt: o.APIExempt})
	if err != nil {
		return missingAs(err, "api key", id)
	}
	s.keysChanged(r.Context())
	s.Logger.Info("api key updated", "key", k.ID, "api_exempt", k.APIExempt)
	return writeOK(w, wire.APIKey(k))
}

func (s *Server) revokeKey(w http.ResponseWriter, r *http.Request) error {
	id, err := pathID(r, ids.Key, "api key")
	if err != nil {
		return err
	}
	k, err := s.Store.APIKeyRevoke(r.Context(), id)
	if err != nil {
		return missingAs(err, "api key", id)
	}
	s.keysChanged(r.Context())
	s.Logger.Info("api key revoked", "key", k.ID)
	return writeOK(w, wire.APIKey(k))
}

func (s *Server) usage(w http.ResponseWriter, r *http.Request) error {
	c := callerOf(r)
	if c.budget == nil {
		return wire.Errorf(http.StatusNotImplemented, wire.TypeServer, client.CodeBudgetsDisabled, "", "Budgets are not configured on this server.")
	}
	return writeOK(w, wire.Usage(c.tenant.ID, c.tier.Name, c.budget))
}

func (s *Server) adminUsage(w http.ResponseWriter, r *http.Request) error {
	day := r.URL.Query().Get("day")
	if day == "" {
		day = s.opts.Now().UTC().Format(time.DateOnly)
	}
	if _, err := time.Parse(time.DateOnly, day); err != nil {
		return wire.Invalid("day", client.CodeInvalidValue, "day must be a date as YYYY-MM-DD, got '%s'.", day)
	}
	tenantID, err := queryID(r.URL.Query(), "tenant_id", ids.Tenant, "tenant")
	if err != nil {
		return err
	}
	rows, err := s.Store.UsageReport(r.Context(), &store.UsageReportParams{Day: day, TenantID: tenantID})
	if err != nil {
		return err
	}
	return writeOK(w, wire.UsageReport(day, rows))
}

// adminRetention says what the policy's retention would purge now.
func (s *Server) adminRetention(w http.ResponseWriter, r *http.Request) error {
	ret := s.Policy.Current().Retention
	p := &retention.Purger{Store: s.Store, Retention: func() config.Retention { return ret }}
	rep, err := p.Preview(r.Context())
	if err != nil {
		return err
	}
	unix := func(t time.Time) *int64 { // nil when kept for ever
		if t.IsZero() {
			return nil
		}
		u := t.Unix()
		return &u
	}
	out := client.Retention{FinishedJobs: ret.FinishedJobs.String(), JobsBefore: unix(rep.JobsBefore), Jobs: rep.Jobs,
		Files: ret.Files.String(), FilesBefore: unix(rep.FilesBefore), FileCount: rep.Files, FileBytes: rep.FileBytes,
		Ledger: ret.Ledger.String(), LedgerBefore: unix(rep.LedgerBefore), LedgerRows: rep.LedgerRows}
	return writeOK(w, out)
}

// maxWebhookOverlap bounds how long a rotated-out webhook secret keeps signing.
const maxWebhookOverlap = 30 * 24 * time.Hour

// rotateWebhookSecret gives the tenant a new webhook secret, the old one
// signing beside it for the overlap (default 24h).
func (s *Server) rotateWebhookSecret(w http.ResponseWriter, r *http.Request) error {
	t, err := s.tenantByPath(r)
	if err != nil {
		return err
	}
	var o struct {
		Overlap *string `json:"overlap"`
	}
	if _, err := decodeJSON(w, r, s.opts.MaxBodyBytes, &o, true); err != nil {
		return err
	}
	overlap := 24 * time.Hour
	if o.Overlap != nil {
		d, err := time.ParseDuration(*o.Overlap)
		if err != nil || d < 0 || d > maxWebhookOverlap {
			return wire.Invalid("overlap", client.CodeInvalidValue, "overlap must be a duration from 0s to 720h, such as 24h, got %q.", *o.Overlap)
		}
		overlap = d
	}
	t, err = s.Store.TenantRotateWebhookSecret(r.Context(), t.ID, overlap)
	if err != nil {
		return err
	}
	s.Logger.Info("webhook secret rotated", "tenant", t.ID, "overlap", overlap.String())
	return writeOK(w, wire.Tenant(t, true))
}
