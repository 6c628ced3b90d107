package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmq/llmq/internal/apptest"
	"github.com/llmq/llmq/internal/config"
	"github.com/llmq/llmq/internal/llm"
	"github.com/llmq/llmq/internal/llm/sim"
	"github.com/llmq/llmq/internal/money"
	"github.com/llmq/llmq/internal/offload"
	"github.com/llmq/llmq/internal/store"
)

// boundPolicy prices everything a request may be billed for: two chat
// models (one a reasoning model, whose output limit is
// max_completion_tokens), service tiers, built-in tools, an embedding
// model; tiers for synchronous and queued work, batches on the provider's
// Batch API, and responses made elsewhere.
const boundPolicy = `
providers:
  - {name: sim, base_url: "{{SIM}}", api_key_env: SIM_API_KEY, timeout: 20s}
models:
  - name: gpt-4o
    provider: sim
    context_window: 20000
    max_output_tokens: 300
    max_tool_calls: 3
    limits: {rpm: 100000, tpm: 100000000}
    price:
      input_per_mtok: 2.5
      output_per_mtok: 10
      cached_input_per_mtok: 1.25
      service_tier_prices:
        priority: {input_per_mtok: 4.25, output_per_mtok: 17}
        flex: {input_per_mtok: 1.25, output_per_mtok: 5}
      tool_prices:
        web_search: {per_call_usd: 0.01, result_tokens: 1000}
        file_search: {per_call_usd: 0.0025, result_tokens: 1000}
        code_interpreter: {per_call_usd: 0.03, result_tokens: 1000}
        image_generation: {per_call_usd: 0.04, result_tokens: 1000}
  - name: o3-mini
    provider: sim
    context_window: 20000
    max_output_tokens: 200
    limits: {rpm: 100000, tpm: 100000000}
    price: {input_per_mtok: 1.1, output_per_mtok: 4.4}
  - name: text-embedding-3-small
    provider: sim
    limits: {rpm: 100000, tpm: 100000000}
    price: {input_per_mtok: 0.02}
tiers:
  - {name: sync, daily_budget_usd: 1000, api_rps: 100000}
  - {name: bulk, daily_budget_usd: 1000, api_rps: 100000, batch_offload: auto}
  - {name: open, daily_budget_usd: 1000, api_rps: 100000, allow_foreign_responses: true}
`

// worstSim is a provider doing the worst its documentation allows: every
// choice produces its whole output limit, or, when the request states
// none, a default of 16,000 tokens; every built-in tool call it may make,
// each result read again by every later turn; names read as written.
func worstSim() *sim.Config {
	return &sim.Config{WorstCase: true, DefaultMaxTokens: 16000, ToolResultTokens: 1000, Seed: 46,
		Limits: sim.Limits{RPM: 100000, TPM: 100000000}, Batch: sim.BatchConfig{LinesPerSecond: -1, ValidatingFor: -1, FinalizingFor: -1}}
}

// priced is what the provider billed for one call at the policy's prices:
// its tokens at the tier it served (the Batch API's half price for a batch
// line), each built-in tool call at its price.
func priced(t *testing.T, p *config.Policy, b sim.Bill) money.Micros {
	t.Helper()
	m, ok := p.Model(b.Model)
	if !ok {
		t.Fatalf("a bill of model %q, which the policy does not serve", b.Model)
	}
	price := m.Deployments[0].Price
	if b.Batch {
		price = price.Batch()
	}
	if b.ServiceTier != "" && b.ServiceTier != "default" {
		tier, ok := price.ServiceTiers[b.ServiceTier]
		if !ok {
			t.Fatalf("a bill at tier %q, which the policy does not price", b.ServiceTier)
		}
		price = tier
	}
	cost := price.Cost(money.Tokens{Prompt: b.InputTokens, Cached: b.CachedTokens, Completion: b.OutputTokens})
	for kind, n := range b.ToolCalls {
		cost += money.Micros(n) * m.Deployments[0].Price.Tools[kind].PerCall
	}
	return cost
}

