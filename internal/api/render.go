package api

import (
	"encoding/json"
	"time"

	"github.com/llmq/llmq/client"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/store"
)

// The server renders every answer into the wire types of package client, so
// the Go client and the server share one definition of each shape.

func unix(t time.Time) int64 { return t.Unix() }

func unixPtr(t *time.Time) *int64 {
	if t == nil {
		return nil
	}
	u := t.Unix()
	return &u
}

func strPtr(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// metadataMap reads stored metadata (written from a map[string]string);
// anything else renders as null rather than failing the whole answer.
func metadataMap(raw json.RawMessage) map[string]string {
	if len(raw) == 0 {
		return nil
	}
	var m map[string]string
	if json.Unmarshal(raw, &m) != nil {
		return nil
	}
	return m
}

func renderJobError(e *store.JobError) *client.ErrorObject {
	if e == nil {
		return nil
	}
	return &client.ErrorObject{Message: e.Message, Type: e.Type, Code: e.Code, Param: e.Param}
}

// RenderJob is a job as clients see it; webhooks deliver the same object.
func RenderJob(j *store.Job) client.Job {
	out := client.Job{
		ID: j.ID, Object: "job", CustomID: strPtr(j.CustomID), Endpoint: j.Endpoint, Model: j.Model,
		Status: string(j.Status), Priority: j.Queue, BatchID: strPtr(j.BatchID), Attempts: j.Attempts,
		RateLimited: j.RateLimited, CreatedAt: unix(j.CreatedAt), StartedAt: unixPtr(j.StartedAt),
		FinishedAt: unixPtr(j.FinishedAt), NextRunAt: unixPtr(j.NextRunAt), Error: renderJobError(j.Error),
		CostUSD:    j.Cost.USD(),
		Estimate:   client.JobEstimate{PromptTokens: j.EstPromptTokens, MaxTokens: j.EstMaxTokens, CostUSD: j.EstCost.USD()},
		WebhookURL: strPtr(j.WebhookURL), Metadata: metadataMap(j.Metadata), Sync: j.Sync,
	}
	if j.ResponseStatus != 0 && len(j.ResponseBody) > 0 {
		out.Response = &client.JobResponse{StatusCode: j.ResponseStatus, RequestID: j.ProviderRequestID, Body: j.ResponseBody}
	}
	if j.Status == store.JobSucceeded {
		out.Usage = &client.JobUsage{PromptTokens: j.PromptTokens, CompletionTokens: j.CompletionTokens, TotalTokens: j.TotalTokens}
	}
	return out
}

func renderTenant(t *store.Tenant, withSecret bool) client.Tenant {
	out := client.Tenant{ID: t.ID, Object: "tenant", Name: t.Name, Tier: t.Tier, APIExempt: t.APIExempt,
		CreatedAt: unix(t.CreatedAt), UpdatedAt: unix(t.UpdatedAt)}
	if t.BudgetOverride != nil {
		v := t.BudgetOverride.USD()
		out.DailyBudgetUSD = &v
	}
	if withSecret {
		out.WebhookSecret = t.WebhookSecret
	}
	return out
}

func renderKey(k *store.APIKey) client.APIKey {
	return client.APIKey{ID: k.ID, Object: "api_key", Prefix: k.Prefix, TenantID: k.TenantID, APIExempt: k.APIExempt,
		CreatedAt: unix(k.CreatedAt), RevokedAt: unixPtr(k.RevokedAt)}
}

// usd renders an amount of money for JSON.
func usd(m money.Micros) float64 { return m.USD() }
