package dashboard

import (
	"context"
	"fmt"
	"slices"

	"github.com/llmq/llmq/internal/store"
)

// apiLimitsView is the API limits section: each tier's limits, and who is
// exempt from them (tiers, tenants, keys).
type apiLimitsView struct {
	Tiers   []apiTierRow
	Tenants []exemptRow
	Keys    []exemptRow
	// More is set when more exempt tenants or keys exist than are shown.
	More bool
}

type apiTierRow struct {
	Name, Limits, Algorithm, Soft, Lease, Webhooks string
	Endpoints                                      []string
	Exempt                                         bool
}

type exemptRow struct {
	ID, Name, Tenant, Tier string
}

const maxExempt = 50

// apiLimits reads the section: the tiers from the policy in force, the
// exempt tenants and keys from the store.
func (s *Server) apiLimits(ctx context.Context) (apiLimitsView, error) {
	var v apiLimitsView
	for _, t := range s.a.Policy.Current().Tiers {
		row := apiTierRow{Name: t.Name, Exempt: t.APIExempt, Webhooks: fmt.Sprintf("%g/s per host", t.WebhookHostRPS)}
		if !t.APIExempt {
			row.Limits, row.Algorithm = t.APILimits.String(), string(t.APIAlgorithm)
			row.Soft = fmt.Sprintf("%.0f%%", 100*t.APISoftLimit)
			row.Lease = "per request"
			if t.APILease > 0 {
				row.Lease = fmt.Sprintf("slices of %d", t.APILease)
			}
			for name, l := range t.APIEndpointLimits {
				row.Endpoints = append(row.Endpoints, name+" "+l.String())
			}
			slices.Sort(row.Endpoints)
		}
		v.Tiers = append(v.Tiers, row)
	}
	tenants, more, err := s.a.Store.TenantList(ctx, &store.TenantListParams{APIExempt: true, Limit: maxExempt})
	if err != nil {
		return v, err
	}
	v.More = more
	for _, t := range tenants {
		v.Tenants = append(v.Tenants, exemptRow{ID: t.ID, Name: t.Name, Tier: t.Tier})
	}
	keys, more, err := s.a.Store.APIKeyListExempt(ctx, &store.APIKeyListExemptParams{Limit: maxExempt})
	if err != nil {
		return v, err
	}
	v.More = v.More || more
	for _, k := range keys {
		v.Keys = append(v.Keys, exemptRow{ID: k.ID, Name: k.Prefix + "…", Tenant: k.TenantID})
	}
	return v, nil
}