// words is n random words.
func words(rng *rand.Rand, n int) string {
	vocab := []string{"water", "light", "model", "queue", "token", "limit", "budget", "tenant", "answer", "river", "stone", "cloud"}
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocab[rng.IntN(len(vocab))])
	}
	return b.String()
}

// conversations are a tenant's stored responses and their output items,
// which follow-ups name.
type conversations struct {
	responses, items []string
}

func pick(rng *rand.Rand, s []string) string { return s[rng.IntN(len(s))] }

func tierField(rng *rand.Rand, b map[string]any) {
	switch rng.IntN(6) {
	case 1:
		b["service_tier"] = "auto"
	case 2:
		b["service_tier"] = "default"
	case 3:
		b["service_tier"] = "priority"
	case 4:
		b["service_tier"] = "flex"
	}
}

// chatShape is a chat completions body of every variant a client sends:
// an output limit absent or in either member, several choices, parts with
// images and files, tool calls and their results, function tools, a search
// model's web search, a prediction, a service tier.
func chatShape(rng *rand.Rand) map[string]any {
	model := "gpt-4o"
	if rng.IntN(4) == 0 {
		model = "o3-mini"
	}
	var msgs []any
	if rng.IntN(3) == 0 {
		msgs = append(msgs, map[string]any{"role": "system", "content": words(rng, 6)})
	}
	var content any = words(rng, 5+rng.IntN(40))
	if rng.IntN(3) == 0 {
		parts := []any{map[string]any{"type": "text", "text": words(rng, 8)}}
		if rng.IntN(2) == 0 {
			parts = append(parts, map[string]any{"type": "image_url", "image_url": map[string]any{"url": "https://example.com/a.png",
				"detail": []string{"low", "high", "auto"}[rng.IntN(3)]}})
		}
		if rng.IntN(3) == 0 {
			parts = append(parts, map[string]any{"type": "file", "file": map[string]any{"file_id": "file-abc"}})
		}
		content = parts
	}
	msgs = append(msgs, map[string]any{"role": "user", "content": content})
	if rng.IntN(4) == 0 {
		msgs = append(msgs,
			map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": "call_1", "type": "function",
				"function": map[string]any{"name": "lookup", "arguments": `{"q":"` + words(rng, 3) + `"}`}}}},
			map[string]any{"role": "tool", "tool_call_id": "call_1", "content": words(rng, 12)})
	}
	b := map[string]any{"model": model, "messages": msgs}
	switch rng.IntN(4) {
	case 1:
		b["max_tokens"] = 5 + rng.IntN(400)
	case 2:
		b["max_completion_tokens"] = 5 + rng.IntN(400)
	case 3:
		b["max_tokens"], b["max_completion_tokens"] = 5+rng.IntN(400), 5+rng.IntN(400)
	}
	if model == "o3-mini" {
		delete(b, "max_tokens")
	}
	if rng.IntN(5) == 0 {
		b["n"] = 2 + rng.IntN(2)
	}
	if rng.IntN(5) == 0 {
		b["tools"] = []any{map[string]any{"type": "function", "function": map[string]any{"name": "lookup", "description": "Look it up.",
			"parameters": map[string]any{"type": "object", "properties": map[string]any{"q": map[string]any{"type": "string"}}}}}}
	}
	if model == "gpt-4o" {
		if rng.IntN(8) == 0 {
			b["web_search_options"] = map[string]any{}
		}
		if rng.IntN(8) == 0 {
			b["prediction"] = map[string]any{"type": "content", "content": words(rng, 10)}
		}
		tierField(rng, b)
	}
	return b
}

// responsesShape is a Responses API body of every variant: input as text
// or items with images and files, instructions, an output limit or none,
// function and built-in tools with max_tool_calls or without, a service
// tier, a follow-up of the tenant's stored response or items, store off.
func responsesShape(rng *rand.Rand, conv *conversations, stored bool) map[string]any {
	b := map[string]any{"model": "gpt-4o"}
	if rng.IntN(2) == 0 {
		b["input"] = words(rng, 5+rng.IntN(40))
	} else {
		parts := []any{map[string]any{"type": "input_text", "text": words(rng, 10)}}
		if rng.IntN(2) == 0 {
			parts = append(parts, map[string]any{"type": "input_image", "image_url": "https://example.com/b.png", "detail": "high"})
		}
		if rng.IntN(4) == 0 {
			parts = append(parts, map[string]any{"type": "input_file", "file_id": "file-xyz"})
		}
		items := []any{map[string]any{"role": "user", "content": parts}}
		if conv != nil && len(conv.items) > 0 && stored && rng.IntN(4) == 0 {
			items = append([]any{map[string]any{"type": "item_reference", "id": pick(rng, conv.items)}}, items...)
		}
		b["input"] = items
	}
	if rng.IntN(3) == 0 {
		b["instructions"] = words(rng, 8)
	}
	if rng.IntN(2) == 0 {
		b["max_output_tokens"] = 16 + rng.IntN(400)
	}
	switch rng.IntN(5) {
	case 1:
		b["tools"] = []any{map[string]any{"type": "function", "name": "lookup", "parameters": map[string]any{"type": "object", "properties": map[string]any{}}}}
	case 2, 3:
		all := []any{map[string]any{"type": "web_search_preview"}, map[string]any{"type": "file_search", "vector_store_ids": []string{"vs_1"}},
			map[string]any{"type": "code_interpreter", "container": map[string]any{"type": "auto"}}, map[string]any{"type": "image_generation"}}
		rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
		b["tools"] = all[:1+rng.IntN(len(all))]
		if rng.IntN(2) == 0 {
			b["max_tool_calls"] = 1 + rng.IntN(3)
		}
	}
	tierField(rng, b)
	if conv != nil && len(conv.responses) > 0 && stored && rng.IntN(4) == 0 {
		b["previous_response_id"] = pick(rng, conv.responses)
	}
	if rng.IntN(8) == 0 {
		b["store"] = false
	}
	return b
}

func embeddingsShape(rng *rand.Rand) map[string]any {
	if rng.IntN(2) == 0 {
		return map[string]any{"model": "text-embedding-3-small", "input": words(rng, 5+rng.IntN(30))}
	}
	return map[string]any{"model": "text-embedding-3-small", "input": []string{words(rng, 5), words(rng, 9), words(rng, 3)}}
}

// storedIDs are the ids a stored response's body offers a follow-up.
func storedIDs(t *testing.T, body []byte) (string, []string) {
	t.Helper()
	var r struct {
		ID     string `json:"id"`
		Output []struct {
			ID string `json:"id"`
		} `json:"output"`
	}
	if err := json.Unmarshal(body, &r); err != nil || r.ID == "" {
		t.Fatalf("not a response: %s", body)
	}
	var items []string
	for _, it := range r.Output {
		if it.ID != "" {
			items = append(items, it.ID)
		}
	}
	return r.ID, items
}

// lines is a batch input file of bodies to endpoint.
func lines(endpoint string, bodies []map[string]any) *bytes.Buffer {
	var in bytes.Buffer
	for i, body := range bodies {
		line, _ := json.Marshal(map[string]any{"custom_id": fmt.Sprintf("l%04d", i), "method": "POST", "url": endpoint, "body": body})
		in.Write(line)
		in.WriteByte('\n')
	}
	return &in
}

// TestReservationBoundsTheBill is the invariant, by property over request
// shapes: against a provider that bills the most its documentation allows,
// for every call llmq sends, the provider's bill is at most what llmq
// reserved for it, and each job is charged exactly what the provider
// billed, to the micro-dollar. The shapes: chat completions, the
// Responses API and embeddings, each with its variants (chatShape,
// responsesShape), sent synchronously (whole and streamed, a background
// response), as jobs, as lines of batches run by llmq and of batches
// offloaded to the provider's Batch API; follow-ups of the tenant's own
// stored responses and items, and of responses made elsewhere where a tier
// allows them. Requests llmq cannot take this way are refused before any
// call: members named as others but for case, another tenant's
// conversation.
func TestReservationBoundsTheBill(t *testing.T) {
	t.Parallel()
	a := apptest.Start(t, apptest.Options{RedisDB: redisDB, Policy: boundPolicy, Sim: worstSim(), Workers: 2,
		Offload: offload.Options{PollMin: 50 * time.Millisecond, PollMax: 200 * time.Millisecond, RetryAfter: time.Second}})
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(46, 2026))
	_, keyA := a.Tenant("sync")
	_, keyB := a.Tenant("sync")
	_, keyBulk := a.Tenant("bulk")
	_, keyOpen := a.Tenant("open")

	// Tenant A's stored responses, some with built-in tools, to follow up.
	convA := &conversations{}
	var seeds []string
	for i := range 6 {
		body := responsesShape(rng, nil, true)
		delete(body, "store")
		if i%2 == 0 {
			body["tools"] = []any{map[string]any{"type": "web_search"}}
			body["max_tool_calls"] = 1
		}
		r := a.Do("POST", "/v1/responses", keyA, body)
		if r.Status != 200 {
			t.Fatalf("stored response %d: %d %s", i, r.Status, r.Body)
		}
		id, items := storedIDs(t, r.Body)
		seeds = append(seeds, r.Header.Get("X-Llmq-Job-Id"))
		convA.responses = append(convA.responses, id)
		convA.items = append(convA.items, items...)
	}

	// Refused before any call: case variants, at any depth, and another
	// tenant's conversation.
	billsBefore := len(a.Sim.Bills())
	variants := []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"gpt-4o","MAX_TOKENS":16,"messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/chat/completions", `{"model":"gpt-4o","max_tokens":2000,"Max_Tokens":16,"messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/chat/completions", `{"model":"gpt-4o","max_tokens":16,"messages":[{"role":"user","Content":"` + words(rng, 500) + `","content":"hi"}]}`},
		{"/v1/chat/completions", `{"model":"gpt-4o","max_tokens":16,"messages":[{"role":"user","content":[{"type":"text","TEXT":"x","text":"hi"}]}]}`},
		{"/v1/chat/completions", `{"model":"gpt-4o","max_tokens":16,"Service_tier":"priority","messages":[{"role":"user","content":"hi"}]}`},
		{"/v1/responses", `{"model":"gpt-4o","input":"hi","Max_Output_Tokens":16}`},
		{"/v1/responses", `{"model":"gpt-4o","input":[{"role":"user","content":"hi","CONTENT":"` + words(rng, 300) + `"}]}`},
		{"/v1/embeddings", `{"model":"text-embedding-3-small","input":"x","INPUT":"` + words(rng, 300) + `"}`},
	}
	for _, v := range variants {
		for _, key := range []string{keyA, keyBulk} {
			if r := a.Do("POST", v.path, key, v.body); r.Status != 400 {
				t.Fatalf("%s %s: %d %s, want 400", v.path, v.body, r.Status, r.Body)
			}
			job := `{"endpoint":"` + v.path + `","body":` + v.body + `}`
			if r := a.Do("POST", "/v1/jobs", key, job); r.Status != 400 {
				t.Fatalf("job %s: %d %s, want 400", v.body, r.Status, r.Body)
			}
		}
	}
	for _, id := range append(slices.Clone(convA.responses[:2]), convA.items[:2]...) {
		for _, body := range []map[string]any{
			{"model": "gpt-4o", "input": "go on", "previous_response_id": id},
			{"model": "gpt-4o", "input": []any{map[string]any{"type": "item_reference", "id": id}, map[string]any{"role": "user", "content": "go on"}}},
		} {
			for _, key := range []string{keyB, keyOpen} {
				if r := a.Do("POST", "/v1/responses", key, body); r.Status != 404 {
					t.Fatalf("another tenant's %s: %d %s, want 404", id, r.Status, r.Body)
				}
			}
		}
	}
	if n := len(a.Sim.Bills()); n != billsBefore {
		t.Fatalf("%d calls reached the provider for requests llmq refused", n-billsBefore)
	}

	// The shapes, in every mode.
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		jobs = seeds
	)
	record := func(id string) {
		mu.Lock()
		jobs = append(jobs, id)
		mu.Unlock()
	}
	send := func(path, key string, body map[string]any, header http.Header) {
		defer wg.Done()
		r := apptest.Do(t, a.URL, "POST", path, key, body, header)
		if r.Status >= 500 || r.Status == 400 || r.Status == 404 {
			t.Errorf("%s %v: %d %s", path, body, r.Status, r.Body)
			return
		}
		if id := r.Header.Get("X-Llmq-Job-Id"); id != "" {
			record(id)
		} else if path == "/v1/jobs" && r.Status == 202 {
			record(r.Map(t)["id"].(string))
		}
	}
	syncBodies, jobBodies := 0, 0
	for range 40 {
		var path string
		var body map[string]any
		switch rng.IntN(5) {
		case 0, 1:
			path, body = "/v1/chat/completions", chatShape(rng)
		case 2, 3:
			path, body = "/v1/responses", responsesShape(rng, convA, true)
		default:
			path, body = "/v1/embeddings", embeddingsShape(rng)
		}
		wg.Add(1)
		switch {
		case path != "/v1/embeddings" && rng.IntN(3) == 0:
			body["stream"] = true
			if path == "/v1/chat/completions" && rng.IntN(2) == 0 {
				body["stream_options"] = map[string]any{"include_usage": true}
			}
		case path == "/v1/responses" && rng.IntN(4) == 0:
			body["background"] = true
		}
		syncBodies++
		go send(path, keyA, body, nil)
	}
	for range 40 {
		endpoint := []string{llm.EndpointChat, llm.EndpointResponses, llm.EndpointEmbeddings}[rng.IntN(3)]
		var body map[string]any
		switch endpoint {
		case llm.EndpointChat:
			body = chatShape(rng)
		case llm.EndpointResponses:
			body = responsesShape(rng, convA, true)
		default:
			body = embeddingsShape(rng)
		}
		wg.Add(1)
		jobBodies++
		go send("/v1/jobs", keyA, map[string]any{"endpoint": endpoint, "body": body}, nil)
	}
	// Responses made elsewhere, where the tier allows them: reserved as
	// the context window; the provider refuses these (it never made them),
	// billing nothing.
	for i := range 3 {
		r := a.Do("POST", "/v1/responses", keyOpen, map[string]any{"model": "gpt-4o", "input": "go on", "previous_response_id": fmt.Sprintf("resp_elsewhere_%d", i)})
		if r.Status != 400 || !strings.Contains(string(r.Body), "previous_response_not_found") {
			t.Fatalf("a foreign follow-up: %d %s, want the provider's 400", r.Status, r.Body)
		}
		record(r.Header.Get("X-Llmq-Job-Id"))
	}
	// Batches: run by llmq (tenant A's tier never offloads) and offloaded
	// (the bulk tier's plain lines; its other lines run on llmq's path).
	var batchIDs []string
	for _, b := range []struct {
		key, endpoint string
		n             int
	}{
		{keyA, llm.EndpointChat, 15}, {keyA, llm.EndpointResponses, 15},
		{keyBulk, llm.EndpointChat, 25}, {keyBulk, llm.EndpointResponses, 25}, {keyBulk, llm.EndpointEmbeddings, 10},
	} {
		bodies := make([]map[string]any, b.n)
		for i := range bodies {
			switch b.endpoint {
			case llm.EndpointChat:
				bodies[i] = chatShape(rng)
			case llm.EndpointResponses:
				var conv *conversations
				if b.key == keyA {
					conv = convA
				}
				bodies[i] = responsesShape(rng, conv, true)
			default:
				bodies[i] = embeddingsShape(rng)
			}
		}
		tenant := a.Do("GET", "/v1/usage", b.key, nil).Map(t)["tenant"].(string)
		f, err := a.Store.FileInsert(ctx, &store.FileInsertParams{TenantID: tenant, Purpose: store.FilePurposeBatch, Filename: "in.jsonl",
			Content: lines(b.endpoint, bodies)})
		if err != nil {
			t.Fatal(err)
		}
		r := a.Do("POST", "/v1/batches", b.key, map[string]any{"input_file_id": f.ID, "endpoint": b.endpoint, "completion_window": "24h"})
		if r.Status != 200 {
			t.Fatalf("create batch: %d %s", r.Status, r.Body)
		}
		batchIDs = append(batchIDs, r.Map(t)["id"].(string))
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for _, id := range batchIDs {
		eventually(t, 2*time.Minute, func() bool {
			_ = a.Offload.Sweep(ctx)
			_ = a.Batches.Sweep(ctx)
			b, err := a.Store.BatchGetByID(ctx, id)
			return err == nil && b.Status == store.BatchCompleted
		}, "batch %s completed", id)
		if err := a.Store.JobStreamByBatch(ctx, id, nil, func(j *store.Job) error { record(j.ID); return nil }); err != nil {
			t.Fatal(err)
		}
	}

	// Every call: its bill within the reservation, and charged exactly.
	p := a.Policy.Current()
	byRequest := map[string]sim.Bill{}
	for _, b := range a.Sim.Bills() {
		if _, dup := byRequest[b.RequestID]; dup {
			t.Fatalf("two bills of request %s", b.RequestID)
		}
		byRequest[b.RequestID] = b
	}
	var charged, batched, unbounded, tooled, tiered, streamed int
	var reserved, billed money.Micros
	for _, id := range jobs {
		j := a.EndedJob(id)
		if _, err := a.Store.UsageGetByJob(ctx, id); errors.Is(err, store.ErrNotFound) {
			// Refused by the provider (a response made elsewhere): no
			// bill, no charge (a bill left over is reported below).
			if j.Status != store.JobFailed || j.Error == nil || !bytes.Contains(j.Request, []byte("resp_elsewhere")) {
				t.Fatalf("job %s (%s) %s, not charged: %+v", id, j.Endpoint, j.Status, j.Error)
			}
			continue
		}
		b, ok := byRequest[j.ProviderRequestID]
		if !ok {
			t.Fatalf("job %s (%s, %s) was charged $%s for request %q the provider never billed", id, j.Endpoint, j.Status, j.Cost, j.ProviderRequestID)
		}
		delete(byRequest, j.ProviderRequestID)
		bill := priced(t, p, b)
		if bill > j.EstCost {
			t.Errorf("job %s (%s%s): the provider billed $%s (%d in, %d out, tier %q, tools %v), more than the $%s reserved\n%s",
				id, j.Endpoint, map[bool]string{true: ", batch"}[b.Batch], bill, b.InputTokens, b.OutputTokens, b.ServiceTier, b.ToolCalls, j.EstCost, j.Request)
		}
		if j.Cost != bill || j.UsageEstimated || j.Status != store.JobSucceeded {
			t.Errorf("job %s (%s): %s, charged $%s (estimated %v), the provider billed $%s\n%s", id, j.Endpoint, j.Status, j.Cost, j.UsageEstimated, bill, j.Request)
		}
		e, err := a.Store.UsageGetByJob(ctx, id)
		if err != nil || e.Cost != j.Cost {
			t.Errorf("job %s: ledger %+v, %v", id, e, err)
		}
		charged++
		reserved += j.EstCost
		billed += bill
		if b.Batch {
			batched++
		}
		if b.Stream {
			streamed++
		}
		if len(b.ToolCalls) > 0 {
			tooled++
		}
		if b.ServiceTier != "default" && b.ServiceTier != "" {
			tiered++
		}
		if bytes.Contains(j.Request, []byte("file")) || bytes.Contains(j.Request, []byte("previous_response_id")) {
			unbounded++
		}
	}
	for req, b := range byRequest {
		t.Errorf("the provider billed request %s (%s, batch %v) that no job was charged for", req, b.Endpoint, b.Batch)
	}
	t.Logf("%d calls charged exactly what the provider billed ($%s of $%s reserved): %d on the Batch API, %d streamed, %d with built-in tool calls, %d at a service tier, %d with files or follow-ups; %d sent, %d as jobs",
		charged, billed, reserved, batched, streamed, tooled, tiered, unbounded, syncBodies, jobBodies)
	if batched == 0 || streamed == 0 || tooled == 0 || tiered == 0 || unbounded == 0 {
		t.Fatal("the shapes did not cover every mode")
	}
}
